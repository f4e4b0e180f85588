"""A short job a worker holds alone runs without its RUNNING write (three write
transactions per job at low load, not four), and its attempt is still counted when the
worker's session ends mid-run: the leader counts one for the oldest assignment a
vanished worker left. Real ZooKeeper, in-process workers and bare "ghost" workers."""

import json

from django.tasks import TaskResultStatus
from kazoo.client import KazooClient

from tests import tasks
from tests.integration.test_faults import _expire
from tests.waiting import wait_for_children, wait_for_data, wait_until
from zktasks import committer
from zktasks.store import failures
from zktasks.worker import UNRECORDED_START_MAX_S

WORKER_LOST = "zktasks.exceptions.WorkerLost"
TASK = "tests.tasks.quick_unless_armed"


def _short_to(worker, directory):
    """Run quick_unless_armed one job at a time until the worker's average of its run
    times is short (a first run, importing and loading, may take longer), then wait
    until the worker has let go of their assignments."""
    for _ in range(30):
        assert tasks.quick_unless_armed.submit(str(directory)).wait(timeout=30).status \
            == TaskResultStatus.SUCCESSFUL
        if worker._task_avg.get(TASK, 1.0) <= UNRECORDED_START_MAX_S:
            break
    else:
        raise AssertionError(f"runs of {TASK} stayed long: {worker._task_avg.get(TASK)}")
    wait_until(lambda: not worker._listed, 30, "the worker to let go of their assignments")


def test_a_short_job_held_alone_costs_one_worker_write(backend, start_worker, zk_client,
                                                        tmp_path):
    """The first run of a task (its run time unknown) writes RUNNING, then its outcome;
    once the task is known to be short, a job held alone is recorded by its outcome
    alone, which still says which attempt ran, where and when."""
    worker = start_worker(name="alone", concurrency=1)
    layout = backend.store.layout
    first = tasks.quick_unless_armed.submit(str(tmp_path))
    first.wait(timeout=30)
    assert zk_client.exists(layout.status(first.id)).version == 2  # RUNNING, then outcome
    _short_to(worker, tmp_path)
    before = (worker.unrecorded_starts, worker.committer.transactions)
    job = tasks.quick_unless_armed.submit(str(tmp_path))
    result = job.wait(timeout=30)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert zk_client.exists(layout.status(job.id)).version == 1  # the outcome alone
    wait_until(lambda: worker.committer.transactions == before[1] + 1, 30,
               "the outcome's multi to be counted")
    assert worker.unrecorded_starts == before[0] + 1
    assert (result.attempts, result.worker_ids, result.errors) == (1, [worker.worker_id], [])
    assert result.started_at is not None and result.finished_at >= result.started_at


def test_a_long_task_still_shows_running(backend, start_worker, zk_client, tmp_path):
    """Run times over UNRECORDED_START_MAX_S: the RUNNING write comes first, as always."""
    worker = start_worker(name="long", concurrency=1)
    for _ in range(2):
        tasks.short_sleep.submit(0.08).wait(timeout=30)
    before = worker.unrecorded_starts
    job = tasks.short_sleep.submit(0.08)
    job.wait(timeout=30)
    assert zk_client.exists(backend.store.layout.status(job.id)).version == 2
    assert worker.unrecorded_starts == before


def test_a_run_begun_unrecorded_is_counted_when_the_session_ends(
        backend, start_worker, zk_hosts, zk_client, tmp_path, monkeypatch):
    """The worker's session ends while it runs a job it began without the RUNNING
    write: the leader counts that attempt (WorkerLost, attempts 2 for the rerun), as
    it would a recorded one. Uncounted, the rerun would have been attempt 1 again."""
    monkeypatch.setattr(committer, "LATE_START", 600.0)  # no late RUNNING here
    worker = start_worker(name="expiring", concurrency=2)
    _short_to(worker, tmp_path)
    (tmp_path / "armed").touch()
    job = tasks.quick_unless_armed.submit(str(tmp_path))
    wait_until(lambda: (tmp_path / "began").exists(), 30, "the armed run to begin")
    status = json.loads(zk_client.get(backend.store.layout.status(job.id))[0])
    assert status["state"] == "READY" and status["attempts"] == 0  # nothing written
    first_identity = worker.worker_id
    _expire(zk_hosts, worker.client)
    result = job.wait(timeout=60)
    (tmp_path / "release").touch()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2  # the rerun's attempt
    assert result.attempts == 2
    assert result.worker_ids == [first_identity, worker.worker_id]
    assert [e.exception_class_path for e in result.errors] == [WORKER_LOST]
    assert "held this job alone, as attempt 1" in result.errors[0].traceback


