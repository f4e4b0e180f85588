"""What a running task may ask about its own job: has cancellation been requested?

Task code calls `zktasks.cancel_requested()` at convenient points and stops (returns, or
raises `zktasks.JobCancelled`) when it says True. The executor sets the state: in a task
process, per process, through a flag shared with the worker (a signal could arrive before the
process is ready, or between jobs); in the thread pool, per thread. A worker whose session
expired asks its runs to stop the same way (their jobs are handed back and run again).

The job a thread runs is held in context variables, not a threading.local: an async task
runs in asgiref's event-loop thread, and async_to_sync carries context variables there
(a threading.local would leave it with no job, and cancel_requested() always False).
"""

import threading
from contextvars import ContextVar

_job_id: ContextVar[str | None] = ContextVar("zktasks_job_id", default=None)
_abandoned: ContextVar[threading.Event | None] = ContextVar("zktasks_abandoned", default=None)
_cancelled_jobs: set[str] = set()   # thread pool: job ids asked to stop, in this process
_lock = threading.Lock()
# Task process: flags shared with the worker. Entry `n % len(flags)` holds n when run n is
# to stop (a batch's runs are consecutive numbers, fewer than the entries: one each).
_shared_flags = None
_current_run = 0


def bind_shared_flags(flags) -> None:
    global _shared_flags
    _shared_flags = flags


def run_cancelled(number: int) -> bool:
    """Whether the worker asked run `number` of this task process to stop."""
    return _shared_flags is not None and _shared_flags[number % len(_shared_flags)] == number


def set_current_run(number: int) -> None:
    global _current_run
    _current_run = number


def begin(job_id: str) -> None:
    _job_id.set(job_id)


def bind_abandon_flag(flag: threading.Event | None) -> None:
    """Thread pool: the run in this thread stops being wanted once `flag` is set (its
    worker's session was lost). Per run and per worker, never per job id: the same job
    may run again in this process, under the worker's new identity."""
    _abandoned.set(flag)


def end() -> None:
    # A cancel is not dropped here but when the worker lets go of the job (forget_cancel):
    # after a lost session the same job may have a second run in this process, under
    # the worker's new identity, and the first one ending must not take its cancel.
    _job_id.set(None)


def current_job_id() -> str | None:
    return _job_id.get()


def request_cancel(job_id: str) -> None:
    with _lock:
        _cancelled_jobs.add(job_id)


def forget_cancel(job_id: str) -> None:
    with _lock:
        _cancelled_jobs.discard(job_id)


def cancel_requested() -> bool:
    """Return True if someone asked the job running in this thread to stop."""
    job_id = current_job_id()
    if job_id is None:
        return False
    if run_cancelled(_current_run):
        return True
    flag = _abandoned.get()
    if flag is not None and flag.is_set():
        return True
    with _lock:
        return job_id in _cancelled_jobs
