"""Records that are garbage, grow too big, or carry values past what the tree can name;
a registration whose answer was lost with its session. Each against a real ZooKeeper
with in-process workers; each failed before its fix (a wedged worker, a job run again
and again, a job never recorded, an idle worker nobody could see)."""

import json
import logging

import pytest
from django.tasks import TaskResultStatus
from kazoo.exceptions import ConnectionLoss

from tests import tasks
from tests.integration.test_deadletter import run_normal_jobs, wait_for_entry
from tests.integration.test_faults import _expire
from tests.waiting import wait_until
from zktasks import Retry, zk_task
from zktasks.records import MAX_MESSAGE_BYTES, StatusRecord
from zktasks.serialization import MAX_RETRY_DELAY
from zktasks.tree import new_job_id


@zk_task(max_attempts=5, backoff=0)
def raises_wide_characters():
    # 20,000 emoji: 80 KB of UTF-8, 240 KB as the ASCII JSON records are written in.
    raise ValueError("\U0001F600" * 20_000)


@zk_task(max_attempts=3)
def retries_never(marker):
    with open(marker, "a") as f:
        f.write("ran\n")
    raise Retry("again, some day", delay=float("inf"))


@zk_task(max_attempts=3)
def retries_after_nan(marker):
    with open(marker, "a") as f:
        f.write("ran\n")
    raise Retry("again, when?", delay=float("nan"))


def _plant_assigned(zk_client, layout, worker_id, data: bytes) -> str:
    job_id = new_job_id()
    txn = zk_client.transaction()
    txn.create(layout.status(job_id), data)
    txn.create(layout.assignment(worker_id, job_id), b'{"queue":"default"}')
    assert not any(isinstance(r, Exception) for r in txn.commit())
    return job_id


def test_a_status_record_nested_too_deep_is_moved_aside_and_the_worker_goes_on(
        backend, start_worker, zk_client):
    """JSON nested thousands deep raised RecursionError, not CorruptRecord: the worker's
    intake stopped at that job on every pass, and no job assigned after it ran."""
    worker = start_worker()
    layout = backend.store.layout
    garbage = b"[" * 10_000
    job_id = _plant_assigned(zk_client, layout, worker.worker_id, garbage)
    run_normal_jobs(base=10)
    letter = wait_for_entry(backend, zk_client, layout.status(job_id))
    assert letter.kind == "corrupt_status" and letter.data == garbage
    failed = backend.wait(job_id, timeout=30)
    assert failed.status == TaskResultStatus.FAILED
    assert "nested" in failed.errors[-1].traceback or "recursion" in \
        failed.errors[-1].traceback.lower()


@pytest.mark.parametrize("field, value", [
    ("priority", None), ("attempts", "1"), ("max_attempts", None),
    ("takes_context", "false"), ("run_after", "2026-01-01T00:00:00"),
    ("worker_ids", [1]),
])
def test_a_status_field_of_the_wrong_type_is_corrupt_not_a_crash(
        backend, start_worker, zk_client, field, value):
    """Each of these passed the decoder and failed later: "priority": null stopped the
    worker's intake, "attempts": "1" left the job assigned and re-read forever, a naive
    run_after raised TypeError where it was compared."""
    worker = start_worker()
    layout = backend.store.layout
    record, _ = backend.prepare(tasks.add, (1, 2), {})
    data = json.loads(record.to_bytes())
    data[field] = value
    raw = json.dumps(data).encode()
    txn = zk_client.transaction()
    txn.create(layout.status(record.id), raw)
    txn.create(layout.assignment(worker.worker_id, record.id), b'{"queue":"default"}')
    assert not any(isinstance(r, Exception) for r in txn.commit())
    run_normal_jobs(base=20)
    letter = wait_for_entry(backend, zk_client, layout.status(record.id))
    assert letter.kind == "corrupt_status" and repr(field) in letter.reason
    assert backend.wait(record.id, timeout=30).status == TaskResultStatus.FAILED


