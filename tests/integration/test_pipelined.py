"""`zktasks.pipelined()`: submits that do not wait, every job written when the block ends."""

import secrets
import threading

import pytest
from django.tasks import TaskResultStatus
from django.tasks.signals import task_enqueued

import zktasks
from tests import tasks
from tests.conftest import impatient, use_zookeeper
from tests.pending import delayed_nodes, pending_nodes
from zktasks import pipeline


@pytest.fixture
def enqueued():
    seen = []

    def receive(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receive)
    yield seen
    task_enqueued.disconnect(receive)


def test_every_job_is_written_when_the_block_ends(backend, zk_client, enqueued,
                                                  start_worker):
    count = pipeline.WINDOW + 44  # some are collected inside the block, the rest at its end
    with zktasks.pipelined() as pipe:
        results = [tasks.add.submit(n, 1) for n in range(count)]
        assert pipeline.current(backend) is pipe
        assert pipe.sent == count
    assert pipeline.current(backend) is None
    layout = backend.store.layout
    ids = [r.id for r in results]
    assert len(set(ids)) == count
    assert sorted(enqueued) == sorted(ids)  # task_enqueued once per job, once it is written
    for job_id in ids:
        assert zk_client.exists(layout.status(job_id)), job_id
    waiting = {name[-32:] for name in pending_nodes(zk_client, layout)}
    assert waiting == set(ids)
    assert pipe.resent == 0

    start_worker()
    values = [r.wait(timeout=60).return_value for r in results]
    assert values == [n + 1 for n in range(count)]


def test_a_unique_key_is_answered_at_once(backend):
    keyed = tasks.add.using(unique_key="report-7")
    with zktasks.pipelined():
        first = keyed.submit(1, 2)
        second = keyed.submit(3, 4)  # the key is held: the first job is the answer
        other = tasks.add.submit(5, 6)
    assert second.id == first.id
    assert other.id != first.id
    assert backend.get_result(other.id).status == TaskResultStatus.READY


def test_jobs_submitted_before_an_error_are_still_written(backend, zk_client):
    with pytest.raises(RuntimeError, match="view failed"), zktasks.pipelined():
        results = [tasks.add.submit(n, n) for n in range(20)]
        raise RuntimeError("view failed")
    layout = backend.store.layout
    assert all(zk_client.exists(layout.status(r.id)) for r in results)
    assert {n[-32:] for n in pending_nodes(zk_client, layout)} == {r.id for r in results}


def test_nested_blocks_share_the_outer_pipeline(backend, zk_client):
    with zktasks.pipelined() as outer:
        with zktasks.pipelined() as inner:
            result = tasks.add.submit(1, 1)
        assert inner is outer
        assert pipeline.current(backend) is outer  # the inner block did not flush it
    assert zk_client.exists(backend.store.layout.status(result.id))


def test_bad_input_raises_at_submit_and_writes_nothing(backend, zk_client):
    import socket

    with zktasks.pipelined() as pipe:
        with socket.socket() as sock, pytest.raises(zktasks.SerializationError,
                                                     match="positional argument 1"):
            tasks.add.submit(1, sock)
        with pytest.raises(zktasks.PayloadTooLarge):
            tasks.add.submit("x" * 2_000_000, 1)
        assert pipe.sent == 0
    assert pending_nodes(zk_client, backend.store.layout) == []


def test_big_records_bound_the_bytes_in_flight(backend, zk_client, monkeypatch):
    monkeypatch.setattr(pipeline, "WINDOW_BYTES", 50_000)
    with zktasks.pipelined() as pipe:
        results = []
        for n in range(12):
            results.append(tasks.add.submit("x" * 20_000, str(n)))
            # Past the bound only the newest record may be in flight with older ones.
            assert pipe.in_flight_bytes <= 50_000 or len(pipe.in_flight) == 1
        assert len(pipe.in_flight) < 12
    assert pipe.in_flight_bytes == 0
    layout = backend.store.layout
    assert all(zk_client.exists(layout.status(r.id)) for r in results)


def test_delayed_jobs_in_a_fresh_tree_need_no_resend(backend, zk_client):
    from datetime import timedelta

    from django.utils import timezone

    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1))
    with zktasks.pipelined() as pipe:
        results = [later.submit(n, n) for n in range(5)]
    assert pipe.resent == 0  # the skeleton (status/, delayed/) was made before sending
    for result in results:
        assert backend.get_result(result.id).status == TaskResultStatus.READY
    assert len(delayed_nodes(zk_client, backend.store.layout)) == 5


@pytest.mark.django_db
def test_the_demo_view_submits_its_samples_in_one_block(backend, client, settings, enqueued):
    settings.ROOT_URLCONF = "project.urls"
    response = client.post("/submit/", {"sample": "all"})
    assert response.status_code == 302
    ids = client.session["zktasks_demo_jobs"]
    assert len(ids) == 5 and sorted(enqueued) == sorted(ids)
    for job_id in ids:
        assert backend.get_result(job_id).status == TaskResultStatus.READY


