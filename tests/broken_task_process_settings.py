"""tests.settings, except that importing it in a task process fails: a worker whose task
processes cannot set up Django (test_task_process_batches.py, test_runworker.py).

A task process is spawned by the worker (a multiprocessing parent) or forked from the
fork server, a `python -c` interpreter that set Django up first (zktasks/forkserver.py):
both refuse, the worker and the test process import it."""

import multiprocessing
import sys

from tests.settings import *  # noqa: F403

if multiprocessing.parent_process() is not None or sys.argv[:1] == ["-c"]:
    raise ImportError("tests.broken_task_process_settings cannot be imported in a task "
                      "process (on purpose)")
