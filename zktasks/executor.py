"""Run one job's code, in a task process (default) or a thread, and report its outcome.

Task processes are never forks of the worker: a KazooClient is not fork-safe, and the task
code must never touch the worker's session. They are forks of a fork server, a fresh
interpreter that set Django up once (zktasks/forkserver.py), or, where there is no fork
server, spawned interpreters that each set it up. A task process that exits (os._exit, a
segfault, the OOM killer) or runs past its time limit costs that one job: the slot starts
a fresh process and the worker goes on.
"""

import asyncio
import ctypes
import gc
import json
import logging
import math
import multiprocessing
import os
import pickle
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from inspect import iscoroutinefunction
from multiprocessing import connection as mp_connection

from .exceptions import JobCancelled, TaskProcessDied, TaskTimeout
from .records import ErrorRecord

logger = logging.getLogger(__name__)

# The most jobs a task process is handed at once (ProcessRunner.run_many), and so the
# entries of its shared cancel flags (context.py): a batch's run numbers are consecutive.
BATCH_MAX = 16
# A job of a batch that has run this long while others wait behind it in its task process
# (a lock wait, a socket read with no timeout, in a task that ran short so far): the
# jobs not started yet are taken back to run on the other task processes
# (ProcessRunner.run_many). 250 times the longest a batched job ran on average.
BATCH_PATIENCE_S = 0.5
DROP_REPORT_WAIT = 30.0  # seconds (ProcessRunner._drop_report)


class _TakenBack:
    """What run_many yields for a job it took back from its batch (on_taken_back)."""

    def __repr__(self):
        return "TAKEN_BACK"


TAKEN_BACK = _TakenBack()


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
    value_repr: str | None = None      # serialization.value_repr (None: plain data)

    def __reduce__(self):
        return _rebuild, (Outcome, tuple(getattr(self, n) for n in _FIELDS[Outcome]))


# Both cross the pipe to and from the task process on every job. A frozen dataclass with
# slots pickles through dataclasses' __getstate__/__setstate__, which call fields() each
# time (a tenth of a task process's CPU per no-op job); a plain tuple of values does not.
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (Execution, Outcome)}


def _rebuild(cls, values):
    return cls(**dict(zip(_FIELDS[cls], values, strict=True)))


def execute(execution: Execution, *, in_thread_pool: bool = False) -> Outcome:
    """Load and call the job's function; never raises."""
    from . import context, serialization
    from .records import StatusRecord

    call = None
    owner = os.getpid()
    context.begin(execution.job_id)
    try:
        call = serialization.load_call(execution.blob)
        args = call.args
        if execution.takes_context:
            # Only then is the record decoded here: most tasks never need it.
            record = StatusRecord.from_bytes(execution.record_json)
            args = (_context(record, call, call.args, call.kwargs), *args)
        if iscoroutinefunction(call.func):
            value = _run_coroutine(_forks_end(call.func, owner), args, call.kwargs,
                                   execution.timeout)
        else:
            if in_thread_pool and execution.timeout:
                _warn_no_limit(call.func, execution.timeout)
            _in_task.active = True
            try:
                if _in_task.alarmed:
                    raise TaskTimeout("The task ran past its time limit before it began "
                                      "(soft limit: loading its arguments took that long).")
                value = call.func(*args, **call.kwargs)
            finally:
                _in_task.active = False
    except BaseException as exc:  # a task's SystemExit is its failure, not ours
        _leave_if_forked(owner, _exit_status(exc))
        delay = None
        if call is not None:
            delay = retry_delay(call.policy, execution.attempt, exc)
        return Outcome(ok=False, error=ErrorRecord.from_exception(exc), retry_delay=delay)
    else:
        _leave_if_forked(owner, 0)
        try:
            return Outcome(ok=True, value_blob=serialization.dump_value(value),
                           value_repr=serialization.value_repr(value))
        except BaseException as exc:
            # The task ran to its end: another attempt would repeat its side effects only
            # to return the same value, so this failure is not retried (like a value too
            # large to record).
            return Outcome(ok=False, error=ErrorRecord.from_exception(exc))
    finally:
        context.end()
        try:
            from django.db import close_old_connections

            close_old_connections()
        except Exception:
            logger.debug("closing database connections failed", exc_info=True)


def _leave_if_forked(owner: int, code: int) -> None:
    """End a process the task forked that returned or raised into zktasks (a child
    ended by sys.exit() or an exception, not os._exit()). Going on, it was a second
    task process on the same pipe: it reported the job in its parent's stead and took
    the next job, so the worker recorded one job's return value as another's. In the
    thread pool it was a copy of the whole worker, stuck in a ZooKeeper call."""
    if os.getpid() != owner:
        try:
            os.write(2, b"zktasks: a process forked by a task went on past the task; it "
                        b"exits here (end a forked child with os._exit()).\n")
        finally:
            os._exit(code)


def _forks_end(func, owner: int):
    """`func` (a coroutine function), with _leave_if_forked after it: it runs in
    asgiref's loop thread, the only thread of a process forked from it, which then
    never came back to execute()'s check and lived on for good, blocked (with the
    thread pool, a copy of the worker holding its ZooKeeper connections)."""

    async def run(*args, **kwargs):
        try:
            value = await func(*args, **kwargs)
        except BaseException as exc:
            _leave_if_forked(owner, _exit_status(exc))
            raise
        _leave_if_forked(owner, 0)
        return value

    return run


def _exit_status(exc: BaseException) -> int:
    """The status a process ending with `exc` exits with, as Python gives it."""
    if isinstance(exc, SystemExit):
        code = exc.code
        return 0 if code is None else code if isinstance(code, int) else 1
    return 1


