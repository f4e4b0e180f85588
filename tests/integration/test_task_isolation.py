"""Tasks that misbehave in their own process: each job keeps its own outcome, and the
worker keeps going. (Raising, hanging past a limit and crashing are in test_faults.py.)"""

import contextlib
import os
import signal

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.waiting import wait_until


def test_a_time_limit_of_weeks_lets_its_job_run_once(zk_settings, start_worker):
    """A `timeout` over 2**31 ms (about 25 days): poll() raised OverflowError while the
    task ran, its slot was given back and the job forgotten, so the worker found it
    again at its next listing (every 30 s) and ran it again, for ever, taking the slot
    from every other job. The outcome is waited for in slices of a day now."""
    import sys

    start_worker(pool="process", concurrency=1)
    result = tasks.weeks_allowed.submit("done").wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "done"
    assert result.attempts == 1
    # sys.maxsize, "no limit": setitimer raised OverflowError in the task process, which
    # died, and the job failed with TaskProcessDied at every attempt.
    endless = tasks.weeks_allowed.using(timeout=sys.maxsize).submit("endless")
    assert endless.wait(timeout=60).return_value == "endless"
    assert tasks.add.submit(1, 2).wait(timeout=30).return_value == 3


@pytest.mark.parametrize("pool", ["process", "thread"])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")
def test_a_forked_child_that_returns_into_zktasks_exits(zk_settings, start_worker, pool):
    """The child ends with sys.exit(), caught by zktasks as a task's failure. It then
    went on as a second task process on the same pipe: it reported the job for its
    parent (FAILED, SystemExit) and took the next job, so the worker recorded the
    parent's return value as the next job's. In the thread pool it was a copy of the
    worker, stuck for good in a ZooKeeper call. It exits there now, with the status
    its sys.exit() gave."""
    start_worker(pool=pool, concurrency=1)
    result = tasks.forks_a_child_that_exits.submit().wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 0
    # From a coroutine (asgiref's loop thread) it lived on, blocked, for good.
    result = tasks.forks_in_a_coroutine.submit().wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 0
    assert [tasks.add.submit(i, 100).wait(timeout=30).return_value
            for i in range(3)] == [100, 101, 102]


def test_a_task_process_that_dies_is_noticed_while_a_child_it_forked_lives(
        zk_settings, start_worker, tmp_path):
    """The child holds the task process's pipe open: waiting for the pipe's end alone,
    the death went unseen for as long as the child lived (here two minutes), and the
    job stayed RUNNING with its slot taken. The process's own sentinel is waited on."""
    start_worker(pool="process", concurrency=1)
    try:
        result = tasks.dies_leaving_a_child.submit(str(tmp_path)).wait(timeout=60)
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[-1].exception_class_path == \
            "zktasks.exceptions.TaskProcessDied"
        assert "exit code 3" in result.errors[-1].traceback
        assert tasks.add.submit(1, 2).wait(timeout=30).return_value == 3
    finally:
        child = tmp_path / "child"
        if child.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child.read_text()), signal.SIGKILL)


def test_a_task_that_turns_alarms_off_does_not_turn_off_the_next_ones_limit(
        zk_settings, start_worker):
    """The soft limit's SIGALRM handler was set once per task process: after a task
    ignored SIGALRM, a later job in the same process ran on to the hard limit and was
    killed, with no chance to clean up."""
    start_worker(pool="process", concurrency=1)
    assert tasks.ignores_alarms.submit().wait(timeout=30).return_value == "alarms ignored"
    result = tasks.sleeps_past_its_limit.submit(10).wait(timeout=30)
    assert result.status == TaskResultStatus.FAILED
    assert "soft limit: cleaning up" in result.errors[-1].traceback


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_backoff_that_raises_system_exit_means_no_retry(zk_settings, start_worker, pool):
    """retry_delay caught Exception only: the runner thread that asked ended, the job
    stayed RUNNING and, at concurrency 1, the worker ran nothing more (the process pool
    too: the worker asks the backoff itself when the task process died)."""
    start_worker(pool=pool, concurrency=1)
    result = tasks.fails_with_a_backoff_that_exits.submit().wait(timeout=60)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert tasks.add.submit(1, 2).wait(timeout=30).return_value == 3


