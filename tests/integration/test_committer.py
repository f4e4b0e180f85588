"""The worker's group commit (committer.py) against a real ZooKeeper: RUNNING is recorded
before a job runs, and a batch with one stale job records the others."""

import threading

from tests import tasks
from tests.pending import pending_nodes
from tests.waiting import wait_for_data
from zktasks import records
from zktasks.committer import Committer
from zktasks.exceptions import ZooKeeperUnavailableError


def test_long_job_shows_running_before_it_ends(backend, start_worker, zk_client, tmp_path):
    start_worker()
    release = tmp_path / "release"
    result = tasks.wait_for_file.submit(str(release), "done")
    path = backend.store.layout.status(result.id)
    seen = wait_for_data(zk_client, path, lambda data: data["state"] == records.RUNNING)
    assert seen["attempts"] == 1
    release.write_text("go")
    assert result.wait(timeout=30).return_value == "done"
    _, stat = zk_client.get(path)
    assert stat.version == 2  # RUNNING, then the outcome


def _assigned_jobs(backend, zk_client, count):
    """Submit `count` jobs and assign them to a made-up worker, as the leader would."""
    store = backend.store
    layout = store.layout
    worker_id = "committer-test"
    zk_client.ensure_path(layout.worker_assignments(worker_id))
    results = [tasks.add.submit(i, i) for i in range(count)]
    nodes = pending_nodes(zk_client, layout)
    # Any znode that exists can stand in for the leader's election fence here.
    outcome = store.assign(layout.jobs, [("default", n, worker_id) for n in nodes])
    assert not [r for r in outcome if isinstance(r, Exception)]
    found = [store.read_status(r.id) for r in results]
    return store, worker_id, found


def test_one_stale_job_does_not_sink_its_batch(backend, zk_client):
    store, worker_id, found = _assigned_jobs(backend, zk_client, 3)
    committer = Committer(store)
    committer.start()
    done = {}
    all_done = threading.Event()

    def on_done(job_id):
        def settle(ok):
            done[job_id] = ok
            if len(done) == len(found):
                all_done.set()
        return settle

    commits = []
    for v in found:
        running = v.record.evolve(state=records.RUNNING, attempts=1, worker_ids=(worker_id,),
                                  started_at=records.now())
        commit = committer.begin(worker_id, v.record.id, running.to_bytes(), v.version)
        # Waiting on the latch itself, not wait_started(): begin() does not wake the
        # committer thread, whose tick writes the start all the same.
        assert commit.started.wait(30)
        assert not commit.refused
        commits.append((commit, running))
    # The middle job is taken back (as the leader does for a worker presumed dead).
    stale = found[1].record.id
    zk_client.delete(store.layout.assignment(worker_id, stale))
    # Holding the committer's lock while queueing makes the three outcomes one batch.
    with committer._cond:
        for commit, running in commits:
            final = running.evolve(state=records.SUCCESSFUL, finished_at=records.now())
            committer.finish(commit, final, requeue=False, on_done=on_done(running.id))
    assert all_done.wait(30)
    assert committer.close(timeout=10)
    assert done == {found[0].record.id: True, stale: False, found[2].record.id: True}
    for v in found:
        record = store.read_status(v.record.id).record
        expected = records.RUNNING if v.record.id == stale else records.SUCCESSFUL
        assert record.state == expected
    # The recorded jobs' assignments went in the same multis as their outcomes.
    assert zk_client.get_children(store.layout.worker_assignments(worker_id)) == []


def test_a_start_on_a_taken_back_assignment_is_refused(backend, zk_client):
    store, worker_id, [found] = _assigned_jobs(backend, zk_client, 1)
    zk_client.delete(store.layout.assignment(worker_id, found.record.id))
    committer = Committer(store)
    committer.start()
    try:
        running = found.record.evolve(state=records.RUNNING, attempts=1)
        commit = committer.begin(worker_id, found.record.id, running.to_bytes(),
                                 found.version)
        assert committer.wait_started(commit, timeout=30)
        assert commit.refused  # the worker does not run it
        assert store.read_status(found.record.id).record.state == records.READY
    finally:
        assert committer.close(timeout=10)


