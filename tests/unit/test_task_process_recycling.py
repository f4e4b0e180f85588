"""--max-tasks-per-child and --max-memory-per-child: ProcessRunner replaces a task process
between jobs, with real task processes (no ZooKeeper involved)."""

import contextlib
import logging
import os

import pytest

from tests import tasks
from tests.processes import process_running
from tests.unit.test_task_process_batches import execution, runs, value
from tests.waiting import wait_until
from zktasks import executor
from zktasks.executor import ProcessRunner


@pytest.fixture
def make_runner():
    started = []

    def make(**options):
        runner = ProcessRunner(1, **options)
        runner.start()
        started.append(runner)
        return runner

    yield make
    for runner in started:
        runner.stop()


def test_a_task_process_is_replaced_after_max_tasks_jobs(make_runner, caplog):
    caplog.set_level(logging.INFO, logger="zktasks.executor")
    runner = make_runner(max_tasks=2)
    pids = [value(runner.run(execution(tasks.pid))) for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert len(set(pids)) == 3
    replaced = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert len(replaced) == 2 and "ran 2 job(s) (--max-tasks-per-child 2)" in replaced[0]
    # The processes it replaced exited (and were reaped), none was left behind.
    wait_until(lambda: not any(process_running(pid) for pid in pids[:4]), 60, "replaced to exit")


def test_a_batch_is_split_where_the_process_reaches_its_limit(make_runner, tmp_path):
    runner = make_runner(max_tasks=2)
    first = value(runner.run(execution(tasks.pid)))  # one left for this process
    outcomes = list(runner.run_many([execution(tasks.mark, str(tmp_path), n)
                                     for n in range(1, 6)]))
    assert [value(o) for o in outcomes] == [1, 2, 3, 4, 5]
    by_number = {n: pids[0] for n, pids in runs(tmp_path).items()}
    assert sorted(by_number) == [1, 2, 3, 4, 5]  # each ran once
    assert by_number[1] == first
    assert by_number[2] == by_number[3] != by_number[1]
    assert by_number[4] == by_number[5] != by_number[3]


def test_a_task_process_over_max_memory_is_replaced_after_its_job(make_runner, caplog):
    caplog.set_level(logging.INFO, logger="zktasks.executor")
    runner = make_runner(max_memory_kb=1)  # any process is over 1 KB
    pids = [value(runner.run(execution(tasks.pid))) for _ in range(3)]
    assert len(set(pids)) == 3  # each job completed, then its process was replaced
    assert any("resident memory" in r.getMessage() and "--max-memory-per-child 1)"
               in r.getMessage() for r in caplog.records)


def test_memory_under_the_limit_keeps_the_process(make_runner):
    runner = make_runner(max_memory_kb=50 * 1024 * 1024)  # 50 GB
    pids = {value(runner.run(execution(tasks.pid))) for _ in range(3)}
    assert len(pids) == 1


def test_a_replaced_process_held_up_by_a_thread_is_killed(make_runner, monkeypatch, caplog):
    monkeypatch.setattr(executor, "RETIRE_GRACE", 0.5)
    runner = make_runner(max_tasks=1)
    stuck = value(runner.run(execution(tasks.leaves_a_thread)))
    # The runner did not wait for it: the next job runs in a fresh process at once.
    assert value(runner.run(execution(tasks.pid))) not in (stuck, os.getpid())
    wait_until(lambda: not process_running(stuck), 60, "the stuck process to be killed")
    assert any("did not exit" in r.getMessage() for r in caplog.records)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")
def test_a_replaced_process_held_up_by_a_child_process_says_so(make_runner, monkeypatch,
                                                                caplog, tmp_path):
    """The warning blamed a thread when the process was waiting for a multiprocessing
    child its task started; it names the child now."""
    import signal

    monkeypatch.setattr(executor, "RETIRE_GRACE", 0.5)
    runner = make_runner(max_tasks=1)
    try:
        stuck = value(runner.run(execution(tasks.leaves_a_child_process, str(tmp_path))))
        child = int((tmp_path / "child").read_text())
        runner.run(execution(tasks.pid))
        wait_until(lambda: not process_running(stuck), 60, "the stuck process to be killed")
        [warning] = [r.getMessage() for r in caplog.records if "did not exit" in r.getMessage()]
        assert f"it waits for 1 process(es) it started, pid {child}," in warning
    finally:
        if (tmp_path / "child").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "child").read_text()), signal.SIGKILL)


def test_threads_have_no_process_to_replace():
    with pytest.raises(ValueError, match="--pool process"):
        executor.make_runner("thread", 4, max_tasks=10)


def test_a_group_signal_while_a_task_process_boots_costs_no_job(make_runner, monkeypatch):
    """systemd's control-group stop and Ctrl-C signal every process of the group. A task
    process ignores them once set up; one still booting (just replaced) died of them,
    and the job handed to it next failed with TaskProcessDied though it never ran.
    Spawned task processes (where there is no fork server), which boot for seconds; a
    fork of the fork server is set up already, and the server ignores these signals
    itself (test_fork_server.py)."""
    import signal

    # The replacement takes 5 s to set up Django: the signals below surely reach it while
    # it boots, not once it is set up (and ignores them anyway).
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_settings")
    monkeypatch.setenv("SLOW_SETUP_SECONDS", "0")
    runner = make_runner(max_tasks=1, start_method="spawn")
    monkeypatch.setenv("SLOW_SETUP_SECONDS", "5")  # read by the processes started from now
    first = value(runner.run(execution(tasks.pid)))  # replaced at once: the next boots
    booting = runner.slots[0].process
    assert booting.pid != first
    os.kill(booting.pid, signal.SIGTERM)
    os.kill(booting.pid, signal.SIGINT)
    os.kill(booting.pid, signal.SIGHUP)
    assert value(runner.run(execution(tasks.pid))) == booting.pid


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_task_process_that_dies_is_seen_while_a_child_it_forked_lives(
        make_runner, start_method, tmp_path):
    """The child (multiprocessing's "fork") holds the task process's pipe open, and with
    spawn its sentinel too: the death went unseen until the child ended (two minutes
    here), the job RUNNING and its slot taken all along."""
    import signal
    import time

    runner = make_runner(start_method=start_method)
    try:
        began = time.monotonic()
        outcome = runner.run(execution(tasks.dies_leaving_a_child, str(tmp_path)))
        assert outcome.error.exception_class_path == "zktasks.exceptions.TaskProcessDied"
        assert "exit code 3" in outcome.error.message
        assert time.monotonic() - began < 60  # the child lives 120 s
        assert value(runner.run(execution(tasks.add, 1, 2))) == 3
    finally:
        child = tmp_path / "child"
        if child.exists():
            try:
                os.kill(int(child.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
