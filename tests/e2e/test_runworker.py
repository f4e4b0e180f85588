"""Real `manage.py runworker` processes, real signals, a real ZooKeeper."""

import os
import re
import signal

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.processes import process_running
from tests.waiting import wait_for_children, wait_for_data, wait_until

pytestmark = pytest.mark.e2e


def wait_registered(zk_client, backend, count, timeout=60):
    return wait_for_children(zk_client, backend.store.layout.workers,
                             lambda c: len(c) >= count, timeout)


def worker_proc(procs, worker_id):
    return next(p for name, p in procs.items() if worker_id.startswith(name + "-"))


def running_until_released(backend, runworker, zk_client, tmp_path, value, *args, name,
                           **start):
    """A runworker (concurrency 1) running a job that returns `value` once released."""
    proc = runworker("--concurrency", "1", *args, name=name, **start)
    wait_registered(zk_client, backend, 1)
    release = tmp_path / "release"
    job = tasks.wait_for_file.submit(str(release), value)
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda d: d["state"] == "RUNNING")
    return proc, job, release


def test_job_of_a_sigkilled_worker_completes_elsewhere(backend, runworker, zk_client, tmp_path):
    procs = {name: runworker("--concurrency", "1", name=name) for name in ("alpha", "beta")}
    wait_registered(zk_client, backend, 2)
    release = tmp_path / "release"
    job = tasks.wait_for_file.submit(str(release), "done")
    record = wait_for_data(zk_client, backend.store.layout.status(job.id),
                           lambda d: d["state"] == "RUNNING")
    victim_id = record["worker_ids"][-1]
    victim = worker_proc(procs, victim_id)
    victim.send_signal(signal.SIGKILL)
    victim.wait(60)
    # Its session times out; the leader (the other worker, or a new one) hands the job
    # back and the survivor runs it again.
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda d: d["state"] == "RUNNING" and d["worker_ids"][-1] != victim_id)
    release.touch()
    result = job.wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "done"
    assert result.worker_ids[0] == victim_id and len(result.worker_ids) == 2
    assert result.errors[0].exception_class_path == "zktasks.exceptions.WorkerLost"


def test_a_job_begun_unrecorded_by_a_sigkilled_worker_counts_its_attempt(
        backend, runworker, zk_client, tmp_path):
    """A short job its worker held alone runs without a RUNNING record; its task kills
    that worker (SIGKILL, thread pool) mid-run. The next leader counts the attempt, so
    the rerun is attempt 2 and the loss is in the job's errors, as for a recorded run."""
    victim = runworker("--pool", "thread", "--concurrency", "1", name="victim")
    wait_registered(zk_client, backend, 1)
    victim_id = zk_client.get_children(backend.store.layout.workers)[0]
    directory = str(tmp_path)
    for _ in range(30):  # until the worker takes the task for a short one
        quick = tasks.kills_its_worker_when_armed.submit(directory)
        assert quick.wait(timeout=60).return_value == "ok"
        # Logged once the worker has let go of the job (its outcome written): the next
        # job is then the worker's one assignment.
        wait_until(lambda q=quick: f"job succeeded job={q.id}" in victim.log_path.read_text(), 60,
                   "the victim to log the job's outcome")
        if re.search(f"job started job={quick.id} .* start=unwritten",
                     victim.log_path.read_text()):
            break
    else:
        pytest.fail("the victim never ran the quick task without its RUNNING write")
    (tmp_path / "armed").touch()
    job = tasks.kills_its_worker_when_armed.submit(directory)
    assert victim.wait(60) == -signal.SIGKILL
    assert (tmp_path / "killed").exists()
    # Most often the run left no record (READY, attempt 0); had it lasted past
    # committer.LATE_START, its RUNNING was written after all. Counted either way (the
    # unrecorded case alone: tests/integration/test_unrecorded_starts.py).
    status = backend.store.read_status(job.id).record
    assert (status.state, status.attempts) in (("READY", 0), ("RUNNING", 1))
    runworker("--concurrency", "1", name="survivor")
    result = job.wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "ok"
    assert result.attempts == 2
    assert result.worker_ids[0] == victim_id and len(result.worker_ids) == 2
    assert [e.exception_class_path for e in result.errors] == [
        "zktasks.exceptions.WorkerLost"]


