"""Tasks the test suite submits. Importable by workers started from the repo root."""

import os
import threading
import time
from pathlib import Path

from zktasks import zk_task


@zk_task
def add(a, b):
    return a + b


@zk_task(queue_name="emails")
def email(address):
    return f"sent to {address}"


@zk_task
def logs(message):
    """Logs through a logger of its own, as task code does, at INFO and at WARNING."""
    import logging

    log = logging.getLogger("tests.tasks.logs")
    log.info("info: %s", message)
    log.warning("warning: %s", message)
    return message


@zk_task
def boom(message):
    raise ValueError(message)


@zk_task
def sleep_then_return(marker_dir, seconds, value):
    """Record the start in a file (so a test can wait for it), sleep, return."""
    Path(marker_dir, f"started-{os.getpid()}-{time.monotonic_ns()}").touch()
    time.sleep(seconds)
    return value


@zk_task
def wait_for_file(path, value):
    """Block until `path` exists (a test releases the job by creating it)."""
    while not os.path.exists(path):
        time.sleep(0.02)
    return value


@zk_task(takes_context=True)
def with_context(context, x):
    return {"attempt": context.attempt, "id": context.task_result.id, "x": x}


@zk_task
def exit_hard(code):
    os._exit(code)


@zk_task(timeout=0.5)
def hang():
    time.sleep(60)


@zk_task(max_attempts=3, backoff=0, takes_context=True)
def flaky(context, succeed_on):
    if context.attempt < succeed_on:
        raise RuntimeError(f"failing attempt {context.attempt}")
    return context.attempt


@zk_task(max_attempts=2, backoff=0.4, takes_context=True)
def fails_once_with_backoff(context):
    if context.attempt == 1:
        raise ConnectionError("first attempt fails")
    return context.task_result.last_attempted_at


@zk_task(max_attempts=3, takes_context=True)
def asks_for_retry(context):
    from zktasks import Retry

    if context.attempt == 1:
        raise Retry("not yet", delay=0.1)
    return context.attempt


@zk_task(max_attempts=5, backoff=0, retry_on=(ConnectionError,))
def raises_value_error():
    raise ValueError("not retried")


def stop_after_two(attempt, exc):
    return None if attempt >= 2 else 0


@zk_task(max_attempts=5, backoff=stop_after_two)
def always_fails():
    raise RuntimeError("again")


@zk_task
def until_cancelled(marker):
    """Work until asked to stop, checking the cooperative flag."""
    from zktasks import JobCancelled, cancel_requested

    Path(marker).touch()
    while not cancel_requested():
        time.sleep(0.02)
    raise JobCancelled("stopped on request")


@zk_task
def ignores_cancel(marker):
    Path(marker).touch()
    time.sleep(60)


@zk_task(timeout=0.5)
def cleans_up_on_timeout(marker):
    from zktasks import TaskTimeout

    try:
        time.sleep(30)
    except TaskTimeout:
        Path(marker).touch()
        raise


async def _async_double(x):
    import asyncio

    await asyncio.sleep(0)
    return 2 * x


async_double = zk_task(_async_double)


async def _async_until_cancelled(marker):
    """until_cancelled, as a coroutine: it runs in asgiref's event-loop thread."""
    import asyncio

    from zktasks import JobCancelled, cancel_requested

    Path(marker).touch()
    while not cancel_requested():
        await asyncio.sleep(0.02)
    raise JobCancelled("stopped on request")


async_until_cancelled = zk_task(_async_until_cancelled)


async def _async_past_its_limit(marker_dir, seconds):
    """Sleeps past its time limit; leaves a file saying whether it cleaned up or ran on."""
    import asyncio

    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        (Path(marker_dir) / "cleaned-up").touch()
        raise
    (Path(marker_dir) / "ran-on").touch()


async_past_its_limit = zk_task(timeout=0.5)(_async_past_its_limit)


async def _async_blocks_its_loop(seconds):
    time.sleep(seconds)  # blocks the event loop: cancelling cannot reach it


async_blocks_its_loop = zk_task(timeout=0.5)(_async_blocks_its_loop)


@zk_task(timeout=5)
def short_sleep_limited(seconds):
    """Only test_async_time_limits runs it (the thread pool warns once per process)."""
    time.sleep(seconds)


