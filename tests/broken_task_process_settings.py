"""tests.settings, except that importing it in a task process fails: a worker whose task
processes cannot set up Django (test_task_process_batches.py, test_runworker.py)."""

import multiprocessing

from tests.settings import *  # noqa: F403

if multiprocessing.parent_process() is not None:
    raise ImportError("tests.broken_task_process_settings cannot be imported in a task "
                      "process (on purpose)")