def test_a_multi_that_fails_is_written_again_job_by_job(backend, zk_client, enqueued):
    """A multi of several jobs fails as a whole (here NoNode: the pipe believed their
    shard made); each job is then written on its own, and none is lost or doubled."""
    import secrets
    import time

    store = backend.store
    ms = time.time_ns() // 1_000_000 + 3_600_000  # an hour ahead: a shard nobody made
    with zktasks.pipelined() as pipe:
        sent = []
        for n in range(6):
            job_id = f"{ms:012x}{n:04x}{secrets.token_hex(8)}"
            record, result = backend.prepare(tasks.add, (n, 1), {}, job_id=job_id)
            pipe.shards.add(store.waiting_path(record).rsplit("/", 1)[0])
            sent.append(pipe.send(record, result))
    assert pipe.resent == 6  # however the six were grouped, every multi failed
    ids = {r.id for r in sent}
    assert sorted(enqueued) == sorted(ids)
    assert {name[-32:] for name in pending_nodes(zk_client, store.layout)} == ids
    assert all(zk_client.exists(store.layout.status(job_id)) for job_id in ids)


def test_a_receiver_that_raises_does_not_stop_the_block_writing(backend, zk_client):
    """A task_enqueued receiver raising for one job: every job is still written and
    signalled, then the receiver's error comes out of the block."""
    heard = []

    def receiver(sender, task_result, **kwargs):
        heard.append(task_result.id)
        if len(heard) == 1:
            raise RuntimeError("receiver failed")

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError, match="receiver failed"), zktasks.pipelined():
            results = [tasks.add.submit(n, 1) for n in range(30)]
    finally:
        task_enqueued.disconnect(receiver)
    ids = {r.id for r in results}
    assert set(heard) == ids
    layout = backend.store.layout
    assert {name[-32:] for name in pending_nodes(zk_client, layout)} == ids


@pytest.fixture
def freezable_backend(settings, own_server, zk_root, monkeypatch):
    """The default backend on `own_server`; the session (30 s) outlives a freeze, so the
    requests queued meanwhile land after it. The tests make it give up on the frozen
    ZooKeeper after 1 s (`impatient`) only once the first job is written: the first
    connect and writes to the fresh server keep the generous CONNECT_TIMEOUT."""
    from django.tasks import task_backends

    use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root,
                  CONNECT_TIMEOUT=60.0, SESSION_TIMEOUT=30.0)
    monkeypatch.setattr(pipeline, "BATCH_JOBS", 1)  # a multi per job
    monkeypatch.setattr(pipeline, "WINDOW", 2)
    return task_backends["default"]


def _written_first(pipe):
    """Submit a job and wait for its multi: the queue's shard of this second is made."""
    first = tasks.add.submit(0, 0)
    pipe.in_flight[-1][1].get(timeout=30)
    return first


def _prepare_in_shard_of(backend, first, n: int):
    """A job whose id shares `first`'s millisecond, hence its shard: sending it makes no
    synchronous parent, which a frozen ZooKeeper would refuse before the pipeline."""
    job_id = f"{first.id[:12]}{0xff00 + n:04x}{secrets.token_hex(8)}"
    return backend.prepare(tasks.add, (n, 1), {}, job_id=job_id)


def test_a_submit_that_raises_did_not_send_its_job(freezable_backend, own_server):
    """The window is full and its oldest multi cannot be confirmed: the submit raises,
    and the job it was given was neither sent nor buffered (the caller may submit it
    again without making a second job)."""
    backend = freezable_backend
    returned, refused = [], None
    with zktasks.pipelined() as pipe:
        first = _written_first(pipe)
        restore = impatient(backend.store)
        own_server.pause()
        try:
            with pytest.raises(zktasks.ZooKeeperUnavailableError) as raised:
                for n in range(1, 6):
                    record, result = _prepare_in_shard_of(backend, first, n)
                    refused = record.id
                    returned.append(pipe.send(record, result).id)
        finally:
            own_server.resume()
            restore()  # the block's end writes to a thawed server: no 1 s bound there
    assert refused not in returned
    # Read on the pipeline's own session, after its requests: any sent earlier have landed.
    with backend.store.bounded(30.0):
        assert backend.store.read_status(refused) is None, "the refused job was written"
        assert all(backend.store.read_status(job_id) for job_id in returned)
    assert f"This job ({refused}) was not submitted" in str(raised.value)