def _run_coroutine(func, args, kwargs, timeout: float | None):
    """Run an async task in asgiref's event loop, as Django runs them.

    Its soft limit is asyncio.timeout(), not the SIGALRM a sync task gets: the loop runs
    in asgiref's own thread, so the signal could only interrupt this thread's wait, and
    the coroutine would run on, side effects and all, after its job was recorded as
    failed. Cancelled at its await instead, it sees CancelledError and can clean up. One
    that swallows the cancellation or blocks the loop keeps this thread waiting, so the
    hard limit (--pool process) still kills its task process.
    """
    from asgiref.sync import async_to_sync

    if timeout is None:
        return async_to_sync(func)(*args, **kwargs)

    async def within_limit():
        limit = asyncio.timeout(timeout)
        try:
            async with limit:
                return await func(*args, **kwargs)
        except TimeoutError:
            if limit.expired():
                raise TaskTimeout("The task ran past its time limit (soft limit: its "
                                  "coroutine was cancelled).") from None
            raise

    return async_to_sync(within_limit)()


_warned_no_limit: set[str] = set()


def _warn_no_limit(func, timeout: float) -> None:
    # Once per task and process: a thread cannot be interrupted, so the limit is not kept.
    name = f"{func.__module__}.{func.__qualname__}"
    if name not in _warned_no_limit:
        _warned_no_limit.add(name)
        logger.warning("task %s has a %gs time limit, which the thread pool cannot enforce "
                       "for a sync task; it runs without one. Run it with --pool process "
                       "(or make it async def) to keep the limit.", name, timeout)


class _InTask(threading.local):
    active = False
    alarmed = False  # the soft limit went off before the task began (a slow load)


_in_task = _InTask()


def retry_delay(policy, attempt: int, exc: BaseException) -> float | None:
    """Ask the task's retry policy; a broken backoff callable means no retry."""
    from .exceptions import JobCancelled

    if isinstance(exc, JobCancelled):
        return None  # cancelled means stop, not try again
    try:
        return policy.delay(attempt, exc)
    # BaseException: a backoff raising SystemExit or KeyboardInterrupt ended the runner
    # thread that asked (in the worker too, which asks after a task process died).
    except BaseException:
        logger.exception("no retry delay (a backoff callable failed, or a delay was not a "
                         "number); not retrying attempt=%d", attempt)
        return None


def _context(record, call, args, kwargs):
    from django.tasks import TaskContext, task_backends

    backend = task_backends[record.backend]
    task = backend._task_for(record, call.func, call.policy)
    result = backend.build_result(record, task=task, args=list(args), kwargs=dict(kwargs))
    return TaskContext(task_result=result)


# -- thread pool ------------------------------------------------------------------------


class ThreadRunner:
    """Run jobs in the calling thread: for I/O-bound work. Time limits reach async tasks
    only (their soft limit); a sync one runs without, and a warning says so once."""

    name = "thread"

    def __init__(self) -> None:
        # Set by abandon_running() for the runs begun before it; later runs get a new one.
        self._abandon = threading.Event()

    def start(self) -> None:
        pass

    def wait_ready(self, abort: threading.Event | None = None) -> bool:
        return True

    def run(self, execution: Execution) -> Outcome:
        from . import context

        context.bind_abandon_flag(self._abandon)
        try:
            return execute(execution, in_thread_pool=True)
        finally:
            context.bind_abandon_flag(None)

    def forget(self, job_id: str) -> None:
        """The worker is done with `job_id` here: drop a cancel it never ran into."""
        from . import context

        context.forget_cancel(job_id)

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        from . import context

        # A thread cannot be killed: the task sees the request through cancel_requested().
        context.request_cancel(job_id)
        if force:
            logger.warning("force-cancel needs --pool process; job=%s was only asked to "
                           "stop", job_id)

    def abandon_running(self) -> None:
        """Ask the runs going on now to stop (cancel_requested() turns True for them)."""
        flag, self._abandon = self._abandon, threading.Event()
        flag.set()

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


_READY = "ready"  # a task process's first message: set up, waiting for runs
_READY_FORKED = "ready, forked"  # the same, from a fork of a set-up fork server
# Signals a process group gets (Ctrl-C, a closed terminal, systemd's control-group stop):
# a task process ignores them, and they are blocked from before its start until then.
_GROUP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
READY_TIMEOUT = 120.0  # seconds a new task process may take to set up Django
CHECK_EVERY = 1.0  # seconds between checks that a task process still lives (_wait_outcome)
MAX_ALARM = 10 * 365 * 86400.0  # the longest soft limit setitimer is given (ten years)


_task_process_pid: int | None = None


def _ignore_group_signals() -> None:
    """Have this task process ignore the group's signals, and the processes its tasks
    start not: a handler that does nothing rather than SIG_IGN, which a child keeps
    through exec(). With SIG_IGN, a subprocess ignored Popen.terminate(), and the workers
    of a multiprocessing pool its terminate(): `with multiprocessing.Pool() as pool:`
    could hang at its end for good (a worker waiting on the lock terminate() takes).
    exec() resets a handler; a fork of this process (a "fork" pool's workers, os.fork)
    gets the defaults back at once (register_at_fork), or from the handler itself.

    The signals are blocked across a fork: one sent to the child before it has its
    defaults back would meet our handler there, and CPython drops what a handler has
    not run yet in a fork's child (Popen.terminate() right after start() was lost so,
    one time in two in a test)."""
    global _task_process_pid
    _task_process_pid = os.getpid()
    for signum in _GROUP_SIGNALS:
        signal.signal(signum, _group_signal)
        # Restarted, not cut short with EINTR, where the system call allows (read, write,
        # waits on sockets without a timeout): a drain's signal leaves the task alone.
        signal.siginterrupt(signum, False)
    os.register_at_fork(before=_block_group_signals, after_in_parent=_unblock_group_signals,
                        after_in_child=_group_signals_as_default)


def _group_signal(signum, frame) -> None:
    if os.getpid() != _task_process_pid:  # a fork that bypassed register_at_fork
        _group_signals_as_default()
        signal.raise_signal(signum)


_mask_before_fork = threading.local()


def _block_group_signals() -> None:
    _mask_before_fork.mask = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)


def _unblock_group_signals() -> None:
    mask = getattr(_mask_before_fork, "mask", None)
    if mask is not None:  # as the forking thread had it
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _group_signals_as_default() -> None:
    """In a fork of a task process: the defaults, then what came meanwhile."""
    try:
        for signum in _GROUP_SIGNALS:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
    except ValueError:  # not the main thread (os.fork from another one, in a C library)
        pass
    _unblock_group_signals()


