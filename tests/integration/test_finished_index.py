"""The finished index on a real ZooKeeper (tree.LAYOUT: finished/{bucket}/{second}/{entry}):
where a finish is indexed, and entries written directly in a bucket (before seconds) read,
counted, retried and expired alike."""

from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.conftest import use_zookeeper
from tests.waiting import wait_for_children, wait_for_deletion, wait_until
from zktasks import dashboard, records
from zktasks.records import StatusRecord
from zktasks.tree import (
    finished_bucket,
    finished_entry,
    finished_leaf,
    is_finished_second,
    new_job_id,
)


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch, request):
    """Overrides the suite's fixture: the global RESULT_TTL is the test's parameter."""
    ttl = getattr(request, "param", 86400)
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, RESULT_TTL=ttl)


def entry_of(job, state) -> tuple[int, str]:
    return (int(job.finished_at.timestamp() * 1000),
            finished_entry(job.id, state, "default"))


def test_a_finish_is_indexed_in_the_second_of_its_bucket(backend, start_worker, zk_client):
    start_worker()
    jobs = [tasks.add.submit(i, i) for i in range(3)]
    for job in jobs:
        assert job.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
    layout = backend.store.layout
    for job in jobs:
        ms, entry = entry_of(job, records.SUCCESSFUL)
        leaf = finished_leaf(ms)
        assert leaf == f"{finished_bucket(ms)}/{ms // 1000 % 10}"
        assert zk_client.exists(layout.finished_entry(leaf, entry)) is not None
    for bucket in zk_client.get_children(layout.finished):
        seconds = zk_client.get_children(layout.finished_bucket(bucket))
        assert seconds and all(is_finished_second(s) for s in seconds)
    assert set(backend.store.recent_finished(10)) == {j.id for j in jobs}


def test_entries_written_directly_in_a_bucket_are_read_counted_and_retried(
        backend, start_worker, zk_client):
    """A tree written before seconds existed: the entry sits directly in its bucket."""
    start_worker()
    ok = tasks.add.submit(1, 1)
    bad = tasks.flaky.using(max_attempts=1).submit(2)
    assert ok.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
    assert bad.wait(timeout=30).status == TaskResultStatus.FAILED
    layout = backend.store.layout
    ms, entry = entry_of(bad, records.FAILED)
    old = layout.finished_entry(finished_bucket(ms), entry)
    txn = zk_client.transaction()
    txn.delete(layout.finished_entry(finished_leaf(ms), entry))
    txn.create(old, b"")
    assert not [r for r in txn.commit() if isinstance(r, Exception)]

    assert set(backend.store.recent_finished(10)) == {ok.id, bad.id}
    reader = dashboard.Reader(backend)
    assert [r.id for r in reader.results(state="FAILED").rows] == [bad.id]
    assert ("finished index", old) in reader._places(backend.store.read_status(bad.id).record)
    state = dashboard.live_state(backend)
    wait_until(lambda: state.snapshot()["totals"]["failed"] == 1, 60, "counts")
    assert state.snapshot()["totals"]["succeeded"] == 1

    # retry() finds the entry where it is and removes it in its multi.
    assert backend.retry(bad.id) is True
    assert zk_client.exists(old) is None
    assert bad.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
    ms, entry = entry_of(bad, records.SUCCESSFUL)
    assert zk_client.exists(layout.finished_entry(finished_leaf(ms), entry)) is not None


@pytest.mark.parametrize("zk_settings", [1], indirect=True)
def test_the_leader_expires_seconds_and_entries_written_directly_in_a_bucket(
        backend, start_worker, zk_client):
    """A bucket a minute old holding both layouts, made in one multi (so the leader sees
    all of it or none): the leader deletes the records, the seconds and the bucket."""
    layout = backend.store.layout
    finished = records.now() - timedelta(minutes=1)
    ms = int(finished.timestamp() * 1000)
    ids = [new_job_id(), new_job_id()]
    for path in layout.skeleton():
        zk_client.ensure_path(path)
    txn = zk_client.transaction()
    txn.create(layout.finished_bucket(finished_bucket(ms)), b"")
    txn.create(layout.finished_bucket(finished_leaf(ms)), b"")
    for job_id, leaf in zip(ids, (finished_bucket(ms), finished_leaf(ms)), strict=True):
        record = StatusRecord(id=job_id, task="tests.tasks.add", backend="default",
                              queue="default", priority=0, state=records.SUCCESSFUL,
                              enqueued_at=finished, finished_at=finished, attempts=1)
        txn.create(layout.status(job_id), record.to_bytes())
        txn.create(layout.finished_entry(leaf, finished_entry(job_id, records.SUCCESSFUL,
                                                              "default")), b"")
    assert not [r for r in txn.commit() if isinstance(r, Exception)]

    start_worker()
    for job_id in ids:
        wait_for_deletion(zk_client, layout.status(job_id), timeout=30)
    wait_for_children(zk_client, layout.finished, lambda c: c == [], timeout=30)