@pytest.fixture
def signalled():
    """Results sent with task_started and task_finished, by a receiver other than
    Django's own (so the worker builds them)."""
    from django.tasks.signals import task_finished, task_started

    seen = {"started": [], "finished": []}

    def started(sender, task_result, **kwargs):
        seen["started"].append(task_result)

    def finished(sender, task_result, **kwargs):
        seen["finished"].append(task_result)

    task_started.connect(started, weak=False)
    task_finished.connect(finished, weak=False)
    yield seen
    task_started.disconnect(started)
    task_finished.disconnect(finished)


def test_the_worker_process_never_unpickles_a_job_s_arguments(
        zk_settings, start_worker, signalled, tmp_path):
    """An argument whose unpickling crashes its process costs task processes only. The
    worker unpickled the whole call to ask its retry policy after the task process died
    (and again to build the results its signals carry): the crash took the worker down
    with every job it held, and then the next worker the job went to. The policy now
    travels apart from the arguments, and signals get the arguments that are plain
    data, with stand-ins for the rest."""
    from zktasks.serialization import Unloaded

    start_worker(pool="process", concurrency=1)
    bomb = tasks.CrashesWhoeverLoadsIt(str(tmp_path), os.getpid())
    result = tasks.takes_anything.submit(bomb, label="bomb").wait(timeout=60)
    loads = [line.split(" ", 1) for line in (tmp_path / "loaded").read_text().splitlines()]
    # The worker runs in this process, on threads of its own; wait() loads the result
    # here too, on this thread (a web process reading its job: not the worker's).
    here = [thread for pid, thread in loads if int(pid) == os.getpid()]
    assert here == ["MainThread"]
    # One task process per attempt, each died loading it.
    assert len({pid for pid, _ in loads if int(pid) != os.getpid()}) == 2
    # Its retry policy was asked all the same: a second attempt, then the end.
    assert result.status == TaskResultStatus.FAILED and result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [
        "zktasks.exceptions.TaskProcessDied"] * 2
    wait_until(lambda: signalled["finished"], 30, "task_finished")
    started = [r for r in signalled["started"] if r.id == result.id]
    assert len(started) == 2
    for sent in started:
        [stand_in] = sent.args
        assert isinstance(stand_in, Unloaded) and stand_in.path == "tests.tasks._loaded_here"
        assert sent.kwargs == {"label": "bomb"}  # plain data comes as it is
    [finished] = signalled["finished"]
    assert finished.id == result.id and finished.status == TaskResultStatus.FAILED
    # The worker goes on, and a job of plain data reaches the receivers whole.
    plain = tasks.takes_anything.submit({"n": [1, 2]}, label="plain").wait(timeout=30)
    assert plain.return_value == "plain"
    wait_until(lambda: len(signalled["finished"]) == 2, 30, "the second task_finished")
    assert signalled["finished"][1].args == [{"n": [1, 2]}]
    assert signalled["finished"][1].return_value == "plain"


def test_the_worker_process_never_unpickles_a_job_s_return_value(
        zk_settings, start_worker, signalled, tmp_path):
    """task_finished's result carried the return value, loaded in the worker process:
    a value that crashes as it loads took the worker down after the job had run."""
    from zktasks.serialization import Unloaded

    start_worker(pool="process", concurrency=1)
    job = tasks.returns_what_crashes_its_reader.submit(str(tmp_path), os.getpid())
    wait_until(lambda: signalled["finished"], 30, "task_finished")
    [finished] = signalled["finished"]
    assert finished.id == job.id and finished.status == TaskResultStatus.SUCCESSFUL
    assert isinstance(finished.return_value, Unloaded)
    assert finished.return_value.path == "tests.tasks._loaded_here"
    assert not (tmp_path / "loaded").exists()  # nobody unpickled it


def test_a_job_s_working_directory_and_umask_do_not_reach_the_next_job(
        zk_settings, start_worker, tmp_path):
    """A task process runs job after job: one that called os.chdir() or os.umask()
    changed them for every later job of that process, which then wrote its files
    elsewhere, with other modes. The environment is left as the job left it: what a
    task module sets there when the first job imports it must stay."""
    start_worker(pool="process", concurrency=1)
    before = tasks.changes_its_process.submit(str(tmp_path)).wait(timeout=60)
    assert before.status == TaskResultStatus.SUCCESSFUL, before.errors
    after = tasks.reports_its_process.submit().wait(timeout=60).return_value
    found = before.return_value
    assert after["pid"] == found["pid"]  # the same task process ran both
    assert (after["cwd"], after["umask"]) == (found["cwd"], found["umask"])
    assert after["cwd"] != str(tmp_path) and after["umask"] != 0o077
    assert after["environment"] == "set by an earlier job"