def test_sigkilled_leader_is_replaced(backend, runworker, zk_client):
    procs = {name: runworker("--concurrency", "1", name=name) for name in ("one", "two")}
    wait_registered(zk_client, backend, 2)
    assert tasks.add.submit(1, 2).wait(timeout=60).return_value == 3
    layout = backend.store.layout
    contenders = sorted(zk_client.get_children(layout.leader), key=lambda n: n[-10:])
    leader_id = zk_client.get(f"{layout.leader}/{contenders[0]}")[0].decode()
    worker_proc(procs, leader_id).send_signal(signal.SIGKILL)
    # The new leader is the other worker: a job submitted now completes there.
    result = tasks.add.submit(3, 4).wait(timeout=60)
    assert result.return_value == 7
    assert not result.worker_ids[0].startswith(leader_id.rsplit("-", 1)[0])


def test_sigterm_drains_running_job_then_exits_cleanly(backend, runworker, zk_client, tmp_path):
    proc, job, release = running_until_released(
        backend, runworker, zk_client, tmp_path, "finished", name="drainer")
    proc.send_signal(signal.SIGTERM)
    [worker_id] = zk_client.get_children(backend.store.layout.workers)
    wait_for_data(zk_client, backend.store.layout.worker(worker_id), lambda d: d["draining"])
    release.touch()
    assert job.wait(timeout=60).return_value == "finished"
    assert proc.wait(30) == 0
    assert zk_client.get_children(backend.store.layout.workers) == []
    assert zk_client.get_children(backend.store.layout.assignments) == []
    log = proc.log_path.read_text()
    assert "draining" in log and "worker stopped" in log
    # --concurrency 1 and no --prefetch: 4 per runner, following the jobs from there.
    assert "prefetch=4 (follows the jobs)" in log
    # Registered once its task process could run jobs, not before.
    assert log.index("task processes ready count=1") < log.index("worker registered")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_whole_process_group_still_drains(backend, runworker, zk_client,
                                                          tmp_path, signum):
    """systemd's default KillMode=control-group, supervisord's stopasgroup and
    `kill -TERM -PGID` signal the task processes too, and a closed terminal sends SIGHUP
    to them all. They leave stopping to the worker (it kills them with SIGKILL when it
    must), or the running job dies with them."""
    if signum == signal.SIGHUP and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        # The suite itself runs under nohup: the worker inherits SIGHUP ignored and keeps
        # it so, on purpose (test_sighup_is_left_ignored_when_it_was_nohup).
        pytest.skip("SIGHUP is ignored in this test run (nohup); the worker inherits that")
    proc, job, release = running_until_released(
        backend, runworker, zk_client, tmp_path, "finished", name="grouped", own_group=True)
    os.killpg(proc.pid, signum)
    [worker_id] = zk_client.get_children(backend.store.layout.workers)
    wait_for_data(zk_client, backend.store.layout.worker(worker_id), lambda d: d["draining"])
    release.touch()
    result = job.wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "finished" and result.attempts == 1
    assert proc.wait(30) == 0
    assert f"{signal.Signals(signum).name}: draining" in proc.log_path.read_text()


def test_sighup_is_left_ignored_when_it_was_nohup():
    """Under nohup (SIGHUP ignored) logging out must not drain the worker."""
    from zktasks.management.commands.runworker import Command

    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        Command()._install_signals(worker=None)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        Command()._install_signals(worker=None)
        assert callable(signal.getsignal(signal.SIGHUP))
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_runworker_whose_task_processes_cannot_set_up_stops_and_says_why(
        backend, runworker, zk_client):
    proc = runworker("--concurrency", "2", "--pool", "process", name="broken",
                     settings="tests.broken_task_process_settings")
    assert proc.wait(60) == 1
    log = proc.log_path.read_text()
    assert "cannot be imported in a task process (on purpose)" in log  # its traceback
    assert "exited with exit code 1 while it set up Django" in log
    assert "--pool thread" in log
    assert "worker registered" not in log  # never offered itself for jobs