def test_a_field_from_a_newer_release_does_not_fail_the_job(backend, start_worker, zk_client):
    """A rolling upgrade: a newer release's optional field made older workers take the
    record for corrupt and replace the job with a FAILED placeholder."""
    store = backend.store
    record, result = backend.prepare(tasks.add, (4, 5), {})
    data = json.loads(record.to_bytes()) | {"a_field_of_later_releases": {"x": 1}}
    store.ensure_queue("default")
    zk_client.create(store.layout.status(record.id), json.dumps(data).encode())
    zk_client.create(store.waiting_path(record), b"{}", makepath=True)
    start_worker()
    assert result.wait(timeout=30).return_value == 9


def test_errors_of_wide_characters_keep_the_record_within_its_limit(
        backend, start_worker, zk_client, settings):
    """Messages were cut at 2,000 characters, tracebacks at 16,000, but an emoji costs 12
    bytes of ASCII JSON: five attempts made a record over 1 MB that no multi could
    carry. The server dropped the connection at every try, and every later start and
    outcome of that worker waited behind it."""
    limit = backend.store.options.max_record_bytes
    start_worker()
    result = raises_wide_characters.submit()
    done = result.wait(timeout=60)
    assert done.status == TaskResultStatus.FAILED
    assert len(done.errors) == 5
    assert all(len(json.dumps(e.exception_class_path)) < 200 for e in done.errors)
    raw, _ = zk_client.get(backend.store.layout.status(result.id))
    assert len(raw) <= limit
    record = StatusRecord.from_bytes(raw)
    assert len(json.dumps(record.errors[-1].message)) <= MAX_MESSAGE_BYTES
    # The worker goes on.
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2


def test_a_record_whose_errors_outgrow_it_is_trimmed_oldest_first(backend):
    """fit(): older tracebacks go first, no error is dropped (lost workers are counted
    from them), the record ends within its limit."""
    from zktasks.records import TRIMMED, ErrorRecord

    record, _ = backend.prepare(tasks.add, (1, 2), {})
    errors = tuple(ErrorRecord(exception_class_path="x.E", message="m" * 1000,
                               traceback="t" * 30_000, attempt=n) for n in range(1, 6))
    big = record.evolve(errors=errors)
    assert len(big.to_bytes()) > 100_000
    fitted = big.fit(100_000)
    assert len(fitted.to_bytes()) <= 100_000 and len(fitted.errors) == 5
    assert [e.traceback for e in fitted.errors[:-1]] == [TRIMMED] * 4
    assert fitted.errors[-1].traceback == "t" * 30_000
    assert big.fit(10**7) is big


def test_a_record_that_cannot_hold_its_errors_keeps_those_of_lost_workers(backend):
    """A job near MAX_RECORD_BYTES that failed over and over: trimmed texts were not
    enough, the record outgrew ZooKeeper's limit, and its worker's connection dropped
    at every try to write it. The older errors go then, but those of lost workers,
    which are counted (MAX_WORKER_LOSSES)."""
    from zktasks.records import WORKER_LOST, ErrorRecord

    record, _ = backend.prepare(tasks.add, (b"x" * 60_000, b""), {})
    errors = tuple(ErrorRecord(exception_class_path=WORKER_LOST if n % 10 == 0 else "x.E",
                               message="m" * 1000, traceback="t" * 30_000, attempt=n)
                   for n in range(1, 101))
    limit = len(record.to_bytes()) + 10_000
    fitted = record.evolve(errors=errors).fit(limit)
    assert len(fitted.to_bytes()) <= limit
    assert [e.attempt for e in fitted.errors] == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