def test_jobs_named_by_an_error_the_block_caught_are_written_when_it_ends(
        freezable_backend, own_server):
    """A submit raises because the oldest multis cannot be confirmed, and the caller
    catches it and goes on. The server then dies with those multis unread, so they never
    land. The block's end writes the jobs that error named (before, they were forgotten:
    flush() neither wrote them nor said so)."""
    from kazoo.protocol.states import KazooState

    backend = freezable_backend
    returned, named = [], []
    with zktasks.pipelined() as pipe:
        first = _written_first(pipe)
        restore = impatient(backend.store)
        try:
            own_server.pause()  # the multis below reach its socket, unread
            for n in range(1, 4):
                record, result = _prepare_in_shard_of(backend, first, n)
                try:
                    returned.append(pipe.send(record, result).id)
                except zktasks.ZooKeeperUnavailableError as exc:  # caught; the view goes on
                    named += [job_id for job_id in returned if job_id in str(exc)]
            assert named, "no submit raised"
        finally:
            restore()  # the block's end writes to the restarted server: no 1 s bound there
        back = threading.Event()
        backend.store.raw_client.add_listener(
            lambda state: back.set() if state == KazooState.CONNECTED else None)
        own_server.kill()  # what it had not read is gone
        own_server.start()
        assert back.wait(60), "the pipeline's client did not reconnect"
    with backend.store.bounded(30.0):
        missing = [job_id for job_id in returned if backend.store.read_status(job_id) is None]
    assert missing == [], f"not written: {missing} (named by the caught error: {named})"


def test_an_error_in_the_block_names_the_jobs_not_confirmed(freezable_backend, own_server):
    """The block raises while ZooKeeper is frozen: its error propagates, with a note
    naming the returned jobs that flush could not confirm."""
    backend = freezable_backend
    restore = lambda: None  # noqa: E731 - until the first job is written
    try:
        with pytest.raises(RuntimeError, match="view failed") as raised, \
                zktasks.pipelined() as pipe:
            first = _written_first(pipe)
            restore = impatient(backend.store)  # the block's end meets the frozen server
            own_server.pause()
            returned = [pipe.send(*_prepare_in_shard_of(backend, first, n)).id
                        for n in (1, 2)]
            raise RuntimeError("view failed")
    finally:
        own_server.resume()
        restore()
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "may not have been written" in notes
    assert all(job_id in notes for job_id in returned), notes


def _multi_sizes(client, monkeypatch) -> list[int]:
    """Record the bytes (paths and data) of every multi the client sends."""
    sizes = []
    transaction = client.transaction

    def recording():
        txn = transaction()
        commit_async = txn.commit_async

        def commit_noted():
            sizes.append(sum(len(op.path) + len(op.data or b"") for op in txn.operations))
            return commit_async()

        txn.commit_async = commit_noted
        return txn

    monkeypatch.setattr(client, "transaction", recording)
    return sizes


def _held(pipe, client):
    """Make the pipeline see an earlier multi still unanswered: it buffers what comes."""
    held = client.handler.async_result()
    pipe.in_flight.append(([], held, 0))
    return held


def _let_go(pipe, held) -> None:
    pipe.in_flight = type(pipe.in_flight)(entry for entry in pipe.in_flight
                                          if entry[1] is not held)


def test_a_big_job_after_a_buffered_one_goes_in_a_multi_of_its_own(backend, monkeypatch):
    """The buffer was checked after a job joined it: one just under BATCH_BYTES took a
    job of almost a megabyte, and a multi over jute.maxbuffer made the server drop the
    process's connection (every request of every thread failed), then each job was
    written again alone."""
    client = backend.store.raw_client
    states = []
    client.add_listener(states.append)
    sizes = _multi_sizes(client, monkeypatch)
    try:
        with zktasks.pipelined() as pipe:
            held = _held(pipe, client)
            small = tasks.add.submit("x" * 180_000, "")
            assert len(pipe.buffer) == 1
            big = tasks.add.submit("x" * 700_000, "")
            _let_go(pipe, held)
    finally:
        client.remove_listener(states.append)
    assert states == [] and pipe.resent == 0
    assert len(sizes) == 2 and max(sizes) < 0xFFFFF, sizes
    for result in (small, big):
        assert backend.get_result(result.id).status == TaskResultStatus.READY


def test_a_job_asked_about_inside_the_block_is_sent_first(backend):
    """Still in the buffer, a job was not found (JobNotFound) by get_result(), wait()
    and cancel(), yet written when the block ended: a job its caller failed to cancel
    then ran."""
    client = backend.store.raw_client
    with zktasks.pipelined() as pipe:
        held = _held(pipe, client)
        first = tasks.add.submit(1, 1)
        assert pipe.buffer
        assert backend.get_result(first.id).status == TaskResultStatus.READY
        second = tasks.add.submit(2, 2)
        assert second.cancel() is True  # pending: cancelled, never runs
        third = tasks.add.submit(3, 3)
        with pytest.raises(TimeoutError):
            third.wait(timeout=0.1)  # there, not finished (no worker runs)
        assert not pipe.buffer
        _let_go(pipe, held)
    cancelled = backend.get_result(second.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