def _child_main(conn, parent_pid: int | None, cancel_flags, claims) -> None:
    _die_with_parent()
    # The parent (the worker, or the fork server) died before prctl took effect.
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    server = _forked_from_server()
    gc.enable()  # off in the fork server, which froze what it set up (zktasks/forkserver.py)
    # Ctrl-C reaches the whole process group, and so does SIGTERM from systemd's default
    # KillMode=control-group, supervisord's stopasgroup or `kill -TERM -PGID`: the worker
    # decides what stops (it drains, and kills a task process with SIGKILL when it must).
    # Taken by default, SIGTERM failed the running job with TaskProcessDied mid-drain;
    # SIGHUP (the terminal closed) did the same.
    _ignore_group_signals()
    # Blocked by the parent around our start (Slot.ensure) and inherited: one sent while
    # we booted is pending, and, ignored now, dropped as we unblock.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)
    signal.signal(signal.SIGALRM, _on_soft_timeout)
    from . import context

    context.bind_shared_flags(cancel_flags)
    # Task code may start processes of its own (multiprocessing.Pool, a
    # ProcessPoolExecutor), which multiprocessing refuses a daemonic process ("daemonic
    # processes are not allowed to have children"). The flag only matters on the
    # worker's side, where it stays (its exit terminates what is left); the worker stops
    # its task processes itself, and they die with it (_die_with_parent).
    multiprocessing.current_process().daemon = False
    if server is not None and server.error:
        # The fork server could not set Django up: its traceback, and the worker stops
        # with the reason (ProcessRunner.wait_ready).
        sys.stderr.write(server.error)
        sys.stderr.flush()
        os._exit(1)
    import django

    django.setup()  # nothing left to do in a fork of a server that set it up
    from .loghandler import format_last_resort

    format_last_resort()  # a task's own warnings, timestamped like the worker's lines
    from .leftovers import ProcessState

    state = ProcessState()  # the directory and umask each job finds (leftovers.py)
    # Ready: the worker counts a run's hard time limit from the hand-off, so it waits
    # for this before the first one (django.setup() took 3 s on a loaded 2-CPU VM).
    if not _report(conn, _READY_FORKED if server is not None else _READY):
        return  # stopped while we set up (a worker's stop, replacing a worn-out process)
    while True:
        try:
            message = conn.recv()
        except (EOFError, ConnectionError):  # the worker is gone, or closed our pipe
            return
        # One run, or a batch of short jobs' runs (ProcessRunner.run_many): each outcome
        # is sent as soon as it is known, so the worker sees each job end.
        batch = isinstance(message, list)
        for number, execution in (message if batch else (message,)):
            if _skipped(number, claims if batch else None):
                # Cancelled while it waited behind the others of its batch.
                if not _report(conn, _not_started(execution)):
                    return
                continue
            context.set_current_run(number)
            _in_task.alarmed = False
            if execution.timeout:
                # Again for each run: a task that set SIGALRM's handler (or ignored it)
                # turned the soft limit off for the runs after it in this process.
                signal.signal(signal.SIGALRM, _on_soft_timeout)
                # Capped: from about 1e10 s (sys.maxsize, "no limit") setitimer raised
                # OverflowError here, outside the run, and the task process died.
                signal.setitimer(signal.ITIMER_REAL, min(execution.timeout, MAX_ALARM))
            try:
                outcome = execute(execution)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if not _report(conn, outcome):
                return
            state.restore(execution.job_id)


def _skipped(number: int, claims) -> bool:
    """Whether run `number` is not to run here: cancelled, or, in a batch, taken back by
    the worker for another task process (ProcessRunner._take_back). In a batch the run is
    claimed under the lock the worker takes back under, so each run is one or the other."""
    from . import context

    if claims is None:
        return context.run_cancelled(number)
    with claims.get_lock():
        if context.run_cancelled(number):
            return True
        claims[number % BATCH_MAX] = number
    return False


def _report(conn, outcome) -> bool:
    """Send an outcome to the worker; False if it is gone (killed, say: the job is
    handed back by the leader). Its traceback, printed by multiprocessing for every
    task process of a killed worker, read as a fault of the task."""
    try:
        conn.send_bytes(_dumps(outcome))
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def _dumps(message) -> bytes:
    """A message between the worker and a task process, as Connection.send() would write
    it but with pickle itself: multiprocessing's ForkingPickler, which sends file
    descriptors and sockets (none of which these carry), copies its dispatch table for
    every message, a tenth of a no-op job's CPU in the task process (bench --profile).
    Connection.recv() reads either."""
    return pickle.dumps(message, pickle.HIGHEST_PROTOCOL)


# -- the fork server ----------------------------------------------------------------------
# multiprocessing keeps one fork server per process; its module-level API has no way to
# know which server a pid is, to stop one, or to tell a child to let go of the server,
# so these use the attributes of multiprocessing.forkserver._forkserver (the same in
# CPython 3.12-3.14) and fall back to doing without them.

# The worker's sys.path, as JSON, for the server's preload (zktasks/forkserver.py):
# multiprocessing passes sys.path to spawned processes, and hands it to its fork server
# too, where CPython 3.12 and 3.13 ignore it: a project found through the directory of
# manage.py would not import there.
SYS_PATH_ENV = "ZKTASKS_TASK_SYS_PATH"
PRELOAD_MODULE = "zktasks.forkserver"
_server_lock = threading.Lock()
# (os.environ, sys.path, preload list) it was started with
_server_env: tuple[dict, list, list] | None = None
_serving: set[int] = set()  # id() of the ProcessRunners started and not stopped