def test_sigterm_while_connecting_stops_at_once(runworker, zk_settings):
    """kazoo's start() waits out CONNECT_TIMEOUT; a signal must not have to."""
    from tests.waiting import wait_until

    proc = runworker(name="unconnected", env={"ZKTASKS_TEST_HOSTS": "127.0.0.1:9",
                                              "PYTHONUNBUFFERED": "1"})
    wait_until(lambda: "zktasks worker starting" in proc.log_path.read_text(), 30,
               "the worker to start connecting")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = proc.log_path.read_text()
    assert "stopped while connecting to ZooKeeper; never registered" in log
    assert "Could not connect" not in log  # it did not wait for the timeout


def test_a_worker_started_before_zookeeper_waits_for_it(runworker, settings, monkeypatch,
                                                         zk_root):
    """It exited after CONNECT_TIMEOUT, so a worker started with (or before) its
    ensemble needed a restart policy to come back. It now says why and tries again."""
    from tests.conftest import use_zookeeper
    from tests.waiting import wait_until
    from zktasks.testing import ZooKeeperServer, free_port

    port = free_port()
    # The worker's attempts give up after 1 s (ZKTASKS_TEST_CONNECT_TIMEOUT), so that it
    # soon says it tries again; this process keeps the generous default for its submit to
    # the server started below.
    use_zookeeper(settings, monkeypatch, f"127.0.0.1:{port}", zk_root)
    proc = runworker("--pool", "thread", name="early",
                     env={"PYTHONUNBUFFERED": "1", "ZKTASKS_TEST_CONNECT_TIMEOUT": "1"})
    wait_until(lambda: "Trying again (attempt 3" in proc.log_path.read_text(), 60,
               "the worker to say it keeps trying")
    assert "Could not connect to ZooKeeper" in proc.log_path.read_text()
    server = ZooKeeperServer(client_port=port).start()
    try:
        wait_until(lambda: "worker registered" in proc.log_path.read_text(), 60,
                   "the worker to register once ZooKeeper is up")
        assert tasks.add.submit(2, 3).wait(timeout=60).return_value == 5
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
        server.close()


def test_startup_timeout_gives_up(runworker, settings, monkeypatch, zk_root):
    from tests.conftest import use_zookeeper
    from zktasks.testing import free_port

    use_zookeeper(settings, monkeypatch, f"127.0.0.1:{free_port()}", zk_root)
    proc = runworker("--pool", "thread", "--startup-timeout", "2", name="late",
                     env={"ZKTASKS_TEST_CONNECT_TIMEOUT": "1"})
    assert proc.wait(60) == 1
    log = proc.log_path.read_text()
    assert "Trying again (attempt 2" in log and "of --startup-timeout 2" in log
    assert "Could not connect to ZooKeeper" in log.strip().splitlines()[-1]  # its exit


def test_process_pool_contains_crashes_and_timeouts(backend, runworker, zk_client):
    runworker("--concurrency", "1", "--pool", "process", name="pool")
    wait_registered(zk_client, backend, 1)
    crashed = tasks.exit_hard.submit(3)
    hung = tasks.hang.submit()
    fine = tasks.add.submit(2, 2)
    crashed.wait(timeout=60)
    assert crashed.status == TaskResultStatus.FAILED
    assert crashed.errors[-1].exception_class_path == "zktasks.exceptions.TaskProcessDied"
    assert "exit code 3" in crashed.errors[-1].traceback
    hung.wait(timeout=60)
    assert hung.errors[-1].exception_class_path == "zktasks.exceptions.TaskTimeout"
    assert fine.wait(timeout=60).return_value == 4  # the worker went on


def test_max_tasks_per_child_runs_each_job_in_a_fresh_task_process(backend, runworker,
                                                                    zk_client):
    proc = runworker("--concurrency", "1", "--max-tasks-per-child", "1", name="recycle")
    wait_registered(zk_client, backend, 1)
    jobs = [tasks.pid.submit() for _ in range(3)]
    pids = [job.wait(timeout=60).return_value for job in jobs]
    assert len(set(pids)) == 3 and proc.pid not in pids
    assert "task process replaced" in proc.log_path.read_text()


