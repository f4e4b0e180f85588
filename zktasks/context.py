"""What a running task may ask about its own job: has cancellation been requested?

Task code calls `zktasks.cancel_requested()` at convenient points and stops (returns, or
raises `zktasks.JobCancelled`) when it says True. The executor sets the state: in a task
process, per process, through a flag shared with the worker (a signal could arrive before the
process is ready, or between jobs); in the thread pool, per thread.
"""

import threading

_local = threading.local()
_cancelled_jobs: set[str] = set()   # thread pool: job ids asked to stop, in this process
_lock = threading.Lock()
# Task process: a flag shared with the worker, holding the number of the run to stop.
_shared_flag = None
_current_run = 0


def bind_shared_flag(flag) -> None:
    global _shared_flag
    _shared_flag = flag


def set_current_run(number: int) -> None:
    global _current_run
    _current_run = number


def begin(job_id: str) -> None:
    _local.job_id = job_id


def end() -> None:
    job_id = getattr(_local, "job_id", None)
    _local.job_id = None
    if job_id:
        with _lock:
            _cancelled_jobs.discard(job_id)


def current_job_id() -> str | None:
    return getattr(_local, "job_id", None)


def request_cancel(job_id: str) -> None:
    with _lock:
        _cancelled_jobs.add(job_id)


def cancel_requested() -> bool:
    """Return True if someone asked the job running in this thread to stop."""
    job_id = current_job_id()
    if job_id is None:
        return False
    if _shared_flag is not None and _shared_flag.value == _current_run:
        return True
    with _lock:
        return job_id in _cancelled_jobs
