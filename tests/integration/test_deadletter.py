"""Garbage planted in a live tree ends in deadletter/, once, while normal jobs flow."""

import json
import logging
from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

from tests import tasks
from tests.pending import pending_nodes
from tests.waiting import wait_for_children
from zktasks import DeadLetterRefused, deadletter
from zktasks.tree import dead_letter_name, job_node_name, new_job_id, shard_name


def entries(backend):
    return {e.path: e for e in backend.dead_letters(200)}


def wait_for_entry(backend, zk_client, path, timeout=30):
    wait_for_children(zk_client, backend.store.layout.deadletter,
                      lambda names: len(names) > 0 and path in entries(backend), timeout)
    return entries(backend)[path]


def run_normal_jobs(n=3, base=0):
    jobs = [tasks.add.submit(base + i, 1) for i in range(n)]
    assert [j.wait(timeout=30).return_value for j in jobs] == [base + i + 1 for i in range(n)]


def logged(caplog, text):
    return [r for r in caplog.records if text in r.getMessage()]


@pytest.fixture
def watched_logs(caplog):
    caplog.set_level(logging.INFO, logger="zktasks")
    return caplog


def test_foreign_names_in_a_queue_and_in_delayed_are_moved_aside_once(
        backend, start_worker, zk_client, watched_logs):
    start_worker()
    run_normal_jobs()
    layout = backend.store.layout
    in_queue = layout.unsharded_job("default", "not-a-job")
    in_delayed = layout.delayed_job("garbage")
    shard = shard_name(0, new_job_id())
    in_shard = layout.shard_child("default", shard, "junk")
    zk_client.create(in_queue, b"hello")
    zk_client.create(in_delayed, b"\x00\x01\xff")
    zk_client.create(in_shard, b"x", makepath=True)
    run_normal_jobs(base=10)

    queued = wait_for_entry(backend, zk_client, in_queue)
    delayed = wait_for_entry(backend, zk_client, in_delayed)
    in_a_shard = wait_for_entry(backend, zk_client, in_shard)
    assert in_a_shard.kind == "foreign_name" and "in shard default/" in in_a_shard.reason
    assert queued.kind == delayed.kind == "foreign_name"
    assert queued.data == b"hello" and queued.size == 5 and queued.job_id is None
    assert delayed.data == b"\x00\x01\xff"
    assert "not a pending job's name" in queued.reason
    assert queued.by.startswith("leader ")
    assert zk_client.exists(in_queue) is None and zk_client.exists(in_delayed) is None

    # More re-reads of both parents: nothing is logged again.
    run_normal_jobs(base=20)
    soon = timezone.now() + timedelta(seconds=0.2)
    assert tasks.add.using(run_after=soon).submit(1, 1).wait(timeout=30).return_value == 2
    assert len(logged(watched_logs, f"garbage moved aside path={in_queue} ")) == 1
    assert len(logged(watched_logs, f"garbage moved aside path={in_delayed} ")) == 1


def test_a_job_node_without_status_record_is_moved_aside(backend, start_worker, zk_client):
    worker = start_worker()
    layout = backend.store.layout
    ghost = new_job_id()
    zk_client.create(layout.job("default", job_node_name(0, ghost)), b"{}", makepath=True)
    run_normal_jobs()
    assigned = layout.assignment(worker.worker_id, ghost)
    letter = wait_for_entry(backend, zk_client, assigned)
    assert letter.kind == "no_status" and letter.job_id == ghost
    assert zk_client.exists(assigned) is None
    assert pending_nodes(zk_client, layout) == []  # (empty shards are swept later)
    with pytest.raises(DeadLetterRefused, match="has no status record"):
        backend.requeue_dead_letter(letter.name)


def test_corrupt_status_of_an_assigned_job_is_kept_and_the_job_failed(
        backend, start_worker, zk_client, watched_logs):
    worker = start_worker()
    run_normal_jobs()
    layout = backend.store.layout
    job_id = new_job_id()
    garbage = b'{"state": "RUNNING", "oops": ' + b"x" * 100
    txn = zk_client.transaction()
    txn.create(layout.status(job_id), garbage)
    txn.create(layout.assignment(worker.worker_id, job_id), b'{"queue":"default"}')
    assert not any(isinstance(r, Exception) for r in txn.commit())
    run_normal_jobs(base=10)

    letter = wait_for_entry(backend, zk_client, layout.status(job_id))
    assert letter.kind == "corrupt_status" and letter.job_id == job_id
    assert letter.data == garbage and letter.by == worker.worker_id
    result = backend.wait(job_id, timeout=30)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.CorruptRecord"
    assert zk_client.exists(layout.assignment(worker.worker_id, job_id)) is None
    with pytest.raises(DeadLetterRefused, match="holds no payload"):
        backend.requeue_dead_letter(letter.name)
    assert len(logged(watched_logs, f"corrupt status record job={job_id}")) == 1