def test_runworker_rejects_bad_options(runworker, zk_settings):
    proc = runworker("--concurrency", "0")
    assert proc.wait(30) != 0
    assert "must be at least 1" in proc.log_path.read_text()


def test_a_drain_that_times_out_exits_non_zero_and_hands_the_job_back(
        backend, runworker, zk_client, tmp_path):
    first, job, release = running_until_released(
        backend, runworker, zk_client, tmp_path, "second time", "--drain-timeout", "0.5",
        name="first")
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 1
    log = first.log_path.read_text()
    assert "drain timed out" in log
    assert "stopped with 1 job(s) unfinished: the drain timed out after 0.5 s" in log
    runworker("--concurrency", "1", name="second")
    release.touch()
    assert job.wait(timeout=60).return_value == "second time"


def test_second_signal_stops_at_once_and_the_job_runs_again(backend, runworker, zk_client,
                                                             tmp_path):
    first, job, release = running_until_released(
        backend, runworker, zk_client, tmp_path, "second time", name="first")
    first.send_signal(signal.SIGTERM)
    [worker_id] = zk_client.get_children(backend.store.layout.workers)
    wait_for_data(zk_client, backend.store.layout.worker(worker_id), lambda d: d["draining"])
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0, first.log_path.read_text()[-3000:]
    record = wait_for_data(zk_client, backend.store.layout.status(job.id), lambda d: True)
    assert record["state"] != "FAILED"  # an operator's stop is not the job's failure
    runworker("--concurrency", "1", name="second")
    release.touch()
    result = job.wait(timeout=60)
    assert result.return_value == "second time"
    assert result.attempts == 2
    assert result.errors[0].exception_class_path == "zktasks.exceptions.WorkerLost"


def test_one_signal_during_a_drain_asked_through_zookeeper_still_drains(
        backend, runworker, zk_client, tmp_path):
    """Drained from the dashboard (or `zktasks drain`), then one SIGTERM (a deploy): it
    stopped at once, abandoning its running job (a WorkerLost), and exited 0."""
    proc, job, release = running_until_released(
        backend, runworker, zk_client, tmp_path, "finished", name="asked")
    [worker_id] = zk_client.get_children(backend.store.layout.workers)
    assert backend.drain_worker(worker_id)
    wait_until(lambda: "worker draining" in proc.log_path.read_text(), 60,
               "the worker to follow the drain request")
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM: draining" in proc.log_path.read_text(), 60,
               "the signal to be taken")
    release.touch()
    result = job.wait(timeout=60)
    assert result.return_value == "finished" and result.attempts == 1
    assert proc.wait(30) == 0
    assert "worker stopping now" not in proc.log_path.read_text()


def test_running_job_is_cancelled_cooperatively(backend, runworker, zk_client, tmp_path):
    runworker("--concurrency", "1", name="coop")
    wait_registered(zk_client, backend, 1)
    marker = tmp_path / "started"
    job = tasks.until_cancelled.submit(str(marker))
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda d: d["state"] == "RUNNING")
    # RUNNING is written before the task process gets the job: wait until it runs, or
    # the cancel can land in between (then it is "cancelled before its task started").
    wait_until(marker.exists, message="the task to start")
    assert job.cancel() is False  # a worker holds it: asked to stop
    job.wait(timeout=30)
    assert job.status == TaskResultStatus.FAILED
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert "stopped on request" in job.errors[-1].traceback
    assert marker.exists()


def test_force_cancel_terminates_the_task_process(backend, runworker, zk_client, tmp_path):
    runworker("--concurrency", "1", name="force")
    wait_registered(zk_client, backend, 1)
    marker = tmp_path / "started"
    job = tasks.ignores_cancel.submit(str(marker))
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda d: d["state"] == "RUNNING")
    wait_until(marker.exists, message="the task to start")  # as in the test above
    job.cancel(force=True)
    job.wait(timeout=30)
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert "terminated" in job.errors[-1].traceback
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2  # the worker goes on


