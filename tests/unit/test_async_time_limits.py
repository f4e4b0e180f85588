"""An async task's time limit, with real task processes (no ZooKeeper involved).

Its coroutine runs in asgiref's event-loop thread, where the SIGALRM a sync task gets
cannot reach it: the soft limit cancels the coroutine at its await instead, before the
outcome is reported, so it cannot run on after its job was recorded as failed."""

import secrets

import pytest

from tests import tasks
from zktasks import serialization
from zktasks.executor import Execution, ThreadRunner

TIMEOUT = "zktasks.exceptions.TaskTimeout"


def execution(task, *args) -> Execution:
    blob = serialization.dump_call(task.func, args, {}, task_path=task.module_path)
    return Execution(job_id=secrets.token_hex(8), blob=blob, record_json=b"{}",
                     timeout=task.timeout)


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_an_async_task_past_its_soft_limit_is_cancelled_before_its_outcome(
        pool, process_runner, tmp_path):
    runner = process_runner if pool == "process" else ThreadRunner()
    outcome = runner.run(execution(tasks.async_past_its_limit, str(tmp_path), 30))
    assert not outcome.ok and outcome.error.exception_class_path == TIMEOUT
    assert "coroutine was cancelled" in outcome.error.message
    # The coroutine saw CancelledError at its await before the outcome was reported, so
    # it is not still running while the job counts as failed (it used to run on).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleaned-up"]
    # The same task process goes on with the next job.
    assert serialization.loads(runner.run(execution(tasks.add, 2, 3)).value_blob) == 5


def test_an_async_task_that_blocks_its_loop_is_killed_at_the_hard_limit(process_runner):
    outcome = process_runner.run(execution(tasks.async_blocks_its_loop, 30))
    assert not outcome.ok and outcome.error.exception_class_path == TIMEOUT
    assert "task process was killed" in outcome.error.message
    assert serialization.loads(process_runner.run(execution(tasks.add, 2, 3)).value_blob) == 5


def test_the_thread_pool_says_once_that_a_sync_task_runs_without_its_limit(caplog, tmp_path):
    runner = ThreadRunner()
    with caplog.at_level("WARNING", logger="zktasks.executor"):
        for _ in range(2):
            outcome = runner.run(execution(tasks.short_sleep_limited, 0))
            assert outcome.ok
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "tests.tasks.short_sleep_limited has a 5s time limit" in warnings[0]
    assert "--pool process" in warnings[0]