def _serve(runner_id: int) -> None:
    """Before a ProcessRunner's first task process: have a fork server set up with the
    environment and sys.path of now, as a spawned task process would be.

    A server started under others (an earlier in-process worker, in a test that pointed
    the settings somewhere else since) is stopped first, unless a runner still serves
    from it: stopping it would kill that runner's task processes. A worker's environment
    does not change, so in `runworker` this starts the server once.
    """
    from multiprocessing import forkserver as mp_forkserver

    global _server_env
    paths = list(sys.path)
    env = {k: v for k, v in os.environ.items() if k != SYS_PATH_ENV}
    with _server_lock:
        preload = _preload_list(getattr(mp_forkserver._forkserver, "_preload_modules", []))
        if _server_env not in (None, (env, paths, preload)) and not _serving:
            getattr(mp_forkserver._forkserver, "_stop", lambda: None)()
        _serving.add(runner_id)
        if os.environ.get(SYS_PATH_ENV) != json.dumps(paths):
            os.environ[SYS_PATH_ENV] = json.dumps(paths)  # read by the server's preload
        mp_forkserver.set_forkserver_preload(preload)
        before = getattr(mp_forkserver._forkserver, "_forkserver_pid", None)
        mp_forkserver.ensure_running()
        if getattr(mp_forkserver._forkserver, "_forkserver_pid", None) != before:
            # A new one (or one started again after it died).
            _server_env = (env, paths, preload)


def _preload_list(current) -> list[str]:
    """zktasks.forkserver first (it sets Django up), then the modules the project asked
    the fork server to preload itself (multiprocessing.set_forkserver_preload), which
    replacing the list dropped. Not "__main__", multiprocessing's default: in a worker
    that is manage.py, which the server would import for nothing."""
    return [PRELOAD_MODULE] + [
        name for name in current if name not in (PRELOAD_MODULE, "__main__")]


def _unserve(runner_id: int) -> None:
    with _server_lock:
        _serving.discard(runner_id)


def fork_server_pid() -> int | None:
    """The fork server's pid (None if unknown), started again first if it died."""
    from multiprocessing import forkserver as mp_forkserver

    with _server_lock:
        mp_forkserver.ensure_running()
        return getattr(mp_forkserver._forkserver, "_forkserver_pid", None)