def test_a_payload_signed_with_another_key_is_failed_noted_and_requeued_once_fixed(
        settings, backend, start_worker, zk_client):
    from zktasks.backend import ZooKeeperBackend

    worker = start_worker()
    params = {**settings.TASKS["default"]}
    params["OPTIONS"] = {**params["OPTIONS"], "SIGNING_KEY": "the-other-key"}
    foreign = ZooKeeperBackend("default", params)
    job = foreign.enqueue(tasks.add, (20, 22), {})
    run_normal_jobs()
    result = backend.wait(job.id, timeout=30)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path.endswith("PayloadVerificationError")
    layout = backend.store.layout
    letter = wait_for_entry(backend, zk_client, layout.status(job.id))
    assert letter.kind == "foreign_signature" and letter.job_id == job.id
    assert "another SIGNING_KEY" in letter.reason

    # With this process's key, re-queueing would only fail again: refused, entry kept.
    with pytest.raises(DeadLetterRefused, match="SIGNING_KEY"):
        backend.requeue_dead_letter(letter.name)
    assert zk_client.exists(layout.dead_letter(letter.name))

    # The operator fixes the key everywhere, then re-queues: it runs.
    worker.stop(graceful=False)
    assert worker.wait_stopped(30)
    settings.TASKS = {"default": params}
    fixed = task_backends["default"]
    start_worker()
    assert fixed.requeue_dead_letter(letter.name) == job.id
    assert zk_client.exists(layout.dead_letter(letter.name)) is None
    done = fixed.wait(job.id, timeout=30)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 42
    record = fixed.store.read_status(job.id).record
    assert record.extra["requeued"][0]["entry"] == letter.name
    with pytest.raises(DeadLetterRefused, match="No dead-letter entry"):
        fixed.requeue_dead_letter(letter.name)


def test_a_job_near_the_size_limit_signed_with_another_key_is_failed_and_noted(
        settings, backend, start_worker, zk_client):
    """The failed record and its entry are written in one multi. With a record near
    MAX_RECORD_BYTES, the entry's copy of it took the request over jute.maxbuffer: the
    server dropped the worker's connection at every try, and the job stayed READY for
    good. The entry now keeps what room the record leaves."""
    from zktasks.backend import ZooKeeperBackend

    params = {**settings.TASKS["default"]}
    params["OPTIONS"] = {**params["OPTIONS"], "SIGNING_KEY": "the-other-key"}
    foreign = ZooKeeperBackend("default", params)
    limit = foreign.store.options.max_record_bytes
    size = 600_000
    record, _ = foreign.prepare(tasks.add, (b"", b"x" * size), {})
    size += (limit - 4_000 - len(record.to_bytes())) * 3 // 4  # base64: 4 bytes per 3
    job = foreign.enqueue(tasks.add, (b"", b"x" * size), {})
    stored = len(zk_client.get(backend.store.layout.status(job.id))[0])
    assert limit - 8_000 < stored <= limit
    start_worker()
    result = backend.wait(job.id, timeout=30)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path.endswith("PayloadVerificationError")
    letter = wait_for_entry(backend, zk_client, backend.store.layout.status(job.id))
    assert letter.kind == "foreign_signature" and letter.job_id == job.id
    assert letter.truncated and letter.size > stored - 100
    run_normal_jobs()