def test_a_record_of_many_attempts_keeps_its_last_workers_when_it_must(backend):
    """One worker id per attempt, never trimmed: a record near the limit outgrew
    jute.maxbuffer after enough attempts (116 of a 60-character worker name)."""
    from zktasks.records import ErrorRecord

    record, _ = backend.prepare(tasks.add, (b"x" * 60_000, b""), {})
    workers = tuple(f"worker-{n:03d}-" + "w" * 50 for n in range(200))
    errors = (ErrorRecord(exception_class_path="x.E", message="m", traceback="t"),)
    limit = len(record.to_bytes()) + 2_000
    fitted = record.evolve(worker_ids=workers, errors=errors).fit(limit)
    assert len(fitted.to_bytes()) <= limit
    assert fitted.worker_ids == workers[-10:]
    assert record.evolve(worker_ids=workers[:3], errors=errors).fit(limit).worker_ids \
        == workers[:3]


def test_an_error_keeps_its_frames_and_its_record_stays_small(backend):
    """A 3 MB exception message left a "traceback" of its last 16,000 characters only,
    and a class path of a megabyte went into the record whole. A __str__ that raises
    SystemExit ended the thread-pool runner that recorded it."""
    from zktasks.records import ErrorRecord

    def raise_it(exc):
        raise exc

    try:
        raise_it(ValueError("x" * 3_000_000))
    except ValueError as exc:
        error = ErrorRecord.from_exception(exc)
    assert 'File "' in error.traceback and "in raise_it" in error.traceback
    assert "(3,000,013 characters)" in error.traceback  # "ValueError: " + the text + "\\n"

    long_name = type("E" * 1_100_000, (Exception,), {})
    error = ErrorRecord.from_exception(long_name())
    assert len(error.exception_class_path) <= 500

    class Exits(Exception):
        def __str__(self):
            raise SystemExit(7)

    assert ErrorRecord.from_exception(Exits()).message == "<exception str() failed>"


def test_an_infinite_retry_delay_is_capped_and_the_job_runs_once(
        backend, start_worker, tmp_path):
    """Retry(delay=inf) overflowed the next attempt's datetime after the run: the outcome
    was never written, and the job ran again at every relist."""
    start_worker()
    marker = tmp_path / "ran"
    result = retries_never.submit(str(marker))

    def waiting():
        current = backend.get_result(result.id)
        return current.status == TaskResultStatus.READY and current.attempts == 1

    wait_until(waiting, 30, "the job back in READY after its first attempt")
    record = backend.store.read_status(result.id).record
    ahead = (record.retry_at - record.last_attempted_at).total_seconds()
    assert MAX_RETRY_DELAY - 60 <= ahead <= MAX_RETRY_DELAY + 60
    assert backend.store.client.exists(backend.store.waiting_path(record)) is not None
    assert marker.read_text() == "ran\n"


def test_a_retry_delay_of_nan_fails_the_job_after_one_run(backend, start_worker, tmp_path):
    start_worker()
    marker = tmp_path / "ran"
    done = retries_after_nan.submit(str(marker)).wait(timeout=30)
    assert done.status == TaskResultStatus.FAILED and done.attempts == 1
    assert marker.read_text() == "ran\n"


