"""Task processes forked from one fork server that set Django up once
(zktasks/forkserver.py), with real processes (no ZooKeeper involved): they share its
pages, a replacement is a fork, and the server lives and dies with the worker."""

import os
import signal

import pytest

from tests import tasks
from tests.processes import process_running
from tests.unit.test_task_process_batches import execution, value
from tests.waiting import wait_until
from zktasks import executor
from zktasks.exceptions import TaskProcessDied
from zktasks.executor import ProcessRunner


@pytest.fixture
def runner():
    runner = ProcessRunner(2)
    runner.start()
    assert runner.wait_ready()
    yield runner
    runner.stop()


def test_the_fork_server_is_the_default():
    """Not a skip condition: a default that fell back to spawning would otherwise pass
    every test here unseen (zktasks runs on Linux, which has a fork server)."""
    assert ProcessRunner(1).start_method == "forkserver"


def test_task_processes_are_forks_of_one_server_that_set_django_up(runner):
    first, second = (value(runner.run(execution(tasks.origin))) for _ in range(2))
    assert first["pid"] != second["pid"]  # one per slot
    server = executor.fork_server_pid()
    assert first["ppid"] == second["ppid"] == server != os.getpid()
    assert first["preloaded"] and second["preloaded"]
    assert runner.forked  # the worker logs it: "setup=shared"
    # The server's objects are frozen, so a fork's collections never write into (and
    # copy) the pages it shares; its own collector runs.
    assert first["frozen"] > 10_000 and first["collecting"]


def test_a_replacement_is_a_fork_of_the_same_server(runner):
    before = [value(runner.run(execution(tasks.origin))) for _ in range(2)]  # both slots
    assert not runner.run(execution(tasks.exit_hard, 3)).ok  # a task kills its process
    after = [value(runner.run(execution(tasks.origin))) for _ in range(2)]
    old_pids = {o["pid"] for o in before}
    new = [o for o in after if o["pid"] not in old_pids]
    assert len(new) == 1  # the replacement (the other slot kept its process)
    assert new[0]["ppid"] == before[0]["ppid"] and new[0]["preloaded"]


def test_the_server_ignores_the_signals_of_the_process_group(runner):
    """systemd's control-group stop, Ctrl-C and a closed terminal signal every process
    of the group, the fork server too. Its death would kill every task process (their
    parent-death signal) mid-job, while the worker drains."""
    server = executor.fork_server_pid()
    pids = {value(runner.run(execution(tasks.pid))) for _ in range(2)}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(server, signum)
    assert not runner.run(execution(tasks.exit_hard, 3)).ok  # the next needs a fork
    after = [value(runner.run(execution(tasks.origin))) for _ in range(2)]
    assert all(o["ppid"] == server for o in after)
    assert process_running(server)
    assert sum(process_running(pid) for pid in pids) == 1  # the other one lived


def test_a_server_stuck_setting_django_up_stops_the_worker_with_the_reason(monkeypatch):
    """An app's ready() that blocks: the worker stops after READY_TIMEOUT with what to do
    (not hang in starting the first task process), and kills the server."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_settings")
    monkeypatch.setenv("SLOW_SETUP_SECONDS", "60")
    monkeypatch.setattr(executor, "READY_TIMEOUT", 1.0)
    runner = ProcessRunner(2)
    runner.start()
    server = executor.fork_server_pid()
    with pytest.raises(TaskProcessDied, match=r"did not set up Django within 1s.*--pool thread"):
        runner.wait_ready()
    wait_until(lambda: not process_running(server), 10, "the stuck fork server to be killed")
    assert all(slot.process is None for slot in runner.slots)


def test_a_runner_started_under_another_environment_gets_a_new_server(monkeypatch):
    """As a spawned task process would: the environment (so the settings) of when the
    runner starts. An in-process worker of a test whose settings point elsewhere than
    the last one's (its ZooKeeper root) ran tasks under the old settings."""
    values = []
    for value_now in ("first", "second"):
        monkeypatch.setenv("ZKTASKS_TEST_MARK", value_now)
        runner = ProcessRunner(1)
        runner.start()
        try:
            values.append(value(runner.run(execution(tasks.environ, "ZKTASKS_TEST_MARK"))))
        finally:
            runner.stop()
    assert values == ["first", "second"]


def test_the_server_is_not_stopped_under_a_live_runner(monkeypatch):
    """Stopping it would kill that runner's task processes (their parent-death signal)."""
    monkeypatch.setenv("ZKTASKS_TEST_MARK", "first")
    live = ProcessRunner(1)
    live.start()
    try:
        pid = value(live.run(execution(tasks.pid)))
        monkeypatch.setenv("ZKTASKS_TEST_MARK", "second")
        later = ProcessRunner(1)
        later.start()
        try:
            # The server of "first" still serves: the later runner's task process too.
            assert value(later.run(execution(tasks.environ, "ZKTASKS_TEST_MARK"))) == "first"
        finally:
            later.stop()
        assert value(live.run(execution(tasks.pid))) == pid  # never killed
    finally:
        live.stop()


def test_the_projects_own_preload_modules_are_kept(monkeypatch):
    """A project that names modules for the fork server to preload
    (multiprocessing.set_forkserver_preload) keeps them: the worker's preload used to
    replace the list. Its own module comes first, as it sets Django up."""
    import multiprocessing
    from multiprocessing import forkserver as mp_forkserver

    monkeypatch.setattr(mp_forkserver._forkserver, "_preload_modules",
                        list(mp_forkserver._forkserver._preload_modules))  # undone after
    multiprocessing.set_forkserver_preload(["tests.preloaded_marker"])
    runner = ProcessRunner(1)
    runner.start()
    try:
        assert value(runner.run(execution(tasks.imported, "tests.preloaded_marker")))
        assert value(runner.run(execution(tasks.origin)))["preloaded"]
    finally:
        runner.stop()
    assert mp_forkserver._forkserver._preload_modules == [
        executor.PRELOAD_MODULE, "tests.preloaded_marker"]


def test_the_backend_module_is_imported_before_the_first_job(runner):
    """A task module's @zk_task imports zktasks.backend (kazoo, the Store) as it looks its
    backend up; the fork server imports it once, so a task process's first job does not.
    Imported, not connected: the task process has no ZooKeeper client of its own yet."""
    from types import SimpleNamespace

    from tests import bare_functions

    bare = SimpleNamespace(func=bare_functions.imported,
                           module_path="tests.bare_functions.imported")
    assert value(runner.run(execution(bare, "zktasks.backend")))
    assert value(runner.run(execution(bare, "kazoo.client")))
    assert not value(runner.run(execution(bare, "tests.tasks")))  # not the task modules
