"""Encode and decode the JSON records kept in znodes (status, job, assignment, worker).

Records are JSON a person can read with `zkCli.sh get`. Pickled parts (payload, result)
are signed envelopes (see envelope.py); errors are text, never pickles.
"""

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime

from .exceptions import CorruptRecord

SCHEMA = 1

READY = "READY"
RUNNING = "RUNNING"
SUCCESSFUL = "SUCCESSFUL"
FAILED = "FAILED"
STATES = (READY, RUNNING, SUCCESSFUL, FAILED)
FINISHED = frozenset({SUCCESSFUL, FAILED})

MAX_TRACEBACK_CHARS = 16_000


def now() -> datetime:
    return datetime.now(UTC)


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorRecord:
    exception_class_path: str
    message: str
    traceback: str
    attempt: int = 0
    worker_id: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException, *, attempt=0, worker_id="") -> "ErrorRecord":
        import traceback

        kind = type(exc)
        try:
            message = str(exc)
        except Exception:  # a task's exception with a broken __str__ is still its failure
            message = "<exception str() failed>"  # what the traceback module writes
        return cls(
            exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
            message=message[:2000],
            traceback="".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:],
            attempt=attempt,
            worker_id=worker_id,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRecord:
    """The state of one job: /status/{job_id}."""

    id: str
    task: str                      # dotted path of the task function (display, lookup)
    backend: str
    queue: str
    priority: int
    state: str = READY
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_attempted_at: datetime | None = None
    run_after: datetime | None = None
    attempts: int = 0
    worker_ids: tuple[str, ...] = ()
    errors: tuple[ErrorRecord, ...] = ()
    max_attempts: int = 1
    timeout: float | None = None
    takes_context: bool = False
    args_repr: str = ""
    unique_key: str | None = None
    result_ttl: float | None = None  # seconds the finished record is kept; None: RESULT_TTL
    payload: dict | None = None    # signed envelope of the call (function, args, kwargs)
    result: dict | None = None     # signed envelope of the return value
    extra: dict = field(default_factory=dict)
    # to_bytes(), kept: a record is checked for size and then written (submit, outcome),
    # and each JSON encoding of one holding a payload costs about 2 % of a job's CPU.
    # Not a field of the record: evolve() starts the copy without it.
    _encoded: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED

    def evolve(self, **changes) -> "StatusRecord":
        return replace(self, **changes)

    def to_json(self) -> dict:
        # Not dataclasses.asdict: it deep-copies the payload and result envelopes, which
        # cost more than the rest of a job's bookkeeping (bench --profile). Nothing here
        # is mutated: json.dumps reads it once.
        data = {name: getattr(self, name) for name in _STATUS_FIELDS}
        for key in _TIME_FIELDS:
            data[key] = _iso(data[key])
        data["worker_ids"] = list(self.worker_ids)
        data["errors"] = [asdict(e) for e in self.errors]
        if self.result_ttl is None:
            # Written only when set, so records of tasks without their own TTL stay
            # readable by a release that predates the field (rolling upgrades).
            del data["result_ttl"]
        data["v"] = SCHEMA
        return data

    def to_bytes(self) -> bytes:
        encoded = self._encoded
        if encoded is None:
            encoded = json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()
            object.__setattr__(self, "_encoded", encoded)  # frozen: set once, never changed
        return encoded

    @classmethod
    def from_bytes(cls, raw: bytes | None, *, path: str = "") -> "StatusRecord":
        """Decode a status record; `path`, when given, is its znode ({ROOT}/status/{id}),
        and the record must be that job's: a record copied whole from another job would
        otherwise pass the signature checks, which bind the id the record states."""
        try:
            data = json.loads(raw or b"")
            if not isinstance(data, dict) or data.get("state") not in STATES:
                raise ValueError("not a status record")
            if path and data.get("id") != path.rpartition("/")[2]:
                raise ValueError(f"its id {data.get('id')!r} is not the job id of its znode")
            for key, kinds in _SHAPES.items():
                if key in data and not isinstance(data[key], kinds):
                    raise ValueError(f"its {key!r} is a {type(data[key]).__name__}")
            data.pop("v", None)
            for key in ("enqueued_at", "started_at", "finished_at", "last_attempted_at",
                        "run_after"):
                data[key] = _dt(data.get(key))
            data["worker_ids"] = tuple(data.get("worker_ids") or ())
            data["errors"] = tuple(ErrorRecord(**e) for e in data.get("errors") or ())
            return cls(**data)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptRecord(
                f"The znode {path or '(status)'} does not hold a zktasks status record: {exc}."
            ) from exc


_STATUS_FIELDS = tuple(f.name for f in fields(StatusRecord) if f.init)
# What the pages and the worker use as such without checking it again.
_SHAPES = {
    "id": str, "task": str, "queue": str, "args_repr": str, "extra": dict,
    "payload": (dict, type(None)), "result": (dict, type(None)),
    "worker_ids": (list, type(None)), "errors": (list, type(None)),
}
_TIME_FIELDS = ("enqueued_at", "started_at", "finished_at", "last_attempted_at", "run_after")


# Control characters but newline and tab. Error messages and tracebacks are the tasks'
# text, often made of user input: raw, their escape sequences would reach an operator's
# terminal (retitle it, clear it, fake output) from the shell command or a log line.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str, *, one_line: bool = False) -> str:
    """`text` with control characters shown as escapes (\\x1b), for a terminal; with
    `one_line`, newlines too (a log line that cannot pass for several)."""
    pattern = _CONTROL_OR_NEWLINE if one_line else _CONTROL
    return pattern.sub(lambda m: repr(m.group())[1:-1], text)


def dumps(data: dict) -> bytes:
    """Encode a small record (job, assignment, worker) as compact JSON."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def loads(raw: bytes | None, *, path: str = "") -> dict:
    """Decode a small record, raising CorruptRecord if it is not a JSON object."""
    try:
        data = json.loads(raw or b"")
    except ValueError as exc:
        raise CorruptRecord(f"The znode {path} does not hold JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise CorruptRecord(f"The znode {path} does not hold a JSON object.")
    return data