def test_a_misplaced_delayed_job_is_held_with_its_id_and_can_be_requeued(
        backend, start_worker, zk_client):
    """A delayed job's node in another shard was moved aside with no job id (so it could
    not be re-queued) and as an entry that expiry could delete: the only place the job
    waited."""
    from datetime import timedelta

    from django.utils import timezone

    from zktasks import deadletter
    from zktasks.tree import delayed_node_name

    layout = backend.store.layout
    # An hour ahead: re-queued, the job goes back to wait for it (it was sent to run at
    # once, its run_after cleared, by a re-queue that cleared every due time).
    due = timezone.now() + timedelta(hours=1)
    record, result = backend.prepare(tasks.add.using(run_after=due), (6, 1), {})
    name = delayed_node_name(int(record.run_after.timestamp() * 1000), record.priority,
                             record.id, record.queue)
    minute, second = layout.delayed_job(name).rsplit("/", 3)[1:3]
    wrong = layout.delayed_shard(minute, f"{int(second) - 7:010d}")
    backend.store.ensure_skeleton()
    zk_client.create(layout.status(record.id), record.to_bytes())
    zk_client.create(f"{wrong}/{name}", b"{}", makepath=True)
    start_worker()
    letter = wait_for_entry(backend, zk_client, f"{wrong}/{name}")
    assert letter.kind == "misplaced_job" and letter.job_id == record.id
    assert letter.kind in deadletter.HOLD_KINDS
    # Expiry keeps it while the job waits there, however old and whatever the limit.
    store = backend.store
    far_ahead = int((timezone.now() + timedelta(days=400)).timestamp() * 1000)
    assert deadletter.expire(store, fence=None, now_ms=far_ahead, ttl=1, limit=1)[2] == 1
    assert letter.name in {e.name for e in backend.dead_letters(10)}
    assert backend.stranded_job(letter).record.id == record.id
    assert backend.requeue_dead_letter(letter.name) == record.id
    back = store.read_status(record.id).record
    assert back.state == "READY" and back.run_after == record.run_after
    assert zk_client.exists(store.waiting_path(back))  # in its right place: delayed/
    assert "/delayed/" in store.waiting_path(back)
    assert backend.get_result(record.id).task.run_after == due


def test_a_registration_that_landed_on_an_expired_session_registers_afresh(
        backend, zk_hosts, start_worker, monkeypatch, caplog):
    """The registration multi landed, its answer was lost, and the session expired before
    kazoo reconnected. The resend failed on the assignments parent (which outlives
    sessions) and was taken for success: the worker went on under an identity whose
    ephemeral znode had gone with the old session, idle, and seen by nobody."""
    import zktasks.worker as worker_module

    caplog.set_level(logging.INFO, logger="zktasks.worker")
    layout = backend.store.layout
    original_start, lost = worker_module.start, []

    def start(client, options, **kwargs):
        client = original_start(client, options, **kwargs)
        transaction = client.transaction

        def losing():
            txn = transaction()
            commit = txn.commit

            def commit_then_lose():
                results = commit()
                registers = any(op.path.startswith(layout.workers + "/")
                                for op in txn.operations)
                if registers and not lost and not any(isinstance(r, Exception)
                                                      for r in results):
                    old = _expire(zk_hosts, client)
                    lost.append(old)
                    wait_until(lambda: client.connected and client.client_id is not None
                               and client.client_id[0] != old, 30, "a new session")
                    raise ConnectionLoss("the answer was lost (test)")
                return results

            txn.commit = commit_then_lose
            return txn

        client.transaction = losing
        return client

    monkeypatch.setattr(worker_module, "start", start)
    worker = start_worker()
    assert lost, "the registration's answer was not lost"
    stat = backend.store.client.exists(layout.worker(worker.worker_id))
    assert stat is not None and stat.ephemeralOwner == worker.client.client_id[0]
    assert tasks.add.submit(20, 22).wait(timeout=30).return_value == 42


def test_the_committer_never_puts_two_large_records_in_one_request(backend):
    """The batch limit was checked after adding: a RUNNING record of 400 KB and one of
    700 KB (each legal: a payload near MAX_RECORD_BYTES) went out in one multi over
    jute.maxbuffer, which the server answers by dropping the connection, at every
    retry."""
    from zktasks.committer import MAX_BATCH_BYTES, Commit, Committer

    committer = Committer(backend.store)
    commits = [Commit(worker_id="w", job_id=new_job_id(), version=0, start=b"x" * size)
               for size in (400_000, 700_000, 2)]
    with committer._cond:
        for commit in commits:
            committer._waiting[id(commit)] = commit
        batches = [[op.commit.job_id for op in committer._take()] for _ in range(3)]
    first, second, small = (c.job_id for c in commits)
    assert batches == [[first], [second], [small]]
    assert 400_000 < MAX_BATCH_BYTES < 400_000 + 700_000