def kill_fork_server() -> None:
    """SIGKILL the fork server (one stuck setting Django up); its task processes die too."""
    from multiprocessing import forkserver as mp_forkserver

    pid = getattr(mp_forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _forked_from_server():
    """In a task process: the preload module of the fork server it is a fork of
    (zktasks/forkserver.py), or None if it was spawned or that server could not import
    it (then the task process sets Django up itself)."""
    from multiprocessing import forkserver as mp_forkserver

    server = mp_forkserver._forkserver
    if server.get_inherited_fds() is None:
        return None  # spawned
    # multiprocessing gives every child the write end of the pipe by which the server
    # learns that the worker is gone (it exits at EOF), so that the child can start
    # processes through it too. A task process has no use for it, and holding it kept
    # the server alive after a SIGKILLed worker, and with it every task process (their
    # parent-death signal is the server's exit).
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        server._forkserver_alive_fd = None
    return sys.modules.get(PRELOAD_MODULE)


def _on_soft_timeout(signum, frame):
    # The soft limit: raise inside the task so it can clean up; the worker kills the
    # process if it has not stopped within the grace period after.
    if _in_task.active:
        raise TaskTimeout("The task ran past its time limit (soft limit: cleaning up).")
    _in_task.alarmed = True  # raised as the task begins: it was lost, and the hard
    # limit killed the task process with no chance to clean up


# Once per job each, on the runner thread: multiprocessing.connection.wait() builds a
# selectors.PollSelector (Python objects for every fd) and Process.is_alive() of a fork
# server's child another, to poll one or two fds. A bare select.poll is the same system
# call without them; the two came to about 3 % of a busy worker's CPU (bench --profile).
_PIPE, _SENTINEL = 1, 2


def _wait_readable(conn, sentinel: int | None, seconds: float) -> int:
    """Wait up to `seconds` for the task process's pipe or its sentinel: _PIPE if the
    pipe has something (data, or EOF), else _SENTINEL if only the sentinel fired, else
    0. Any event counts, as for connection.wait(): a hang-up or an error is "ready"."""
    poller = select.poll()
    pipe = conn.fileno()  # OSError if closed, as connection.wait() raised
    poller.register(pipe, select.POLLIN)
    if sentinel is not None:
        poller.register(sentinel, select.POLLIN)
    # poll() takes milliseconds; rounded up, so that a wait never returns early.
    found = {fd for fd, _ in poller.poll(math.ceil(max(0.0, seconds) * 1000))}
    return _PIPE if pipe in found else _SENTINEL if found else 0


def _alive(process) -> bool:
    """process.is_alive(), cheaper for a fork server's child: alive while its sentinel
    (the pipe by which the server reports its exit) has nothing to read. A spawned
    process's is_alive() is a waitpid already; and whatever is readable is confirmed by
    is_alive() itself, which also records the exit code."""
    if getattr(process, "_start_method", None) != "forkserver":
        return process.is_alive()
    poller = select.poll()
    poller.register(process.sentinel, select.POLLIN)
    return not poller.poll(0) or process.is_alive()


class _Slot:
    def __init__(self, ctx, index: int):
        self.ctx = ctx
        self.index = index
        self.process = None
        self.conn = None
        self._close_lock = threading.Lock()
        # Under ProcessRunner._lock: the job the task process runs (as far as the worker
        # knows), the run numbers of the jobs handed to it and not reported yet, and those
        # of them force-cancelled while they waited behind another.
        self.job_id: str | None = None
        self.queued: dict[str, int] = {}
        self.forced: set[str] = set()
        self.cancelled = False
        self.killed = None  # the process a forced cancel sent SIGKILL, until reaped
        self.ready = False  # whether the task process has said it is set up
        self.forked = False  # whether it said so as a fork of a set-up fork server
        self._ensure_lock = threading.Lock()  # ProcessRunner's starter and the runner
        self.runs = 0
        self.handed = 0  # jobs handed to the current task process (--max-tasks-per-child)
        self.cancel_flags = ctx.Array("q", BATCH_MAX, lock=False)  # see context.py
        # Entry `n % BATCH_MAX` holds n once the task process has begun run n of a batch
        # (_skipped). One per task process, never reused: a process killed while it held
        # the lock leaves it held for good.
        self.claims = None

    def ensure(self) -> None:
        with self._ensure_lock:
            process = self.process
            # SIGKILL is not instant: a process a forced cancel killed can look alive for
            # a moment, and, if the outcome it was on had already been read, nobody else
            # reaps it. Never hand it the next run.
            if process is not None and process is not self.killed and _alive(process):
                return
            if process is not None:
                self._reap()  # joins (at once for a dead or killed process) and closes
            self.close()
            forked = self.ctx.get_start_method() == "forkserver"
            parent, child = self.ctx.Pipe()
            claims = self.ctx.Array("q", BATCH_MAX)
            process = self.ctx.Process(
                target=_child_main,
                args=(child, fork_server_pid() if forked else os.getpid(),
                      self.cancel_flags, claims),
                name=f"zktasks-task-{self.index}",
                daemon=True,
            )
            # Until _child_main ignores them, the group's SIGTERM or SIGINT killed a task
            # process still booting, and the job about to be handed to it failed with
            # TaskProcessDied though it never started. The mask is this thread's; a
            # spawned child inherits it through fork and exec (the fork server, whose
            # forks these are otherwise, ignores them: zktasks/forkserver.py).
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
            try:
                process.start()
            except BaseException:
                parent.close()
                raise
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
                child.close()
            self.process, self.claims = process, claims
            self.conn, self.ready, self.handed = parent, False, 0

    def send(self, message):
        """Hand runs to the task process; return the connection, or None if it is gone."""
        self.ensure()
        conn = self.conn  # a forced stop may clear the attribute from another thread
        try:
            if conn is None:
                raise EOFError("the task process was stopped")
            if not self.ready:
                self._wait_ready(conn)
            conn.send_bytes(_dumps(message))
        except (EOFError, OSError):
            return None
        self.handed += len(message) if isinstance(message, list) else 1
        return conn

    def worn_out(self, max_tasks: int | None, max_memory_kb: int | None) -> str | None:
        """Why the task process is to be replaced before its next job, or None."""
        if max_tasks and self.handed >= max_tasks:
            return f"it ran {self.handed} job(s) (--max-tasks-per-child {max_tasks})"
        process = self.process
        if max_memory_kb and process is not None and process.pid is not None:
            rss = _rss_kb(process.pid)
            if rss is not None and rss > max_memory_kb:
                return (f"its resident memory is {rss:,} KB "
                        f"(--max-memory-per-child {max_memory_kb:,})")
        return None

    def replace(self) -> None:
        """Let the task process exit between jobs and start a fresh one at once, which
        sets up while the slot waits for its next job (send() waits for it if need be)."""
        process = self.process
        self.close()  # the child, idle in recv(), sees EOF and exits
        if process is not None:
            # Reaped aside, not here: a task that left a non-daemon thread behind keeps
            # its process from exiting, and the runner thread must not wait for it.
            threading.Thread(target=_reap_retired, args=(process,), daemon=True,
                             name=f"zktasks-reap-{process.pid}").start()
        self.ensure()

    def _wait_ready(self, conn) -> None:
        if not conn.poll(READY_TIMEOUT):
            logger.error("A task process did not set up within %gs; killing it.",
                         READY_TIMEOUT)
            self.kill()
            raise EOFError("the task process did not set up")
        self.check_ready(conn)

    def check_ready(self, conn) -> None:
        """Read a new task process's first message, which must say it is set up."""
        message = conn.recv()  # EOFError if it died setting up
        if message not in (_READY, _READY_FORKED):
            raise RuntimeError(f"A task process's first message was {message!r}, "
                               f"not {_READY!r}.")
        self.ready, self.forked = True, message == _READY_FORKED

    def run(self, number: int, execution: Execution) -> Outcome:
        conn = self.send((number, execution))
        return self.outcome(conn, execution)

    def outcome(self, conn, execution: Execution, waited: float = 0.0) -> Outcome:
        """Wait for the outcome of the run the task process is on (`execution`), which
        has been waited for `waited` seconds already."""
        hard_limit = None
        if execution.timeout:
            hard_limit = max(0.0, execution.timeout + max(1.0, execution.timeout * 0.1)
                             - waited)
        try:
            if conn is None:
                raise EOFError("the task process was stopped")
            if not self._wait_outcome(conn, hard_limit):
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
        except Exception as exc:
            # A fault of ours while waiting, not the task's: the task process may still
            # be on the job, and its outcome, read later, would be taken for the next
            # job's. It is killed, and the job fails with the error.
            logger.exception("could not wait for job=%s; its task process is killed",
                             execution.job_id)
            self.kill()
            return _failure(exc)

    def _wait_outcome(self, conn, limit: float | None) -> bool:
        """Wait until the pipe has the outcome (or is closed): True; False after `limit`
        seconds. EOFError if the task process exits without sending one.

        Not conn.poll(limit) alone: a process the task forked (multiprocessing's "fork",
        a subprocess that inherits it) holds the pipe open after the task process died,
        and the death went unseen for as long as that child lived. So the process's
        sentinel is waited on too (a fork server's child: it fires at the exit), and
        every CHECK_EVERY seconds the process is asked whether it lives (a spawned one,
        whose sentinel such a child holds open too). And never more than CHECK_EVERY at
        once: a limit over 2**31 ms (a `timeout` of 25 days) raised OverflowError out of
        poll(), with the task running.
        """
        deadline = None if limit is None else time.monotonic() + limit
        process = self.process
        sentinel = getattr(process, "sentinel", None) if process is not None else None
        while True:
            wait = CHECK_EVERY if deadline is None else min(
                CHECK_EVERY, max(0.0, deadline - time.monotonic()))
            ready = _wait_readable(conn, sentinel, wait)
            if ready == _PIPE:
                return True
            if ready or (process is not None and not process.is_alive()):
                # The task process has exited: what it sent is in the pipe by now.
                if conn.poll(0):
                    return True
                raise EOFError("the task process exited")
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def reported(self) -> bool:
        """Whether an outcome waits in the pipe (the run it is for has ended)."""
        conn = self.conn
        try:
            return conn is not None and conn.poll(0)
        except (EOFError, OSError):
            return False

    def salvage(self, conn) -> Outcome | None:
        """After a forced kill of this process: the outcome it sent before it died, or
        None. (poll() is true at EOF too, so reported() cannot tell.)"""
        killed = self.killed
        if killed is not None:
            killed.join(5)  # SIGKILL: at once
        try:
            if conn.poll(0):
                return conn.recv()
        except (EOFError, OSError):
            pass
        return None

    def cancel(self, number: int, *, force: bool) -> None:
        # Flagged in every case: the flags outlive task processes, and the one that runs
        # `number` skips it if it has not started. Between processes (a respawn, a dying
        # one being reaped) the request was dropped, or a kill hit the old process, and
        # the run went ahead on the new one.
        self.flag(number)
        process = self.process
        if process is None or not process.is_alive():
            return
        if force:
            self.cancelled, self.killed = True, process
            process.kill()

    def flagged(self, number: int) -> bool:
        return self.cancel_flags[number % BATCH_MAX] == number

    def flag(self, number: int) -> None:
        """Ask run `number` to stop: the task sees cancel_requested(), or, not started
        yet, it is not run."""
        self.cancel_flags[number % BATCH_MAX] = number

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


RETIRE_GRACE = 10.0  # seconds a replaced task process has to exit before it is killed


def _reap_retired(process) -> None:
    process.join(RETIRE_GRACE)
    if process.is_alive():
        children = _child_pids(process.pid)
        if children:
            # multiprocessing joins a process's non-daemon children as it exits.
            cause = (f"it waits for {len(children)} process(es) it started, pid "
                     f"{', '.join(map(str, children))}, which it joins at exit; they are "
                     "left running")
        else:
            cause = "a non-daemon thread left running?"
        logger.warning("A replaced task process (pid %s) did not exit within %gs (%s); "
                       "killing it.", process.pid, RETIRE_GRACE, cause)
        process.kill()
        process.join(5)
    try:
        process.close()
    except ValueError:
        pass


_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def _rss_kb(pid: int) -> int | None:
    """Resident memory of a process in KB (Linux /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return None


def _child_pids(pid: int) -> list[int]:
    """The live children of a process (Linux /proc); empty where they cannot be read."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as children:
                found += [int(child) for child in children.read().split()]
    except (OSError, ValueError):
        pass
    return sorted(found)


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


def _not_started(execution: Execution) -> Outcome:
    return _failure(JobCancelled(
        f"Job {execution.job_id!r} was cancelled before its task started."))


class ProcessRunner:
    """A fixed set of task processes; each job (or batch of short jobs) borrows one for
    its whole run."""

    name = "process"
    batch_max = BATCH_MAX  # the most jobs run_many takes at once

    def __init__(self, size: int, *, max_tasks: int | None = None,
                 max_memory_kb: int | None = None, start_method: str | None = None):
        # "forkserver" where there is one (zktasks/forkserver.py), else "spawn".
        self.start_method = start_method or (
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
            else "spawn")
        self.ctx = multiprocessing.get_context(self.start_method)
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self.slots = [_Slot(self.ctx, i) for i in range(size)]
        self.free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._early_cancels: dict[str, bool] = {}
        # Celery's --max-tasks-per-child and --max-memory-per-child: a task process is
        # replaced between jobs once it ran that many, or grew past that much resident
        # memory (a leak in task code, or a big import it keeps).
        self.max_tasks = max_tasks
        self.max_memory_kb = max_memory_kb

    def start(self) -> None:
        """Start every task process, without waiting for them to set up (wait_ready:
        a run handed over before that waits for its process)."""
        if self.start_method != "forkserver":
            for slot in self.slots:
                slot.ensure()
                self.free.put(slot)
            return
        # A fork server sets Django up before it forks the first task process, and
        # starting a process waits for its fork: seconds, or forever for a setup that
        # hangs. So they start on a thread of their own, which wait_ready waits for
        # within READY_TIMEOUT. (Not so for spawned ones: their parent-death signal
        # comes when the thread that started them exits.)
        _serve(id(self))
        for slot in self.slots:
            self.free.put(slot)  # a run handed over meanwhile starts its slot itself
        self._starting = threading.Thread(target=self._start_slots, daemon=True,
                                          name="zktasks-task-start")
        self._starting.start()

    def _start_slots(self) -> None:
        try:
            for slot in self.slots:
                slot.ensure()
        except BaseException as exc:  # noqa: BLE001 - wait_ready reports it
            self._start_error = exc

    @property
    def forked(self) -> bool:
        """Whether every task process is a fork of a fork server that set Django up."""
        return all(slot.forked for slot in self.slots)

    def wait_ready(self, abort: threading.Event | None = None) -> bool:
        """Wait until every task process has set up Django; False if `abort` was set
        first. A worker registers only after this, so that it is not handed jobs it
        cannot start for the seconds a setup takes (3 s seen on a loaded 2-CPU VM), and
        a task process that cannot set up at all (settings that fail to import in a fresh
        interpreter, say) stops the worker with its reason instead of failing every job
        it is given. Raises TaskProcessDied then, with the task processes stopped."""
        deadline = time.monotonic() + READY_TIMEOUT
        starting = self._starting
        while starting is not None and starting.is_alive():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break  # the fork server is stuck setting Django up: reported below
            if abort is not None and abort.is_set():
                return False
            starting.join(min(remaining, 0.5))
        if self._start_error is not None:
            self.stop(force=True)
            raise TaskProcessDied(
                "The fork server of the task processes exited while it set up Django, "
                f"before running any job ({self._start_error!r}); runworker stopped. Its "
                "traceback is above, if it printed one. It is a fresh interpreter that "
                "imports the settings and calls django.setup(): fix what fails there, or "
                "run jobs in the worker itself with --pool thread."
            ) from self._start_error
        waiting = {slot.conn: slot for slot in self.slots if not slot.ready}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or None in waiting:
                self.stop(force=True)
                raise TaskProcessDied(
                    f"A task process did not set up Django within {READY_TIMEOUT:g}s; "
                    "runworker stopped. Something in the settings or an app's ready() "
                    "blocks in a fresh interpreter; run `python -c 'import django; "
                    "django.setup()'` with the same settings to see where, or run jobs "
                    "in the worker itself with --pool thread.")
            if abort is not None and abort.is_set():
                return False
            # In slices only to notice `abort` (a signal during startup): the wait ends
            # as soon as a task process speaks.
            for conn in mp_connection.wait(list(waiting), min(remaining, 0.5)):
                slot = waiting.pop(conn)
                try:
                    slot.check_ready(conn)
                except (EOFError, OSError, RuntimeError) as exc:
                    code = slot._reap()
                    self.stop(force=True)
                    raise TaskProcessDied(
                        f"A task process exited with {_describe_exit(code)} while it set "
                        "up Django, before running any job; runworker stopped. Its "
                        "traceback is above. Each task process is a fresh interpreter "
                        "that imports the settings and calls django.setup(): fix what "
                        "fails there, or run jobs in the worker itself with --pool "
                        "thread.") from exc
        return True

    def run(self, execution: Execution) -> Outcome:
        slot = self.free.get()
        try:
            with self._lock:
                force = self._early_cancels.pop(execution.job_id, None)
                # Under the lock, so a cancel lands either here (early) or on this run.
                if force is None:
                    number = self._number(slot)
                    slot.job_id, slot.cancelled = execution.job_id, False
                    slot.queued = {execution.job_id: number}
            if force is not None:
                return _not_started(execution)
            outcome = slot.run(number, execution)
            self._renew_if_worn(slot)
            return outcome
        finally:
            self._release(slot)

    def _renew_if_worn(self, slot: _Slot) -> None:
        if not (self.max_tasks or self.max_memory_kb) or slot.process is None:
            return
        why = slot.worn_out(self.max_tasks, self.max_memory_kb)
        if why:
            logger.info("task process replaced pid=%s: %s", slot.process.pid, why)
            slot.replace()

    def run_many(self, executions: list[Execution], on_taken_back=None
                 ) -> Iterator[Outcome]:
        """Run a batch of short jobs on one task process; yield their outcomes in order.

        The batch goes in one message and the task process reports each outcome as it
        ends, so the batch costs the task process one wake-up instead of one per job,
        and the worker reads outcomes that are already there. Each job keeps its own
        soft time limit (set in the task process); the hard limit is counted from when
        the worker starts waiting for that job's outcome. A job cancelled while it
        waits behind others is not run. If the task process dies or is killed, the job
        it was on gets that failure and the jobs after it run one by one in a fresh
        process: none is lost. One case runs a job twice (at-least-once, as a worker's
        death does): a force-cancel that kills the process in the instant it has just
        reported one job and begun the next; the next then runs again from its start.

        `on_taken_back(executions)`: with more than one task process, a job that runs
        past BATCH_PATIENCE_S does not hold up the jobs behind it. Those the task process
        has not begun are taken back (each is begun there or taken back, never both:
        _skipped) and handed to `on_taken_back`, to run elsewhere; TAKEN_BACK is yielded
        in their place.
        """
        if len(self.slots) < 2:
            on_taken_back = None  # no other task process to run them
        slot = self.free.get()
        try:
            while executions:
                # Never more jobs in one task process than --max-tasks-per-child allows.
                take = len(executions)
                if self.max_tasks:
                    take = max(1, min(take, self.max_tasks - slot.handed))
                chunk, executions = executions[:take], executions[take:]
                moved = yield from self._run_batch(slot, chunk, executions, on_taken_back)
                self._renew_if_worn(slot)
                if moved:  # the rest of the batch went with them
                    for _ in executions:
                        yield TAKEN_BACK
                    return
        finally:
            self._release(slot)

    def _run_batch(self, slot: _Slot, executions: list[Execution], after: list[Execution],
                   on_taken_back) -> Iterator[Outcome]:
        """run_many for the jobs one task process is handed at once; `after`: the jobs
        of the batch after them, taken back with them if it comes to that. Returns
        whether they were."""
        with self._lock:
            early = {e.job_id for e in executions if e.job_id in self._early_cancels}
            for job_id in early:
                del self._early_cancels[job_id]
            slot.queued = {e.job_id: self._number(slot)
                           for e in executions if e.job_id not in early}
            slot.forced, slot.job_id = set(), None
            batch = [(slot.queued[e.job_id], e) for e in executions
                     if e.job_id not in early]
        conn = slot.send(batch) if batch else None
        claims = slot.claims  # the task process's, which send() started if need be
        taken: set[str] = set()
        moved = False
        for index, execution in enumerate(executions):
            job_id = execution.job_id
            if job_id in early:
                yield _not_started(execution)
                continue
            if job_id in taken:
                # The task process skips it and says so, once past the one it was on.
                self._drop_report(slot, conn)
                yield TAKEN_BACK
                continue
            with self._lock:
                slot.job_id, slot.cancelled = job_id, False
                number = slot.queued[job_id]
                lost = conn is None or slot.conn is not conn
                killed = not lost and slot.process is slot.killed
            # A forced cancel of the job before may have killed the process just
            # after that job reported, while it ran this one: run this one again
            # in a fresh process, unless its outcome had already been sent.
            salvaged = slot.salvage(conn) if killed else None
            if killed and salvaged is None:
                lost, conn = True, None
            if lost:
                with self._lock:
                    cancelled = job_id in slot.forced or slot.flagged(number)
                    if not cancelled:
                        # The batch ended before this job: it runs alone.
                        slot.queued[job_id] = number = self._number(slot)
            if salvaged is not None:
                outcome = salvaged
            elif lost:
                outcome = (_not_started(execution) if cancelled
                           else slot.run(number, execution))
            elif job_id in slot.forced and not slot.reported():
                # Force-cancelled while it waited, and no outcome yet: the task
                # process is on it (or skipping it). Kill it as a running job is
                # killed. The jobs after it run alone: if the process had just
                # moved on to the next one, that one runs again from its start.
                slot.cancel(number, force=True)
                outcome = slot.outcome(conn, execution)
                conn = None
            else:
                waited = 0.0
                behind = executions[index + 1:] + after
                if on_taken_back is not None and not moved and behind:
                    began = time.monotonic()
                    if not self._reported_within(slot, conn, BATCH_PATIENCE_S):
                        back = self._take_back(slot, claims, behind, after)
                        if back:
                            moved = bool(after)
                            taken.update(e.job_id for e in back)
                            logger.info(
                                "job=%s has run for %.1fs with %d job(s) of its batch "
                                "waiting behind it; they run on other task processes",
                                job_id, time.monotonic() - began, len(back))
                            on_taken_back(back)
                    waited = time.monotonic() - began
                outcome = slot.outcome(conn, execution, waited)
            with self._lock:
                # At once: a force-cancel of this job from now on must not kill the
                # next one, which the task process may already be running.
                slot.queued.pop(job_id, None)
                slot.job_id = None
            yield outcome
        return moved

    @staticmethod
    def _reported_within(slot: _Slot, conn, seconds: float) -> bool:
        """Whether the run the task process is on reports (or the process ends) within
        `seconds`; slot.outcome() then reads which."""
        try:
            # One bare poll when it has reported already, as short jobs mostly have
            # (conn.poll(0) first built a selector for it: _wait_readable).
            return slot._wait_outcome(conn, seconds)
        except (EOFError, OSError):
            return True

    def _take_back(self, slot: _Slot, claims, behind: list[Execution],
                   after: list[Execution]) -> list[Execution]:
        """The jobs of `behind` the task process has not begun, taken back from it: all of
        them if it has not begun the first (it runs them in order), none if it has. Jobs
        cancelled meanwhile stay: the task process reports them as cancelled, in turn.
        `after`, the end of `behind`, was never handed to it."""
        handed = behind[:len(behind) - len(after)]
        back: list[Execution] = []
        if claims is None:
            return back
        # Bounded: a task process killed inside the lock leaves it held; it is dead then,
        # and nothing waits behind it. Taken before ours, so that cancels and other
        # runners never wait on a task process (which takes this one alone).
        if not claims.get_lock().acquire(timeout=1.0):
            return back
        try:
            with self._lock:
                for execution in handed:
                    number = slot.queued.get(execution.job_id)
                    if number is None:
                        continue
                    if claims[number % BATCH_MAX] == number:
                        return []  # begun: the task process is moving again
                    if slot.flagged(number):
                        continue  # cancelled: it reports so in its turn
                    slot.flag(number)  # it skips a flagged run (_skipped)
                    del slot.queued[execution.job_id]  # a cancel now waits for its rerun
                    back.append(execution)
        finally:
            claims.get_lock().release()
        return back + after

    @staticmethod
    def _drop_report(slot: _Slot, conn) -> None:
        """Read the report of a run taken back from this task process (a cancellation
        it never ran), so that it is not taken for a later run's outcome. None comes if
        the process has died or was replaced meanwhile. It comes at once after the run
        the process was on (what follows it is skipped); a process that sends nothing
        for DROP_REPORT_WAIT is stuck between jobs and is killed, which its next run
        sees."""
        if conn is None or slot.conn is not conn:
            return
        try:
            if slot._wait_outcome(conn, DROP_REPORT_WAIT):
                conn.recv()
                return
        except (EOFError, OSError):
            return
        logger.error("task process pid=%s sent nothing for %gs after its job; killing it",
                     getattr(slot.process, "pid", None), DROP_REPORT_WAIT)
        slot.kill()

    @staticmethod
    def _number(slot: _Slot) -> int:
        slot.runs += 1
        return slot.runs

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            slot.job_id, slot.queued, slot.forced = None, {}, set()
        self.free.put(slot)

    def forget(self, job_id: str) -> None:
        """The worker is done with `job_id` here: drop a cancel kept for its arrival that
        never came (read while its run was settling, or before a refused start)."""
        with self._lock:
            self._early_cancels.pop(job_id, None)

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        with self._lock:
            # Every slot that holds the job: after a lost session one slot may still run
            # the abandoned first run while another runs the rerun (our new identity's),
            # and the cancel is for the job, so for both.
            held = False
            for slot in self.slots:
                number = slot.queued.get(job_id)
                if number is None:
                    continue
                held = True
                if slot.job_id == job_id:
                    if force and slot.reported():
                        # It has ended (its outcome waits in the pipe): killing now
                        # would kill the next job of its batch instead.
                        continue
                    slot.cancel(number, force=force)
                else:
                    # Waiting behind another job of its batch: not run when its turn
                    # comes; if the task process is already on it, a request (and, with
                    # force, a kill once it is the worker's turn to wait for it).
                    slot.flag(number)
                    if force:
                        slot.forced.add(job_id)
            if not held:
                # Not on a slot yet (between "started" and the hand-over): apply on
                # arrival.
                self._early_cancels[job_id] = force

    def abandon_running(self) -> None:
        """Ask the runs on a slot now to stop (cancel_requested() turns True for them):
        the one running and those behind it in its batch. Flags are per run number, so
        a later run of the same job, under the worker's new identity, is not asked."""
        with self._lock:
            for slot in self.slots:
                for number in slot.queued.values():
                    slot.flag(number)

    def stop(self, *, force: bool = False) -> None:
        _unserve(id(self))
        starting = self._starting
        if starting is not None and starting.is_alive():
            if force:
                kill_fork_server()  # stuck setting Django up: its fork never comes
            starting.join(5 if force else READY_TIMEOUT)
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


def make_runner(pool: str, concurrency: int, *, max_tasks: int | None = None,
                max_memory_kb: int | None = None):
    if pool == "thread":
        if max_tasks or max_memory_kb:
            raise ValueError("--max-tasks-per-child and --max-memory-per-child replace task "
                             "processes; threads have none: use them with --pool process.")
        return ThreadRunner()
    if pool == "process":
        return ProcessRunner(concurrency, max_tasks=max_tasks, max_memory_kb=max_memory_kb)
    raise ValueError(f"Unknown pool {pool!r}; use 'process' or 'thread'.")