def test_expiry_is_capped_per_call_and_resumes_after_its_cursor(backend, zk_client):
    """Expired buckets are handled at most `max_buckets` (and `max_entries`) a call; the
    rest makes the next expiry now, and calls resuming after the returned cursor finish
    the job, even past buckets that cannot be emptied (a foreign name) at the old end."""
    store, layout = backend.store, backend.store.layout
    store.ensure_skeleton()
    base = records.now() - timedelta(hours=1)
    now_ms = int(records.now().timestamp() * 1000)

    def plant(i, jobs=1, foreign=False):
        at = base + timedelta(seconds=10 * i)
        ms = int(at.timestamp() * 1000)
        bucket, leaf = finished_bucket(ms, 1), finished_leaf(ms, 1)
        txn = zk_client.transaction()
        txn.create(layout.finished_bucket(bucket), b"")
        txn.create(layout.finished_bucket(leaf), b"")
        if foreign:
            txn.create(layout.finished_entry(leaf, "not-a-job-entry"), b"")
        for _ in range(jobs):
            job_id = new_job_id()
            record = StatusRecord(id=job_id, task="tests.tasks.add", backend="default",
                                  queue="default", priority=0, state=records.SUCCESSFUL,
                                  enqueued_at=at, finished_at=at, attempts=1)
            txn.create(layout.status(job_id), record.to_bytes())
            txn.create(layout.finished_entry(leaf, finished_entry(
                job_id, records.SUCCESSFUL, "default")), b"")
        assert not [r for r in txn.commit() if isinstance(r, Exception)]
        return bucket

    stuck = [plant(i, jobs=0, foreign=True) for i in range(2)]  # the oldest: never empty
    big = plant(2, jobs=7)
    small = [plant(i) for i in range(3, 6)]

    def sweep(after):
        return store.expire_finished(fence=None, now_ms=now_ms, default_ttl=86400,
                                     max_buckets=2, max_entries=5, after=after)

    def left():
        return set(zk_client.get_children(layout.finished))

    # The two stuck buckets take the first call; the next starts after them.
    deleted, next_ms, cursor = sweep("")
    assert (deleted, cursor) == (0, stuck[1]) and next_ms <= now_ms
    # Five of the big bucket's seven entries: it stays, and comes first next time.
    deleted, next_ms, cursor = sweep(cursor)
    assert (deleted, cursor) == (5, stuck[1]) and next_ms <= now_ms and big in left()
    deleted, next_ms, cursor = sweep(cursor)
    assert (deleted, cursor) == (2 + 1, small[0]) and big not in left() and next_ms <= now_ms
    deleted, next_ms, cursor = sweep(cursor)
    assert (deleted, cursor, next_ms) == (2, "", None)
    assert left() == set(stuck)
    # A new pass goes over the stuck ones again, and says nothing is due (no spinning).
    assert sweep(cursor) == (0, None, "")


def test_an_outcome_that_met_a_missing_bucket_makes_it_though_noted_again(
        backend, start_worker, caplog):
    """A runner notes a second's bucket as made before its own multi makes it
    (Store.index_entry), so an outcome of that second written first meets NoNode, and
    the committer makes the bucket apart for one more try. A runner noting it again in
    between (for a job of its own of that second) made that try skip the bucket: NoNode
    again, the outcome dropped, the job RUNNING until the worker's next full list (seen
    once under the two-process suite)."""
    import time

    worker = start_worker()
    store = worker.store
    now_ms = int(time.time() * 1000)
    for k in range(-1, 30):  # noted, not made: as if other runners' multis were on their way
        store._note_bucket(finished_leaf(now_ms + k * 1000, None))
    forgotten = []
    forget = store.forget_bucket

    def forget_and_noted_again(index):
        forget(index)
        forgotten.append(index)
        store._note_bucket(index.rsplit("/", 1)[0][len(store.layout.finished) + 1:])

    store.forget_bucket = forget_and_noted_again
    job = tasks.add.submit(2, 3)
    assert job.wait(timeout=20).return_value == 5
    assert forgotten  # its first multi met the missing bucket
    assert "outcome dropped" not in caplog.text


def test_an_outcome_whose_bucket_parent_was_made_meanwhile_still_makes_its_second(
        backend, start_worker, zk_client, caplog):
    """An outcome's multi creates its bucket's parent and its second; another second's
    outcome made the parent meanwhile (NodeExists). Its second, noted as made by its own
    read but never made, was left out of the retry: NoNode, the outcome dropped, the job
    RUNNING until the worker's next full list (seen under the two-process suite)."""
    worker = start_worker()
    store = worker.store
    made_meanwhile = []
    index_entry = store.index_entry

    def parent_made_meanwhile(record):
        entry, buckets = index_entry(record)
        if len(buckets) == 2:  # [parent, second]: another second's outcome makes the parent
            zk_client.create(buckets[0])
            made_meanwhile.append(buckets[0])
        return entry, buckets

    store.index_entry = parent_made_meanwhile
    job = tasks.add.submit(2, 3)
    assert job.wait(timeout=20).return_value == 5
    assert made_meanwhile  # the first finish in this tree: the parent was missing
    assert "outcome dropped" not in caplog.text