@zk_task
def record_pid_and_wait(marker_dir, release):
    """Write this task process's pid, then block until released."""
    Path(marker_dir, "pid").write_text(str(os.getpid()))
    while not os.path.exists(release):
        time.sleep(0.02)
    return os.getpid()


@zk_task
def short_sleep(seconds):
    time.sleep(seconds)
    return seconds


@zk_task
def mark(marker_dir, number):
    """Leave a file per run (so a test counts executions, repeats included)."""
    Path(marker_dir, f"{number}-{os.getpid()}-{time.monotonic_ns()}").touch()
    return number


@zk_task
def exclusive(marker_dir, seconds):
    """Hold `marker_dir/running` for `seconds`; leave `overlap-*` if another run held it."""
    held = Path(marker_dir, "running")
    try:
        fd = os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        Path(marker_dir, f"overlap-{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(seconds)
        return False
    os.close(fd)
    time.sleep(seconds)
    held.unlink()
    return True


@zk_task(takes_context=True)
def stops_when_its_worker_is_lost(context, directory, limit):
    """Attempt 1 runs until cancel_requested() (noted in `asked`) or `limit` seconds (noted
    in `not-asked`), then raises JobCancelled; later attempts return at once."""
    from zktasks import JobCancelled, cancel_requested

    attempt = context.attempt
    Path(directory, f"{attempt}.started").touch()
    if attempt > 1:
        return attempt
    deadline = time.monotonic() + limit
    while not cancel_requested():
        if time.monotonic() > deadline:
            Path(directory, "not-asked").touch()
            return attempt
        time.sleep(0.02)
    Path(directory, "asked").touch()
    raise JobCancelled("its worker's session expired")


@zk_task(takes_context=True)
def notes_its_attempt(context, directory):
    """Touches `{attempt}.ran` in `directory`: which attempts ran."""
    Path(directory, f"{context.attempt}.ran").touch()
    return context.attempt


@zk_task(takes_context=True)
def cancel_reaches_the_rerun(context, directory, limit):
    """Attempt 1 waits for `release` (up to 6 × `limit` seconds), whatever it is asked.
    Later attempts wait for cancel_requested() (noted in `rerun-asked`, then
    JobCancelled) or return "not asked" after `limit` seconds."""
    from zktasks import JobCancelled, cancel_requested

    attempt = context.attempt
    Path(directory, f"{attempt}.started").touch()
    deadline = time.monotonic() + limit * (6 if attempt == 1 else 1)
    if attempt == 1:
        while not Path(directory, "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return attempt
    while not cancel_requested():
        if time.monotonic() > deadline:
            return "not asked"
        time.sleep(0.02)
    Path(directory, "rerun-asked").touch()
    raise JobCancelled("asked")


@zk_task
def fan_out(n):
    """Submits n follow-up jobs from inside a running job; returns their ids."""
    return [add.submit(i, i).id for i in range(n)]


async def _async_fan_out(n):
    return [(await add.asubmit(i, i)).id for i in range(n)]


async_fan_out = zk_task(_async_fan_out)


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ itself fails")


@zk_task
def raises_unprintable():
    raise UnprintableError("hidden")


def _refuse_to_load():
    raise RuntimeError("this value cannot be loaded here")


class LoadsNowhere:
    """Pickles fine on the worker; unpickling it raises (as a class missing here would)."""

    def __reduce__(self):
        return _refuse_to_load, ()


@zk_task
def returns_unloadable():
    return LoadsNowhere()


@zk_task(max_attempts=3, backoff=0)
def returns_a_generator(marker_dir):
    """Runs (a marker per run), then returns what dill cannot pickle."""
    Path(marker_dir, f"ran-{time.monotonic_ns()}").touch()
    return (n for n in range(2))


@zk_task
def waits_for_add(a, b):
    """Submits another job and waits for it: the pattern wait() warns about. The job
    is due a moment later, so it cannot have finished by the wait's first read."""
    from datetime import timedelta

    from django.utils import timezone

    later = add.using(run_after=timezone.now() + timedelta(seconds=0.3))
    return later.submit(a, b).wait(timeout=30).return_value


class Greeter:
    def __init__(self, name):
        self.name = name

    def hello(self, other):
        return f"{self.name} greets {other}"

    def __call__(self, other):
        return f"{self.name} called {other}"

    async def ahello(self, other):
        return f"{self.name} awaits {other}"


def join_with(separator, *parts):
    return separator.join(parts)


@zk_task
def pid():
    """Return the pid of the process that runs it."""
    return os.getpid()


@zk_task
def origin():
    """Where the task process that runs it comes from: its pid, its parent's, and whether
    it is a fork of a fork server that set Django up (zktasks/forkserver.py)."""
    import gc
    import sys

    server = sys.modules.get("zktasks.forkserver")
    return {"pid": os.getpid(), "ppid": os.getppid(),
            "preloaded": server is not None and server.error is None,
            "frozen": gc.get_freeze_count(), "collecting": gc.isenabled()}


@zk_task
def factorials_in_a_process_pool(numbers):
    """Task code with processes of its own: multiprocessing refused a task process
    children ("daemonic processes are not allowed to have children")."""
    import math
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        return pool.map(math.factorial, numbers)


@zk_task
def imported(name):
    """Whether module `name` is imported where it runs (without importing it)."""
    import sys

    return name in sys.modules


@zk_task
def environ(name):
    """The value of environment variable `name` where it runs."""
    return os.environ.get(name)


@zk_task
def leaves_a_thread():
    """Start a non-daemon thread that never ends (it keeps its process from exiting)."""
    threading.Thread(target=threading.Event().wait, name="left-behind").start()
    return os.getpid()


@zk_task
def leaves_a_child_process(marker_dir):
    """Start a non-daemon multiprocessing child that sleeps for two minutes: the process
    waits for it as it exits (multiprocessing joins such children at exit)."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))
    child.start()
    Path(marker_dir, "child").write_text(str(child.pid))
    return os.getpid()


# Set by the test that uses them (in-process thread-pool workers only).
rerun_gates: dict[str, threading.Event] = {}


@zk_task(takes_context=True)
def rerun_sees_a_cancel_after_its_first_run_ends(context, limit):
    """Attempt 1 ignores being abandoned and ends when the test says; a later attempt,
    once the test says the first run is gone, raises JobCancelled if asked to stop within
    `limit` seconds (else returns 'not asked')."""
    from zktasks import JobCancelled, cancel_requested

    gates = rerun_gates
    if context.attempt == 1:
        gates["first started"].set()
        gates["first may end"].wait(limit)
        return "first"
    gates["rerun started"].set()
    gates["first gone"].wait(limit)
    deadline = time.monotonic() + limit
    while not cancel_requested():  # the API is polled; no event says it turned True
        if time.monotonic() > deadline:
            return "not asked"
        time.sleep(0.02)
    raise JobCancelled("asked while the first run's bookkeeping went away")


def supplies_client(func):
    """A decorator that passes the task its first argument itself (a client, a session)."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func("client", *args, **kwargs)
    return wrapper


@zk_task
@supplies_client
def fetch_with_client(client, url):
    return [client, url]


@zk_task
def read_all(file):
    """What a file-like argument holds, read on the worker."""
    file.seek(0)
    return file.read()


class Holder:
    """An object whose attribute is what it was given (an open file, in a test)."""

    def __init__(self, held):
        self.held = held

    def read(self):
        return read_all.func(self.held)


@zk_task
def returns_an_open_file(path):
    return Holder(open(path))  # noqa: SIM115 - the point: a file the caller cannot use


@zk_task
def returns_bytes(size):
    return b"x" * size


@zk_task
def echo(value):
    return value


@zk_task(timeout=30 * 86400)
def weeks_allowed(value):
    """A time limit of 30 days: over 2**31 ms, which poll() cannot wait in one go."""
    return value


def _reaped_within(pid: int, seconds: float):
    """The exit status of child `pid`, waited for on its pidfd (readable once it has
    exited) for at most `seconds`; a child still running then is killed."""
    import select

    pidfd = os.pidfd_open(pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], seconds)
    finally:
        os.close(pidfd)
    if not exited:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "the forked child never ended"
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@zk_task
def forks_a_child_that_exits():
    """Forks; the child ends with sys.exit() (not os._exit()), as code written for a
    script would. The parent reaps it and returns the child's exit status."""
    import sys

    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # into zktasks' own code: it must not go on as a task process
    return _reaped_within(pid, 30)


@zk_task
def dies_leaving_a_child(marker_dir):
    """Starts a forked child that outlives it, then dies: the child holds the task
    process's pipe open."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))
    child.start()
    Path(marker_dir, "child").write_text(str(child.pid))
    os._exit(3)


@zk_task
def ignores_alarms():
    import signal

    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    return "alarms ignored"


@zk_task(timeout=1)
def sleeps_past_its_limit(seconds):
    time.sleep(seconds)


@zk_task
async def forks_in_a_coroutine():
    """As forks_a_child_that_exits, from a coroutine: it runs in asgiref's loop thread,
    the only thread the child has."""
    import asyncio
    import sys

    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    return await asyncio.to_thread(_reaped_within, pid, 30)


def _backoff_that_exits(attempt, exc):
    raise SystemExit(3)


@zk_task(max_attempts=3, backoff=_backoff_that_exits)
def fails_with_a_backoff_that_exits():
    raise ValueError("the task's own failure")


def _loaded_here(marker_dir, spare_pid):
    """Rebuilds a CrashesWhoeverLoadsIt: notes the process that unpickled it, then, in
    any process but `spare_pid` (the test's own, where start_worker runs the worker),
    ends that process as a crash while unpickling would (an extension built for
    another ABI segfaults)."""
    import threading

    with open(Path(marker_dir, "loaded"), "a") as notes:
        notes.write(f"{os.getpid()} {threading.current_thread().name}\n")
    if os.getpid() != spare_pid:
        os._exit(70)
    raise RuntimeError("unpickled in the worker's own process")


class CrashesWhoeverLoadsIt:
    def __init__(self, marker_dir, spare_pid):
        self.marker_dir, self.spare_pid = marker_dir, spare_pid

    def __reduce__(self):
        return _loaded_here, (self.marker_dir, self.spare_pid)


@zk_task(max_attempts=2, backoff=lambda attempt, exc: 0)
def takes_anything(value, label="plain"):
    return label


@zk_task
def returns_what_crashes_its_reader(marker_dir, spare_pid):
    return CrashesWhoeverLoadsIt(marker_dir, spare_pid)


@zk_task
def changes_its_process(directory):
    """Change what a process keeps between jobs (its working directory, umask and
    environment), and report what this job found: the pid, so that a test can tell
    that the jobs shared a task process."""
    found = process_view()
    os.chdir(directory)
    os.umask(0o077)
    os.environ["ZKTASKS_TEST_LEFTOVER"] = "set by an earlier job"
    return found


@zk_task
def reports_its_process():
    return process_view()


def process_view() -> dict:
    mask = os.umask(0)
    os.umask(mask)
    return {"pid": os.getpid(), "cwd": os.getcwd(), "umask": mask,
            "environment": os.environ.get("ZKTASKS_TEST_LEFTOVER")}


@zk_task
def terminates_what_it_started():
    """Start a program and a forked process, terminate() both, and say how each ended:
    -15 for SIGTERM, "ignored" if it still ran 10 s later."""
    import multiprocessing
    import subprocess

    program = subprocess.Popen(["sleep", "60"])
    program.terminate()
    try:
        ended = program.wait(timeout=10)
    except subprocess.TimeoutExpired:
        program.kill()
        program.wait()
        ended = "ignored"
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    forked.start()
    forked.terminate()
    forked.join(10)
    if forked.is_alive():
        forked.kill()
        forked.join()
        return [ended, "ignored"]
    return [ended, forked.exitcode]


@zk_task(takes_context=True)
def quick_unless_armed(context, directory):
    """Returns at once, except on a first attempt while `directory/armed` exists: then it
    notes `directory/began` and waits (up to a minute) for `directory/release`. Quick
    runs first make it a short task to the worker; the armed run is then one the worker
    began without its RUNNING write."""
    path = Path(directory)
    if context.attempt > 1 or not (path / "armed").exists():
        return context.attempt
    (path / "began").touch()
    deadline = time.monotonic() + 60
    while not (path / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return context.attempt


@zk_task
def kills_its_worker_when_armed(directory):
    """Returns at once, unless `directory/armed` exists: then it removes that file, notes
    `directory/killed` and SIGKILLs its own process (the worker itself, on the thread
    pool) mid-run."""
    import signal

    try:
        Path(directory, "armed").unlink()
    except FileNotFoundError:
        return "ok"
    Path(directory, "killed").touch()
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"