def test_a_runner_waiting_for_its_start_writes_the_waiting_batch_itself(backend, zk_client):
    """With nothing being written, wait_started() writes on the caller's thread: the
    lingering outcome of one job and the start of the next, in one multi. (No committer
    thread is started here, so nothing else could have written them.)"""
    store, worker_id, [first, second] = _assigned_jobs(backend, zk_client, 2)
    committer = Committer(store)
    running = first.record.evolve(state=records.RUNNING, attempts=1, worker_ids=(worker_id,),
                                  started_at=records.now())
    commit = committer.begin(worker_id, first.record.id, running.to_bytes(), first.version)
    assert committer.wait_started(commit, timeout=30) and not commit.refused
    assert committer.transactions == 1
    settled = []
    final = running.evolve(state=records.SUCCESSFUL, finished_at=records.now())
    committer.finish(commit, final, requeue=False, linger=True,
                     on_done=lambda ok: settled.append((ok, threading.get_ident())))
    next_running = second.record.evolve(state=records.RUNNING, attempts=1,
                                        worker_ids=(worker_id,), started_at=records.now())
    following = committer.begin(worker_id, second.record.id, next_running.to_bytes(),
                                second.version)
    assert committer.wait_started(following, timeout=30) and not following.refused
    assert committer.transactions == 2  # the outcome and the next start shared a multi
    assert settled == [(True, threading.get_ident())]
    assert store.read_status(first.record.id).record.state == records.SUCCESSFUL
    assert store.read_status(second.record.id).record.state == records.RUNNING
    assert committer.close(timeout=10)


def test_an_error_after_part_of_a_batch_settled_puts_back_only_the_rest(
        backend, zk_client, monkeypatch):
    """A batch refused as a whole is committed again job by job. If ZooKeeper fails
    after some of those landed, only the others go back in the queue: a settled start
    put back had nothing left to write, and the committer thread died on it, leaving
    every runner waiting on it for good."""
    store, worker_id, [first, second] = _assigned_jobs(backend, zk_client, 2)
    committer = Committer(store)
    committer.start()
    running = second.record.evolve(state=records.RUNNING, attempts=1,
                                   worker_ids=(worker_id,), started_at=records.now())
    started = committer.begin(worker_id, second.record.id, running.to_bytes(),
                              second.version)
    assert started.started.wait(30) and not started.refused
    # The second job is taken back; its outcome's multi fails on the missing assignment
    # (NoNode), and making its index bucket apart for one more try meets a ZooKeeper
    # that is away.
    zk_client.delete(store.layout.assignment(worker_id, second.record.id))
    real = store.index_path
    calls = []

    def away_once(record, **kwargs):
        calls.append(record.id)
        if len(calls) == 1:
            raise ZooKeeperUnavailableError("ZooKeeper is away (test)")
        return real(record, **kwargs)

    monkeypatch.setattr(store, "index_path", away_once)
    settled = threading.Event()
    outcome = []
    first_running = first.record.evolve(state=records.RUNNING, attempts=1,
                                        worker_ids=(worker_id,), started_at=records.now())
    with committer._cond:  # one batch: the first job's start, the second's outcome
        begun = committer.begin(worker_id, first.record.id, first_running.to_bytes(),
                                first.version)
        final = running.evolve(state=records.SUCCESSFUL, finished_at=records.now())
        committer.finish(started, final, requeue=False,
                         on_done=lambda ok: (outcome.append(ok), settled.set()))
    assert begun.started.wait(30) and not begun.refused
    assert settled.wait(30), "the outcome was never settled"
    assert outcome == [False]  # its assignment is gone: dropped, as before
    assert len(calls) == 2  # asked again after the error
    assert committer._thread.is_alive()
    # And the thread goes on writing.
    final = first_running.evolve(state=records.SUCCESSFUL, finished_at=records.now())
    done = threading.Event()
    committer.finish(begun, final, requeue=False, on_done=lambda ok: done.set())
    assert done.wait(30)
    assert store.read_status(first.record.id).record.state == records.SUCCESSFUL
    assert committer.close(timeout=10)
