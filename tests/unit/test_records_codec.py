"""The status record's encoder and decoder, against json.dumps/json.loads' own results.

records.py encodes with a C encoder made once and, where every dict is in key order
already, without sorting; it decodes slot by slot. These tests hold them to what the
plain calls give (sort_keys=True, byte for byte) and to the decoder's checks.
"""

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from zktasks import envelope, records
from zktasks.exceptions import CorruptRecord
from zktasks.records import ErrorRecord, StatusRecord

KEY = "k" * 50
WHEN = datetime(2026, 12, 3, 19, 30, 5, 123456, tzinfo=UTC)


def _plain(record: StatusRecord) -> bytes:
    return json.dumps(record.to_json(), separators=(",", ":"), sort_keys=True).encode()


def _record(**changes) -> StatusRecord:
    base = StatusRecord(
        id="0" * 31 + "1", task="project.tasks.noop", backend="default", queue="default",
        priority=0, enqueued_at=WHEN, args_repr="()",
        payload=envelope.seal(b"\x80\x05call", job_id="0" * 31 + "1",
                              kind=envelope.PAYLOAD, key=KEY),
    )
    return base.evolve(**changes)


FAILED = ErrorRecord(exception_class_path="ValueError", message="ünïcode \U0001f600",
                     traceback="Traceback...\n", attempt=1, worker_id="w-1")
CASES = {
    "ready": {},
    "running": dict(state=records.RUNNING, attempts=1, worker_ids=("w-1",),
                    started_at=WHEN, last_attempted_at=WHEN + timedelta(seconds=1)),
    "succeeded": dict(state=records.SUCCESSFUL, finished_at=WHEN, result_repr="<obj>",
                      result=envelope.seal(b"N.", job_id="0" * 31 + "1",
                                           kind=envelope.RESULT, key=KEY)),
    "failed, retried": dict(state=records.READY, errors=(FAILED, FAILED), attempts=2,
                            retry_at=WHEN, timeout=2.5, result_ttl=60),
    "extra out of order": dict(extra={"zeta": 1, "alpha": [1, {"b": 2, "a": 1}]}),
    "extra in order": dict(extra={"attempts": 3, "task_path": "m.f"}),
    "foreign envelope": dict(payload={"mac": "m" * 64, "data": "AAAA", "alg": "sha256"}),
    "nested envelope": dict(payload={"data": "AAAA", "mac": {"b": 1, "a": 2}}),
    "other zone": dict(run_after=datetime(2026, 12, 3, 20, tzinfo=timezone(timedelta(hours=1)))),
    "unique": dict(unique_key="report:42", takes_context=True, max_attempts=5),
}


@pytest.mark.parametrize("changes", CASES.values(), ids=CASES.keys())
def test_a_record_encodes_as_json_dumps_with_sorted_keys_does(changes):
    record = _record(**changes)
    assert record.to_bytes() == _plain(record)
    assert StatusRecord.from_bytes(record.to_bytes()) == record
    again = StatusRecord.from_bytes(record.to_bytes())
    assert again.to_bytes() == record.to_bytes()  # decoded without a stale encoding


def test_small_records_encode_sorted_at_every_level():
    data = {"queue": "q", "node": "n", "assigned_at": 1.5, "nested": {"z": [1], "a": None}}
    assert records.dumps(data) == json.dumps(data, separators=(",", ":"),
                                             sort_keys=True).encode()
    with pytest.raises(TypeError, match="not JSON serializable"):
        records.dumps({"when": WHEN})


def test_fields_a_record_omits_take_their_defaults_and_unknown_keys_are_left_out():
    data = {"id": "a" * 32, "task": "m.f", "backend": "default", "queue": "q",
            "priority": 0, "state": "READY", "from_a_later_release": {"x": 1}}
    record = StatusRecord.from_bytes(json.dumps(data).encode(), path="/r/status/" + "a" * 32)
    assert record == StatusRecord(id="a" * 32, task="m.f", backend="default", queue="q",
                                  priority=0)
    assert record.extra == {} and record.extra is not StatusRecord.from_bytes(
        json.dumps(data).encode()).extra  # a dict of its own, as default_factory gives


@pytest.mark.parametrize("field", ["id", "task", "backend", "queue", "priority"])
def test_a_record_without_a_required_field_is_corrupt_and_says_which(field):
    data = json.loads(_record().to_bytes())
    del data[field]
    with pytest.raises(CorruptRecord, match=repr(field)):
        StatusRecord.from_bytes(json.dumps(data).encode())


WRONG = [
    ("priority", True), ("priority", 1.0), ("priority", 101), ("priority", None),
    ("attempts", -1), ("attempts", "1"), ("max_attempts", 0), ("max_attempts", False),
    ("timeout", 0), ("timeout", True), ("timeout", "5"), ("result_ttl", -1.0),
    ("takes_context", 0), ("takes_context", "false"), ("id", 7), ("task", None),
    ("queue", ["q"]), ("args_repr", None), ("extra", []), ("extra", None),
    ("result_repr", 3), ("unique_key", {}), ("payload", "x"), ("result", []),
    ("worker_ids", "w-1"), ("worker_ids", ["w", 1]), ("errors", {}), ("errors", ["e"]),
    ("enqueued_at", 5), ("run_after", "2026-01-01T00:00:00"), ("retry_at", "soon"),
]


@pytest.mark.parametrize("field, value", WRONG)
def test_a_field_of_the_wrong_shape_is_corrupt_and_named(field, value):
    data = json.loads(_record().to_bytes())
    data[field] = value
    with pytest.raises(CorruptRecord, match=repr(field)):
        StatusRecord.from_bytes(json.dumps(data).encode())


@pytest.mark.parametrize("field, value", [
    ("timeout", None), ("timeout", 0.5), ("timeout", 30), ("priority", -100),
    ("priority", 100), ("worker_ids", None), ("errors", None), ("result_repr", None),
    ("started_at", None), ("unique_key", None), ("payload", None),
])
def test_values_within_a_field_s_shape_are_read(field, value):
    data = json.loads(_record().to_bytes())
    data[field] = value
    record = StatusRecord.from_bytes(json.dumps(data).encode())
    expected = {"worker_ids": (), "errors": ()}.get(field, value) if value is None else value
    assert getattr(record, field) == expected


def test_a_wrong_error_inside_the_record_is_corrupt():
    data = json.loads(_record(errors=(FAILED,)).to_bytes())
    data["errors"][0]["attempt"] = "one"
    with pytest.raises(CorruptRecord, match="attempt"):
        StatusRecord.from_bytes(json.dumps(data).encode())
