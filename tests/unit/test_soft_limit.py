"""The soft time limit of a sync task in a task process (SIGALRM), without a process."""

import secrets

from tests import tasks
from zktasks import executor, serialization
from zktasks.executor import Execution


def test_a_soft_limit_that_went_off_while_the_arguments_loaded_is_kept():
    """The alarm went off while the arguments were loaded (the handler raises only in
    the task): it was lost, and the hard limit later killed the task process with no
    chance to clean up. The task now begins with the TaskTimeout."""
    blob = serialization.dump_call(tasks.add.func, (1, 2), {}, task_path="tests.tasks.add")
    run = Execution(job_id=secrets.token_hex(8), blob=blob, record_json=b"{}", timeout=1)
    executor._on_soft_timeout(14, None)  # SIGALRM, outside a task: noted
    try:
        outcome = executor.execute(run)
    finally:
        executor._in_task.alarmed = False
    assert not outcome.ok
    assert outcome.error.exception_class_path == "zktasks.exceptions.TaskTimeout"
    assert "before it began" in outcome.error.message
    assert executor.execute(run).ok  # the next run starts afresh (_child_main resets it)