@pytest.mark.parametrize("content", [
    "\xff\xfe not json",
    # Decodes, but names no pending job: building its path raised ValueError, which
    # ended every leader's term at the same reconcile, so nothing was assigned at all.
    '{"queue": "default", "node": "x"}',
    # A queue with a '/': the requeue multi failed on every try, a full re-read each.
    '{"queue": "a/b", "node": "100-{id}"}',
    '{"queue": "default", "node": "100-%s"}' % ("0" * 32),  # another job's name
], ids=["not-json", "bad-node", "bad-queue", "other-job"])
def test_an_unreadable_assignment_of_a_vanished_worker_is_moved_aside_and_requeued(
        backend, start_worker, zk_client, watched_logs, content):
    start_worker()
    run_normal_jobs()
    layout = backend.store.layout
    record, _ = backend.prepare(tasks.add, (2, 3), {})
    parked = layout.assignment("ghost-worker", record.id)
    data = content.replace("{id}", record.id).encode("latin-1")
    txn = zk_client.transaction()
    txn.create(layout.status(record.id), record.to_bytes())
    txn.create(layout.worker_assignments("ghost-worker"), b"")
    txn.create(parked, data)
    assert not any(isinstance(r, Exception) for r in txn.commit())
    # A worker leaving makes the leader look for orphaned assignments.
    start_worker(lead=False).stop(graceful=False)

    letter = wait_for_entry(backend, zk_client, parked)
    assert letter.kind == "unreadable_assignment" and letter.job_id == record.id
    assert letter.data == data
    assert zk_client.exists(parked) is None
    run_normal_jobs(base=10)
    assert backend.store.read_status(record.id).record.state == "READY"  # parked, not lost
    assert len(logged(watched_logs, f"garbage moved aside path={parked} ")) == 1

    assert backend.requeue_dead_letter(letter.name) == record.id
    assert backend.wait(record.id, timeout=30).return_value == 5


def test_discard_and_bounded_entries(backend, zk_client, settings):
    store = backend.store
    store.ensure_skeleton()
    path = store.layout.unsharded_job("default", "big")
    store.ensure_queue("default")
    big = b"y" * 200_000
    zk_client.create(path, big)
    entry, failed = deadletter.move_aside(store, path, big, 0, kind="foreign_name",
                                          reason="a\nmulti-line\treason", by="test")
    assert not failed
    (letter,) = backend.dead_letters()
    assert letter.size == 200_000 and letter.truncated
    assert len(letter.data) == deadletter.KEEP_BYTES and letter.reason == "a multi-line reason"
    assert len(zk_client.get(entry)[0]) < store.options.max_record_bytes
    with pytest.raises(DeadLetterRefused, match="refers to no job"):
        backend.requeue_dead_letter(letter.name)
    assert backend.discard_dead_letter(letter.name)
    assert not backend.discard_dead_letter(letter.name)
    assert backend.dead_letters() == []


def test_entries_list_newest_first(backend, zk_client):
    store = backend.store
    store.ensure_queue("default")
    paths = []
    for i in range(3):
        path = store.layout.unsharded_job("default", f"junk-{i}")
        zk_client.create(path, json.dumps({"i": i}).encode())
        deadletter.move_aside(store, path, b"", 0, kind="foreign_name", reason="x", by="t")
        paths.append(path)
    listed = backend.dead_letters()
    assert [e.name for e in listed] == sorted((e.name for e in listed), reverse=True)
    assert [e.path for e in backend.dead_letters(2)] == [e.path for e in listed[:2]]


def test_expiry_goes_past_a_full_batch_of_held_entries(backend, zk_client, monkeypatch):
    """EXPIRE_BATCH held entries at the old end (each the only place a READY job waits)
    must not fill every sweep's batch: the old entries after them are deleted."""
    monkeypatch.setattr(deadletter, "EXPIRE_BATCH", 3)
    store = backend.store
    store.ensure_skeleton()
    layout = store.layout

    def plant(at_ms, kind="foreign_name", job_id=None):
        name = dead_letter_name(at_ms)
        data = deadletter.encode("/elsewhere/garbage", b"junk", kind=kind, reason="test",
                                 by="test", job_id=job_id, keep=1024)
        zk_client.create(layout.dead_letter(name), data, makepath=True)
        return name

    now_ms = int(timezone.now().timestamp() * 1000)
    held = []
    for i in range(3):
        record, _ = backend.prepare(tasks.add, (i, i), {})
        zk_client.create(layout.status(record.id), record.to_bytes(), makepath=True)
        held.append(plant(now_ms - 100_000 + i, "unreadable_assignment", record.id))
    doomed = [plant(now_ms - 50_000 + i) for i in range(2)]

    assert deadletter.expire(store, fence=None, now_ms=now_ms, ttl=10, limit=100) == (
        2, 0, 3)
    assert sorted(zk_client.get_children(layout.deadletter)) == sorted(held)
    assert not set(doomed) & set(zk_client.get_children(layout.deadletter))
