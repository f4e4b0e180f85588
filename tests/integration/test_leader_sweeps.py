"""The leader's sweeps on a real ZooKeeper, driven tick by tick: result expiry is capped
per sweep (the leader assigns in between), and a cancel request is deleted only once its
job is known to be finished or gone."""

import threading
import time
from datetime import timedelta

from django.tasks import TaskResultStatus
from kazoo.exceptions import ConnectionLoss

from tests import tasks
from zktasks import leader as leader_module
from zktasks import records
from zktasks.exceptions import ZooKeeperUnavailableError
from zktasks.leader import Leader
from zktasks.records import StatusRecord
from zktasks.tree import finished_bucket, finished_entry, finished_leaf, new_job_id


def plant_expired_buckets(store, zk_client, count: int) -> list[str]:
    """`count` buckets of an hour ago with a one-second TTL (long expired), one finished
    job each (status record + index entry), each made in one multi."""
    layout = store.layout
    store.ensure_skeleton()
    buckets = []
    for i in range(count):
        finished = records.now() - timedelta(hours=1, seconds=10 * i)
        ms = int(finished.timestamp() * 1000)
        bucket, leaf = finished_bucket(ms, 1), finished_leaf(ms, 1)
        job_id = new_job_id()
        record = StatusRecord(id=job_id, task="tests.tasks.add", backend="default",
                              queue="default", priority=0, state=records.SUCCESSFUL,
                              enqueued_at=finished, finished_at=finished, attempts=1)
        txn = zk_client.transaction()
        txn.create(layout.finished_bucket(bucket), b"")
        txn.create(layout.finished_bucket(leaf), b"")
        txn.create(layout.status(job_id), record.to_bytes())
        txn.create(layout.finished_entry(
            leaf, finished_entry(job_id, records.SUCCESSFUL, "default")), b"")
        assert not [r for r in txn.commit() if isinstance(r, Exception)]
        buckets.append(bucket)
    return buckets


def test_a_capped_expiry_sweep_leaves_the_rest_to_the_next_ticks_which_assign_too(
        backend, start_worker, zk_client, monkeypatch):
    monkeypatch.setattr(leader_module, "EXPIRE_BUCKETS", 2)
    store = backend.store
    planted = set(plant_expired_buckets(store, zk_client, 5))
    start_worker(lead=False)
    job = tasks.add.submit(2, 3)
    leader = Leader(store, "sweeper", stop=threading.Event())
    assert leader.contend()
    try:
        leader._tick()
        # One tick: the job is assigned (it runs), at most two buckets are expired, and
        # the rest makes the next expiry now: the leader does not sleep before more.
        assert job.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
        left = planted & set(zk_client.get_children(store.layout.finished))
        assert len(left) == 3
        assert leader._next_expiry <= time.time()
        ticks = 1
        while planted & set(zk_client.get_children(store.layout.finished)):
            leader._tick()
            ticks += 1
            assert ticks <= 3, "two more ticks of two buckets should finish the job"
        assert ticks == 3
    finally:
        leader._release()


def test_a_failed_status_read_keeps_the_cancel_request(backend, zk_client, monkeypatch):
    """Only "finished" or "no record" answer a cancel request. A read that failed keeps
    it. A real read failure is hard to provoke on cue, so the store's read_status (the one
    read the sweep makes) is monkeypatched to raise what Store.retry raises once
    ZooKeeper stopped answering (ZooKeeperUnavailableError, from kazoo's ConnectionLoss);
    a corrupt record is real bytes on the real server."""
    store = backend.store
    store.ensure_skeleton()
    layout = store.layout
    running, _ = backend.prepare(tasks.add, (1, 1), {})
    store.submit(running)
    corrupt = new_job_id()
    zk_client.create(layout.status(corrupt), b"\xff not a record")
    done = new_job_id()
    finished = records.now()
    zk_client.create(layout.status(done), StatusRecord(
        id=done, task="tests.tasks.add", backend="default", queue="default", priority=0,
        state=records.SUCCESSFUL, enqueued_at=finished, finished_at=finished,
        attempts=1).to_bytes())
    gone = new_job_id()
    for job_id in (running.id, corrupt, done, gone):
        zk_client.create(layout.cancel_request(job_id), b"", makepath=True)

    read_status = store.read_status

    def failing(job_id, watch=None):
        if job_id == running.id:
            raise ZooKeeperUnavailableError("did not answer in time") from ConnectionLoss()
        return read_status(job_id, watch=watch)

    leader = Leader(store, "sweeper", stop=threading.Event())
    monkeypatch.setattr(store, "read_status", failing)
    leader._sweep_cancel_requests()
    assert zk_client.exists(layout.cancel_request(running.id)) is not None

    monkeypatch.setattr(store, "read_status", read_status)
    leader._sweep_cancel_requests()
    assert sorted(zk_client.get_children(layout.cancel)) == sorted([running.id, corrupt])


def test_full_rereads_do_not_pile_up_watch_functions(backend):
    """kazoo keeps a path's watch functions in a set until the path changes; a new
    closure per read grew it at every reconcile (every 30 s) of an unchanged path."""
    for queue in ("default", "emails", "reports"):  # no worker: they stay pending
        tasks.add.using(queue_name=queue).submit(1, 1)
    client = backend.store.raw_client
    leader = Leader(backend.store, "rereader", stop=threading.Event())
    root = backend.store.layout.root

    def functions() -> int:
        # This test's tree only: the client is shared, and another user of it (a
        # dashboard's live cache, an earlier test's thread) may add watches elsewhere.
        return sum(len(fns) for watchers in (client._child_watchers, client._data_watchers)
                   for path, fns in watchers.items()
                   if path == root or path.startswith(root + "/"))

    assert leader.contend()
    try:
        for _ in range(2):  # every path read once
            leader.mark("*")
            leader._tick()
        once = functions()
        for _ in range(20):
            leader.mark("*")  # what RECONCILE_EVERY does
            leader._tick()
        assert functions() == once
    finally:
        leader._release()
