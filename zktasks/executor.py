"""Run one job's code, in a task process (default) or a thread, and report its outcome.

Task processes are spawned, not forked: a KazooClient is not fork-safe, and the task code
must never touch the worker's session. A task process that exits (os._exit, a segfault,
the OOM killer) or runs past its time limit costs that one job: the slot starts a fresh
process and the worker goes on.
"""

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import threading
from dataclasses import dataclass, fields
from inspect import iscoroutinefunction

from .exceptions import JobCancelled, TaskProcessDied, TaskTimeout
from .records import ErrorRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """What a task process needs to run a job: verified bytes and the job's record."""

    job_id: str
    blob: bytes            # verified dill bytes of (function, args, kwargs)
    record_json: bytes     # the RUNNING status record (for the task's context)
    timeout: float | None
    attempt: int = 1       # the attempt this run is (for the retry policy)
    takes_context: bool = False

    def __reduce__(self):
        return _rebuild, (Execution, tuple(getattr(self, n) for n in _FIELDS[Execution]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    ok: bool
    value_blob: bytes | None = None
    error: ErrorRecord | None = None
    retry_delay: float | None = None  # seconds before another attempt; None: no retry

    def __reduce__(self):
        return _rebuild, (Outcome, tuple(getattr(self, n) for n in _FIELDS[Outcome]))


# Both cross the pipe to and from the task process on every job. A frozen dataclass with
# slots pickles through dataclasses' __getstate__/__setstate__, which call fields() each
# time (a tenth of a task process's CPU per no-op job); a plain tuple of values does not.
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (Execution, Outcome)}


def _rebuild(cls, values):
    return cls(**dict(zip(_FIELDS[cls], values, strict=True)))


def execute(execution: Execution) -> Outcome:
    """Load and call the job's function; never raises."""
    from . import context, serialization
    from .records import StatusRecord

    call = None
    context.begin(execution.job_id)
    try:
        call = serialization.load_call(execution.blob)
        args = call.args
        if execution.takes_context:
            # Only then is the record decoded here: most tasks never need it.
            record = StatusRecord.from_bytes(execution.record_json)
            args = (_context(record, call.func, call.args, call.kwargs), *args)
        _in_task.active = True
        try:
            if iscoroutinefunction(call.func):
                from asgiref.sync import async_to_sync

                value = async_to_sync(call.func)(*args, **call.kwargs)
            else:
                value = call.func(*args, **call.kwargs)
        finally:
            _in_task.active = False
        return Outcome(ok=True, value_blob=serialization.dump_value(value))
    except BaseException as exc:  # a task's SystemExit is its failure, not ours
        delay = None
        if call is not None:
            delay = retry_delay(call.policy, execution.attempt, exc)
        return Outcome(ok=False, error=ErrorRecord.from_exception(exc), retry_delay=delay)
    finally:
        context.end()
        try:
            from django.db import close_old_connections

            close_old_connections()
        except Exception:
            logger.debug("closing database connections failed", exc_info=True)


class _InTask(threading.local):
    active = False


_in_task = _InTask()


def retry_delay(policy, attempt: int, exc: BaseException) -> float | None:
    """Ask the task's retry policy; a broken backoff callable means no retry."""
    from .exceptions import JobCancelled

    if isinstance(exc, JobCancelled):
        return None  # cancelled means stop, not try again
    try:
        return policy.delay(attempt, exc)
    except Exception:
        logger.exception("backoff callable failed; not retrying attempt=%d", attempt)
        return None


def _context(record, func, args, kwargs):
    from django.tasks import TaskContext, task_backends

    backend = task_backends[record.backend]
    task = backend._task_for(record, func)
    result = backend.build_result(record, task=task, args=list(args), kwargs=dict(kwargs))
    return TaskContext(task_result=result)


# -- thread pool ------------------------------------------------------------------------


class ThreadRunner:
    """Run jobs in the calling thread: for I/O-bound work. No hard time limit."""

    name = "thread"

    def start(self) -> None:
        pass

    def run(self, execution: Execution) -> Outcome:
        return execute(execution)

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        from . import context

        # A thread cannot be killed: the task sees the request through cancel_requested().
        context.request_cancel(job_id)
        if force:
            logger.warning("force-cancel needs --pool process; job=%s was only asked to "
                           "stop", job_id)

    def stop(self, *, force: bool = False) -> None:
        pass


# -- process pool -----------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux: the kernel kills this process when the thread that spawned it exits, so a
    # SIGKILLed worker leaves no task process running side effects on its own.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _child_main(conn, parent_pid: int, cancel_flag) -> None:
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    # Ctrl-C reaches the whole process group; the worker decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_soft_timeout)
    from . import context

    context.bind_shared_flag(cancel_flag)
    import django

    django.setup()
    while True:
        try:
            number, execution = conn.recv()
        except EOFError:
            return
        context.set_current_run(number)
        if execution.timeout:
            signal.setitimer(signal.ITIMER_REAL, execution.timeout)
        try:
            outcome = execute(execution)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        conn.send(outcome)


def _on_soft_timeout(signum, frame):
    # The soft limit: raise inside the task so it can clean up; the worker kills the
    # process if it has not stopped within the grace period after.
    if _in_task.active:
        raise TaskTimeout("The task ran past its time limit (soft limit: cleaning up).")


class _Slot:
    def __init__(self, ctx, index: int):
        self.ctx = ctx
        self.index = index
        self.process = None
        self.conn = None
        self._close_lock = threading.Lock()
        self.job_id: str | None = None
        self.cancelled = False
        self.runs = 0
        self.cancel_flag = ctx.Value("q", 0, lock=False)  # number of the run to stop

    def ensure(self) -> None:
        if self.process is not None and self.process.is_alive():
            return
        self.close()
        parent, child = self.ctx.Pipe()
        self.process = self.ctx.Process(
            target=_child_main, args=(child, os.getpid(), self.cancel_flag),
            name=f"zktasks-task-{self.index}",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.conn = parent

    def run(self, execution: Execution) -> Outcome:
        self.ensure()
        hard_limit = None
        if execution.timeout:
            hard_limit = execution.timeout + max(1.0, execution.timeout * 0.1)
        conn = self.conn  # a forced stop may clear the attribute from another thread
        try:
            if conn is None:
                raise EOFError("the task process was stopped")
            conn.send((self.runs, execution))
            if not conn.poll(hard_limit):
                self.kill()
                return _failure(TaskTimeout(
                    f"Job {execution.job_id!r} ran past its {execution.timeout:g}s time "
                    "limit and did not stop at the soft limit; its task process was killed."
                ))
            return conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            code = self._reap()
            if self.cancelled:
                return _failure(JobCancelled(
                    f"Job {execution.job_id!r} was cancelled with force=True; its task "
                    "process was terminated."
                ))
            return _failure(TaskProcessDied(
                f"The task process running job {execution.job_id!r} exited with "
                f"{_describe_exit(code)} before reporting an outcome."
            ))
        finally:
            self.job_id = None

    def cancel(self, *, force: bool) -> None:
        process = self.process
        if process is None or not process.is_alive():
            return
        if force:
            self.cancelled = True
            process.kill()
        else:
            self.cancel_flag.value = self.runs

    def _reap(self):
        # The runner thread (after EOF) and a forced stop (from the main thread) may both
        # reap: work on a local reference, never on the attribute the other one clears.
        process = self.process
        if process is None:
            return None
        process.join(5)
        code = process.exitcode
        self.close()
        return code

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        self._reap()

    def close(self) -> None:
        # Called from the runner thread (after EOF) and from a forced stop on the main
        # thread at once: take the connection under a lock, so only one closes it
        # (a second close raised EBADF and crashed the worker's exit).
        with self._close_lock:
            conn, self.conn = self.conn, None
            self.process = None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass


def _describe_exit(code) -> str:
    if code is None:
        return "an unknown status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _failure(exc: BaseException) -> Outcome:
    return Outcome(ok=False, error=ErrorRecord.from_exception(exc))


class ProcessRunner:
    """A fixed set of task processes; each job borrows one for its whole run."""

    name = "process"

    def __init__(self, size: int):
        self.ctx = multiprocessing.get_context("spawn")
        self.slots = [_Slot(self.ctx, i) for i in range(size)]
        self.free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._early_cancels: dict[str, bool] = {}

    def start(self) -> None:
        for slot in self.slots:
            slot.ensure()
            self.free.put(slot)

    def run(self, execution: Execution) -> Outcome:
        slot = self.free.get()
        try:
            with self._lock:
                force = self._early_cancels.pop(execution.job_id, None)
                # Under the lock, so a cancel lands either here (early) or on this run.
                slot.job_id, slot.cancelled = execution.job_id, False
                slot.runs += 1
            if force is not None:
                return _failure(JobCancelled(
                    f"Job {execution.job_id!r} was cancelled before its task started."))
            return slot.run(execution)
        finally:
            self.free.put(slot)

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        with self._lock:
            for slot in self.slots:
                if slot.job_id == job_id:
                    slot.cancel(force=force)
                    return
            # Not on a slot yet (between "started" and the hand-over): apply on arrival.
            self._early_cancels[job_id] = force

    def stop(self, *, force: bool = False) -> None:
        for slot in self.slots:
            if force:
                slot.kill()
            elif slot.conn is not None:
                slot.conn.close()  # the child sees EOF and exits
        for slot in self.slots:
            if slot.process is not None:
                slot.process.join(5)
                if slot.process.is_alive():
                    slot.process.kill()
            slot.close()


def make_runner(pool: str, concurrency: int):
    if pool == "thread":
        return ThreadRunner()
    if pool == "process":
        return ProcessRunner(concurrency)
    raise ValueError(f"Unknown pool {pool!r}; use 'process' or 'thread'.")
