"""The two workloads, shared by every system: their bodies only, no framework.

Both return when they finished and which process ran them (and that process's parent),
so that a peer's result says when the job ended and on which worker: bench/run.py starts
its drain span once every worker process has finished a job. A Celery prefork child, a
Dramatiq worker process or an RQ work horse is a child of the worker command the bench
started; Huey's and db_worker's threads run in it. zktasks' status record has its own
finished_at and worker id.
"""

import os
import time


def stamp() -> dict:
    """When the job finished, and the ids of the process that ran it and of its parent."""
    return {"at": time.time(), "pid": os.getpid(), "ppid": os.getppid()}


def noop() -> dict:
    return stamp()


def sleep10() -> dict:
    time.sleep(0.010)
    return stamp()