def test_a_run_begun_unrecorded_that_runs_long_shows_running(backend, start_worker,
                                                                zk_client, tmp_path):
    """Short so far, long this time: its RUNNING is written once it has run for
    committer.LATE_START, and its outcome after that, at the version it left."""
    worker = start_worker(name="late", concurrency=1)
    _short_to(worker, tmp_path)
    (tmp_path / "armed").touch()
    before = worker.unrecorded_starts
    job = tasks.quick_unless_armed.submit(str(tmp_path))
    path = backend.store.layout.status(job.id)
    record = wait_for_data(zk_client, path, lambda d: d["state"] == "RUNNING")
    assert (tmp_path / "began").exists()
    assert worker.unrecorded_starts == before + 1  # begun without it, written late
    assert (record["attempts"], record["worker_ids"]) == (1, [worker.worker_id])
    (tmp_path / "release").touch()
    result = job.wait(timeout=30)
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL, 1, 1)
    assert zk_client.exists(path).version == 2  # RUNNING (late), then the outcome


def test_a_short_job_that_ends_as_its_late_running_is_written_is_recorded(
        backend, start_worker, zk_client, tmp_path, monkeypatch):
    """The late RUNNING and the outcome can meet: the job ends while its RUNNING is
    queued or on its way. Either way the outcome lands (at the version the RUNNING
    write left, or instead of it), once. LATE_START 0 makes every unrecorded start
    meet its late write at once."""
    monkeypatch.setattr(committer, "LATE_START", 0.0)
    worker = start_worker(name="meet", concurrency=1)
    _short_to(worker, tmp_path)
    before = worker.unrecorded_starts
    versions = []
    for _ in range(20):
        job = tasks.quick_unless_armed.submit(str(tmp_path))
        result = job.wait(timeout=30)
        assert (result.status, result.attempts) == (TaskResultStatus.SUCCESSFUL, 1)
        wait_until(lambda: not worker._listed, 30, "the worker to let go of it")
        # 1: the outcome went instead of the late RUNNING; 2: after it.
        versions.append(zk_client.exists(backend.store.layout.status(job.id)).version)
    assert set(versions) <= {1, 2}, versions
    assert worker.unrecorded_starts > before
    assert not worker.committer._unrecorded and not worker.committer.pending()


def _ghost(backend, name="ghost"):
    """A bare worker: registered, never starting anything, dying when closed."""
    layout = backend.store.layout
    ghost = KazooClient(hosts=backend.conf.hosts, timeout=4.0)
    ghost.start(timeout=60)
    data = json.dumps({"queues": ["default"], "concurrency": 4, "prefetch": 0}).encode()
    tx = ghost.transaction()
    tx.create(layout.worker_assignments(name), b"")
    tx.create(layout.worker(name), data, ephemeral=True)
    assert not failures(tx.commit())
    return ghost


def _die(ghost):
    ghost.stop()
    ghost.close()


def test_the_one_job_a_vanished_worker_held_is_counted(backend, start_worker, zk_client):
    """Nothing shows it began, but it may have (a short job held alone): counted."""
    leader = start_worker(name="leader", queues=["other"])
    wait_until(lambda: leader.leader is not None and leader.leader.is_leader, 60, "a leader")
    ghost = _ghost(backend)
    job = tasks.add.submit(2, 3)
    wait_for_children(zk_client, backend.store.layout.worker_assignments("ghost"),
                      lambda c: c == [job.id])
    _die(ghost)
    survivor = start_worker(name="survivor")
    result = job.wait(timeout=30)
    assert result.return_value == 5
    assert (result.attempts, result.worker_ids) == (2, ["ghost", survivor.worker_id])
    assert [e.exception_class_path for e in result.errors] == [WORKER_LOST]


def test_only_the_oldest_of_a_vanished_worker_s_jobs_is_counted(backend, start_worker,
                                                                 zk_client):
    """Assigned one after the other: a job runs unrecorded only while it is its worker's
    one assignment, so of the jobs a worker left with no RUNNING record only the oldest
    may have begun. The newer one goes back with no attempt counted."""
    leader = start_worker(name="leader", queues=["other"])
    wait_until(lambda: leader.leader is not None and leader.leader.is_leader, 60, "a leader")
    ghost = _ghost(backend)
    parent = backend.store.layout.worker_assignments("ghost")
    older = tasks.add.submit(1, 1)
    wait_for_children(zk_client, parent, lambda c: c == [older.id])
    newer = tasks.add.submit(2, 2)
    wait_for_children(zk_client, parent, lambda c: sorted(c) == sorted([older.id, newer.id]))
    czxids = {j.id: zk_client.exists(f"{parent}/{j.id}").czxid for j in (older, newer)}
    assert czxids[older.id] < czxids[newer.id]
    _die(ghost)
    survivor = start_worker(name="survivor")
    first, second = older.wait(timeout=30), newer.wait(timeout=30)
    assert (first.attempts, first.worker_ids) == (2, ["ghost", survivor.worker_id])
    assert [e.exception_class_path for e in first.errors] == [WORKER_LOST]
    assert (second.attempts, second.worker_ids, second.errors) == (
        1, [survivor.worker_id], [])
