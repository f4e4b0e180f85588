"""The read model's pure parts (no ZooKeeper): previews, reprs, index names, history."""

import json
from datetime import UTC, datetime

from zktasks import dashboard, envelope
from zktasks.records import ErrorRecord, StatusRecord


def test_preview_pretty_prints_json_and_hides_signed_envelopes():
    sealed = envelope.seal(b"x" * 1234, job_id="a" * 32, kind="payload", key="k")
    raw = json.dumps({"state": "READY", "payload": sealed, "result": None}).encode()
    shown = dashboard.preview(raw)
    assert shown["kind"] == "json"
    assert '"state": "READY"' in shown["text"]
    assert "<signed dill, 1,234 bytes, not shown>" in shown["text"]
    assert sealed["mac"] not in shown["text"] and sealed["data"][:20] not in shown["text"]


def test_preview_of_text_binary_and_empty_data():
    assert dashboard.preview(b"")["kind"] == "empty"
    assert dashboard.preview(b"\x00\x01\xff") == {"kind": "binary", "text": "", "size": 3}
    assert dashboard.preview(b"worker-1")["text"] == "worker-1"
    assert dashboard.preview(b"a\x01b")["kind"] == "binary"  # control bytes: not text
    long = dashboard.preview(b"x" * 100_000, limit=10)
    assert long["truncated"] and len(long["text"]) == 10


def test_short_repr_bounds_size_and_survives_a_hostile_repr():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

    assert "Hostile" in dashboard.short_repr(Hostile())  # no exception reaches the page
    nested = [[["x" * 10_000] * 100] * 100] * 100
    assert len(dashboard.short_repr(nested)) <= dashboard.REPR_LIMIT
    text = dashboard.call_repr((1, "two"), {"three": [3]})
    assert text == "1, 'two', three=[3]"


def test_finished_index_names_are_parsed_with_or_without_a_queue():
    job = "0" * 32
    assert dashboard.parse_finished_entry(f"{job}.S") == (job, "S", None)
    assert dashboard.parse_finished_entry(f"{job}.F.emails") == (job, "F", "emails")
    assert dashboard.parse_finished_entry("garbage") is None
    assert dashboard.parse_finished_entry(f"{job}.X") is None
    bucket = dashboard._count_bucket([f"{'1' * 32}.S.a", f"{'2' * 32}.F.a", f"{job}.F", "x"])
    assert (bucket.succeeded, bucket.failed) == (1, 2)
    assert bucket.failed_ids == ("2" * 32, job)
    assert bucket.per_queue == {"a": [1, 1]}


def test_election_order_follows_the_sequence_number_not_the_uuid():
    names = ["ffff__lock__0000000002", "0000__lock__0000000010", "aaaa__lock__0000000001"]
    assert min(names, key=dashboard.election_order) == "aaaa__lock__0000000001"


def test_history_tells_the_story_of_a_record():
    t = datetime(2030, 1, 1, tzinfo=UTC)
    record = StatusRecord(
        id="0" * 32, task="app.t", backend="default", queue="default", priority=0,
        state="SUCCESSFUL", enqueued_at=t, started_at=t, last_attempted_at=t,
        finished_at=t, attempts=2, worker_ids=("w1", "w2"),
        errors=(ErrorRecord(exception_class_path="zktasks.exceptions.WorkerLost",
                            message="gone", traceback="", attempt=1, worker_id="w1"),),
    )
    steps = [what for _, what in dashboard.history(record)]
    assert steps == [
        "enqueued on queue 'default' with priority 0",
        "attempt 1 started on w1",
        "attempt 1 on w1 ended with zktasks.exceptions.WorkerLost",
        "attempt 2 started on w2",
        "finished: SUCCESSFUL",
    ]


def test_durations_read_well():
    t = datetime(2030, 1, 1, tzinfo=UTC)
    from datetime import timedelta

    assert dashboard.duration(t, t + timedelta(milliseconds=45)) == "45 ms"
    assert dashboard.duration(t, t + timedelta(seconds=3.21)) == "3.2 s"
    assert dashboard.duration(t, t + timedelta(seconds=245)) == "4 min 5 s"
    assert dashboard.duration(t, t + timedelta(hours=2, minutes=3)) == "2 h 3 min"
    assert dashboard.duration(None, t) == ""


def test_history_puts_each_requeue_after_the_attempt_it_followed():
    t = datetime(2030, 1, 1, tzinfo=UTC)

    def failed(attempt):
        return ErrorRecord(exception_class_path="app.Boom", message="", traceback="",
                           attempt=attempt, worker_id=f"w{attempt}")

    record = StatusRecord(
        id="0" * 32, task="app.t", backend="default", queue="default", priority=0,
        state="FAILED", enqueued_at=t, started_at=t, last_attempted_at=t, finished_at=t,
        attempts=3, max_attempts=1, worker_ids=("w1", "w2", "w3"),
        errors=(failed(1), failed(2), failed(3)),
        extra={"requeued": [{"at": t.isoformat(), "kind": "retry", "attempts": 1},
                            {"at": t.isoformat(), "kind": "lost", "attempts": 2}]},
    )
    steps = [what for _, what in dashboard.history(record)]
    assert steps == [
        "enqueued on queue 'default' with priority 0",
        "attempt 1 started on w1",
        "attempt 1 on w1 ended with app.Boom",
        "retried",
        "attempt 2 on w2 ended with app.Boom",
        "re-queued from the dead letters (lost)",
        "attempt 3 started on w3",
        "attempt 3 on w3 ended with app.Boom",
        "finished: FAILED",
    ]


def test_attempts_past_the_limit_say_they_were_not_failures_retried():
    record = StatusRecord(id="0" * 32, task="app.t", backend="default", queue="default",
                          priority=0, attempts=1, max_attempts=3)
    assert dashboard.attempts_text(record) == "1 of at most 3"
    past = record.evolve(attempts=3, max_attempts=1)
    assert dashboard.attempts_text(past).startswith("3 (max_attempts 1: the starts past it")


def test_history_shows_a_retry_backing_off_after_the_attempt_it_retries():
    from datetime import timedelta

    t = datetime(2030, 1, 1, tzinfo=UTC)
    record = StatusRecord(
        id="0" * 32, task="app.t", backend="default", queue="default", priority=0,
        state="READY", enqueued_at=t, started_at=t, attempts=1, max_attempts=3,
        worker_ids=("w1",), retry_at=t + timedelta(seconds=5),
        errors=(ErrorRecord(exception_class_path="app.Boom", message="", traceback="",
                            attempt=1, worker_id="w1"),),
    )
    assert record.due_at == t + timedelta(seconds=5) and record.run_after is None
    assert StatusRecord.from_bytes(record.to_bytes()) == record
    steps = [what for _, what in dashboard.history(record)]
    assert steps == [
        "enqueued on queue 'default' with priority 0",
        "attempt 1 started on w1",
        "attempt 1 on w1 ended with app.Boom",
        "retry due (backoff)",
        "waiting to run",
    ]