def test_soft_time_limit_lets_the_task_clean_up(backend, runworker, zk_client, tmp_path):
    runworker("--concurrency", "1", name="soft")
    wait_registered(zk_client, backend, 1)
    marker = tmp_path / "cleaned"
    job = tasks.cleans_up_on_timeout.submit(str(marker)).wait(timeout=30)
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.TaskTimeout"
    assert marker.exists()  # the task's own except-block ran


def test_task_process_dies_with_its_worker(backend, runworker, zk_client, tmp_path):
    from tests.waiting import wait_until

    proc = runworker("--concurrency", "1", name="parent")
    wait_registered(zk_client, backend, 1)
    tasks.record_pid_and_wait.submit(str(tmp_path), str(tmp_path / "never"))
    pid_file = tmp_path / "pid"
    wait_until(pid_file.exists, 30, "the task to start")
    task_pid = int(pid_file.read_text())
    with open(f"/proc/{task_pid}/stat") as stat:
        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    assert parent != proc.pid  # the fork server's fork, not the worker's child
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)

    # Dead, or a zombie nobody has reaped yet (it runs nothing any more).
    wait_until(
        lambda: not process_running(task_pid), 60, f"task process {task_pid} to die with its worker"
    )
    wait_until(
        lambda: not process_running(parent), 60, f"the fork server {parent} to exit with its worker"
    )


@pytest.mark.parametrize("args,message", [
    (["--prefetch", "-1"], "must not be negative"),
    (["--queues", "default,,emails"], "empty queue name"),
    (["--backend", "nosuch"], "No task backend 'nosuch'"),
    (["--pool", "thread", "--max-tasks-per-child", "5"], "or use --pool process"),
    (["--max-memory-per-child", "0"], "must be at least 1"),
])
def test_runworker_explains_wrong_options(runworker, zk_settings, args, message):
    proc = runworker(*args)
    assert proc.wait(30) != 0
    assert message in proc.log_path.read_text()


def test_worker_frozen_past_its_session_comes_back_and_keeps_leading(backend, runworker,
                                                                       zk_client):
    """SIGSTOP beyond the session timeout, then SIGCONT: every retry deadline has passed
    when it wakes. The worker must neither exit nor lose its leader thread (it did both)."""
    proc = runworker("--concurrency", "1", name="frozen")
    wait_registered(zk_client, backend, 1)
    layout = backend.store.layout
    [first_id] = zk_client.get_children(layout.workers)
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2
    proc.send_signal(signal.SIGSTOP)
    try:
        # Session timeout is 4 s in the test settings: wait until ZooKeeper expires it.
        wait_for_children(zk_client, layout.workers, lambda c: c == [], timeout=30)
    finally:
        proc.send_signal(signal.SIGCONT)
    # It registers again under a new identity, leads again (it is alone) and runs jobs.
    wait_for_children(zk_client, layout.workers, lambda c: len(c) == 1 and c != [first_id])
    for i in range(5):
        assert tasks.add.submit(i, i).wait(timeout=60).return_value == 2 * i
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    log = proc.log_path.read_text()
    assert "Exception in thread zktasks-leader" not in log


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_tasks_own_warnings_are_timestamped_like_the_workers_lines(
        backend, runworker, zk_client, pool):
    """A project without root handlers (tests.settings configures the zktasks logger
    only): a task's own logger.warning() came out bare, with neither time nor level, in
    a task process as on the worker's thread. Its INFO lines stay out, as the root
    logger's default level (and Celery's default) has it."""
    import re

    proc = runworker("--concurrency", "1", "--pool", pool, name=f"logs-{pool}")
    wait_registered(zk_client, backend, 1)
    assert tasks.logs.submit("hello").wait(timeout=60).return_value == "hello"
    wait_until(lambda: "warning: hello" in proc.log_path.read_text(), 60,
               "the task's warning in the worker's log")
    log = proc.log_path.read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ WARNING tests\.tasks\.logs "
                     r"warning: hello$", log, re.M), log[-2000:]
    assert "info: hello" not in log
