"""Encode and decode the JSON records kept in znodes (status, job, assignment, worker).

Records are JSON a person can read with `zkCli.sh get`. Pickled parts (payload, result)
are signed envelopes (see envelope.py); errors are text, never pickles.
"""

import json
import math
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii

from .exceptions import CorruptRecord

try:
    from json.encoder import c_make_encoder
except ImportError:  # a Python without the _json accelerator
    c_make_encoder = None

SCHEMA = 1

READY = "READY"
RUNNING = "RUNNING"
SUCCESSFUL = "SUCCESSFUL"
FAILED = "FAILED"
STATES = (READY, RUNNING, SUCCESSFUL, FAILED)
FINISHED = frozenset({SUCCESSFUL, FAILED})

MAX_TRACEBACK_CHARS = 16_000
MAX_MESSAGE_CHARS = 2_000
# The same bounds in encoded bytes: records are ASCII JSON, where a character outside the
# BMP costs 12 bytes ("\\ud83d\\ude00"), so a message of 2,000 emoji took 24 KB.
MAX_TRACEBACK_BYTES = 32_000
MAX_MESSAGE_BYTES = 4_000
TRIMMED = "(trimmed: the record would have been over MAX_RECORD_BYTES)\n"
WORKER_LOST = "zktasks.exceptions.WorkerLost"  # the error of a run whose worker vanished
MAX_CLASS_PATH_CHARS = 500
KEEP_WORKER_IDS = 10  # the last workers a record too large for all of them names
# A piece of a formatted traceback longer than this (the exception's own text, which may
# be megabytes) is cut: keeping the traceback's end kept only that text, not a frame.
MAX_TRACEBACK_PIECE_CHARS = 4_000


def now() -> datetime:
    return datetime.now(UTC)


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


# isoformat() of UTC times, kept: each of a job's records is encoded at its transitions
# (RUNNING, then its outcome), and its enqueued, started and last-attempted times, the
# same between them, were formatted anew each time (2 % of a busy worker's CPU, bench
# --profile). Only UTC: an equal time in another zone is equal as a key, and would be
# written with the other's offset. Cleared when full, not evicted in order: at worst a
# time is formatted again.
_ISO: dict[datetime, str] = {}
_ISO_MAX = 4096


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not UTC:
        return value.isoformat()
    text = _ISO.get(value)
    if text is None:
        if len(_ISO) >= _ISO_MAX:
            _ISO.clear()
        text = _ISO[value] = value.isoformat()
    return text


def _refuse(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder(sort_keys: bool):
    """json.dumps(data, separators=(",", ":"), sort_keys=sort_keys), as str.

    The C encoder json.dumps uses, made once: json.dumps makes a JSONEncoder and then a
    C encoder for every call, 3-5 µs of a status record's 16 (the 2-CPU VM), and a busy
    worker encodes two records per job. The arguments are JSONEncoder.iterencode's
    (the same in 3.12 and 3.13); no circular check: records are trees of plain data.
    """
    plain = json.JSONEncoder(separators=(",", ":"), sort_keys=sort_keys).encode
    if c_make_encoder is None:
        return plain
    try:
        encode = c_make_encoder(None, _refuse, encode_basestring_ascii, None, ":", ",",
                                sort_keys, False, True)
        fast = lambda data: "".join(encode(data, 0))  # noqa: E731
        # A Python whose private encoder takes other arguments (or gives other text)
        # falls back to the public one rather than failing at import.
        sample = {"b": [1.5, None, True, "é\n"], "a": {"d": 2, "c": "x"}}
        if fast(sample) != plain(sample):
            return plain
    except TypeError:
        return plain
    return fast


_encode_sorted = _json_encoder(True)
# For dicts whose keys are in order already at every level (_in_order): sorting the
# items of a status record and its envelope took as long as encoding them.
_encode_as_is = _json_encoder(False)


def _in_order(data: dict) -> bool:
    """Whether a dict of a record (an envelope, `extra`) has its keys sorted and holds
    no dict or list: then it encodes as json.dumps(sort_keys=True) would, as it is."""
    last = ""
    for key, value in data.items():
        if type(key) is not str or key < last or type(value) in (dict, list):
            return False
        last = key
    return True


def clip(text: str, chars: int, encoded: int, *, keep_end: bool = False) -> str:
    """`text` cut to at most `chars` characters and `encoded` bytes of JSON (its start,
    or its end with `keep_end`: a traceback's last frames say the most)."""
    text = text[-chars:] if keep_end else text[:chars]
    while len(text) > 1 and len(json.dumps(text)) > encoded:
        keep = max(1, len(text) * encoded // len(json.dumps(text)) - 8)
        text = text[-keep:] if keep_end else text[:keep]
    return text


def encodable(text: str) -> str:
    """`text` with lone surrogates written as escapes ('\\udce9'). They come from
    os.fsdecode() of a file name that is not UTF-8, or JSON's "\\ud83d", and no UTF-8
    page or terminal can show them: one in an error message made the job page and the
    whole Results list answer 500, and `zktasks show` exit with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
        # BaseException: a __str__ raising SystemExit ended the thread-pool runner that
        # recorded it, and the job stayed RUNNING.
        except BaseException:  # a task's exception with a broken __str__ is still its failure
            message = "<exception str() failed>"  # what the traceback module writes
        pieces = traceback.TracebackException.from_exception(exc).format()
        text = "".join(
            piece if len(piece) <= MAX_TRACEBACK_PIECE_CHARS else
            f"{piece[:MAX_TRACEBACK_PIECE_CHARS]}… ({len(piece):,} characters)\n"
            for piece in pieces)
        return cls(
            exception_class_path=clip(f"{kind.__module__}.{kind.__qualname__}",
                                      MAX_CLASS_PATH_CHARS, 2 * MAX_CLASS_PATH_CHARS),
            message=clip(encodable(message), MAX_MESSAGE_CHARS, MAX_MESSAGE_BYTES),
            traceback=clip(encodable(text), MAX_TRACEBACK_CHARS, MAX_TRACEBACK_BYTES,
                           keep_end=True),
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
    run_after: datetime | None = None  # the task's own, as submitted (TaskResult.task)
    retry_at: datetime | None = None   # when a retry's backoff ends; None: not backing off
    attempts: int = 0
    worker_ids: tuple[str, ...] = ()
    errors: tuple[ErrorRecord, ...] = ()
    max_attempts: int = 1
    timeout: float | None = None
    takes_context: bool = False
    args_repr: str = ""
    result_repr: str | None = None  # a return value that is not plain data, for people
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

    @property
    def due_at(self) -> datetime | None:
        """When a READY job may run: its retry's backoff, else its run_after."""
        return self.retry_at if self.retry_at is not None else self.run_after

    def evolve(self, **changes) -> "StatusRecord":
        """A copy with `changes` (fields of the record), `_encoded` unset.

        Not dataclasses.replace: it walks fields() and calls the frozen __init__ with
        every field as a keyword, and a job is evolved two or three times (RUNNING, its
        outcome, fit()): 2 % + 1.9 % of a busy worker's CPU (bench --profile). The
        slots' own descriptors copy the fields, in half the time (9.8 against 18.8 µs on
        the 2-CPU VM); what replace() refuses, this does too.
        """
        unknown = changes.keys() - _STATUS_FIELDS
        if unknown:
            raise TypeError(f"StatusRecord has no field {min(unknown)!r} to change")
        copy = _new_record(StatusRecord)
        for read, write in _STATUS_SLOTS:
            write(copy, read(self))
        for name, value in changes.items():
            _set_attr(copy, name, value)
        _set_attr(copy, "_encoded", None)
        return copy

    def fit(self, limit: int) -> "StatusRecord":
        """This record, its errors' text trimmed until it encodes in `limit` bytes.

        A job's errors add up over its attempts (each up to MAX_TRACEBACK_BYTES), and a
        record over ZooKeeper's jute.maxbuffer is not refused but answered by dropping
        the connection: the outcome could never be written. The older tracebacks go
        first, then the older messages, then the last traceback and message. Then the
        older errors but those of lost workers (counted: MAX_WORKER_LOSSES) are dropped:
        a job near MAX_RECORD_BYTES that failed over and over outgrew ZooKeeper's limit,
        and its worker's connection dropped at every try to write it. A record that
        still does not fit is one whose payload leaves no room.
        """
        record = self
        if len(record.to_bytes()) <= limit or not record.errors:
            return record
        *older, last = record.errors
        steps = (
            lambda: ([replace(e, traceback=TRIMMED) for e in older], last),
            lambda: ([replace(e, traceback=TRIMMED, message=clip(e.message, 200, 400))
                      for e in older], last),
            lambda: (older, replace(last, traceback=clip(last.traceback, 2_000, 4_000,
                                                         keep_end=True))),
            lambda: (older, replace(last, traceback=TRIMMED, message=clip(last.message, 200,
                                                                          400))),
            lambda: ([e for e in older if e.exception_class_path == WORKER_LOST], last),
        )
        for step in steps:
            older, last = step()
            record = self.evolve(errors=(*older, last))
            if len(record.to_bytes()) <= limit:
                break
        else:
            if len(record.worker_ids) > KEEP_WORKER_IDS:
                # One id per attempt, never trimmed: 116 attempts of a 60-character
                # worker name took a record near the limit over jute.maxbuffer.
                record = record.evolve(worker_ids=record.worker_ids[-KEEP_WORKER_IDS:])
        return record

    def to_json(self) -> dict:
        """The record as JSON data, its keys (and its errors' keys) in sorted order.

        Not dataclasses.asdict: it deep-copies the payload and result envelopes, which
        cost more than the rest of a job's bookkeeping (bench --profile). Nothing here
        is mutated: json.dumps reads it once.
        """
        data = {name: getattr(self, name) for name in _JSON_KEYS}  # "v" reads SCHEMA
        for key in _TIME_FIELDS:
            data[key] = _iso(data[key])
        data["worker_ids"] = list(self.worker_ids)
        data["errors"] = [{name: getattr(e, name) for name in _ERROR_KEYS}
                          for e in self.errors]
        # Written only when set, so that records without them stay readable by a release
        # that predates the field (rolling upgrades; it leaves out keys it does not know).
        if self.result_ttl is None:
            del data["result_ttl"]
        if self.retry_at is None:
            del data["retry_at"]
        if self.result_repr is None:
            del data["result_repr"]
        return data

    def to_bytes(self) -> bytes:
        """The record as compact JSON with sorted keys: json.dumps(self.to_json(),
        sort_keys=True), byte for byte."""
        encoded = self._encoded
        if encoded is None:
            data = self.to_json()
            # to_json() sorts its own keys; the envelopes and `extra` come sorted from
            # seal() and from records read back, and are checked. Errors' text only.
            nested_in_order = all(value is None or _in_order(value) for value in (
                self.payload, self.result, self.extra))
            encode = _encode_as_is if nested_in_order else _encode_sorted
            encoded = encode(data).encode()
            object.__setattr__(self, "_encoded", encoded)  # frozen: set once, never changed
        return encoded

    @property
    def v(self) -> int:
        """The schema version written with the record (its "v" key)."""
        return SCHEMA

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
            # Keys this release does not know are left out, not taken for corruption: a
            # newer release may add an optional field during a rolling upgrade, and
            # failing its jobs as corrupt would replace them with placeholders.
            #
            # Built as evolve() builds its copy, slot by slot, checking each field on the
            # way: the frozen __init__ with every field as a keyword took a third of a
            # decode (12 of 34 µs on the 2-CPU VM), and a worker decodes every job it
            # is given.
            record = _new_record(cls)
            get = data.get
            for name, kinds, fits, convert, default, write in _DECODING:
                value = get(name, _ABSENT)
                if value is _ABSENT:
                    if default is _REQUIRED:
                        raise ValueError(f"its {name!r} is missing")
                    value = default() if default is dict else default
                elif type(value) not in kinds or (fits is not None and not fits(value)):
                    # type(), not isinstance(): json.loads makes no subclasses, and a
                    # bool is an int to isinstance() ("priority": true).
                    raise ValueError(f"its {name!r} is {printable(repr(value))[:80]}")
                elif convert is not None:
                    value = convert(name, value)
                write(record, value)
            _set_attr(record, "_encoded", None)
            return record
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            # RecursionError: JSON nested thousands deep ("[[[[..."), which json.loads
            # gives up on that way; it is garbage like any other.
            raise CorruptRecord(
                f"The znode {path or '(status)'} does not hold a zktasks status record: {exc}."
            ) from exc


_STATUS_FIELDS = frozenset(f.name for f in fields(StatusRecord) if f.init)
_JSON_KEYS = tuple(sorted(_STATUS_FIELDS | {"v"}))  # to_json()'s, in the order written
# (get, set) of each field's slot descriptor, for evolve(): a descriptor's __set__ writes
# the slot past the frozen class's __setattr__, as object.__setattr__ (its __init__'s way)
# does for the changed fields.
_STATUS_SLOTS = tuple((getattr(StatusRecord, name).__get__, getattr(StatusRecord, name).__set__)
                      for name in sorted(_STATUS_FIELDS))
_new_record = object.__new__
_set_attr = object.__setattr__
_TIME_FIELDS = ("enqueued_at", "started_at", "finished_at", "last_attempted_at", "run_after",
                "retry_at")
_ERROR_FIELDS = frozenset(f.name for f in fields(ErrorRecord))
_ERROR_KEYS = tuple(sorted(_ERROR_FIELDS))


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(value) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                             and math.isfinite(value) and value > 0)


# What the pages, the leader and the worker use as such without checking it again: a
# wrong type here (a hand edit, a foreign writer) would otherwise fail later, in a place
# that cannot say which record is at fault ("priority": null broke a worker's intake).
# Per field: the JSON types it may have (exactly: json.loads makes no subclasses), and a
# check of its value beyond the type, or None.
_NONE = type(None)
_STR, _OPTIONAL_STR = frozenset({str}), frozenset({str, _NONE})
_SHAPES = {
    "id": (_STR, None), "task": (_STR, None), "backend": (_STR, None),
    "queue": (_STR, None), "state": (_STR, None), "args_repr": (_STR, None),
    "extra": (frozenset({dict}), None),
    "result_repr": (_OPTIONAL_STR, None), "unique_key": (_OPTIONAL_STR, None),
    "priority": (frozenset({int}), lambda v: -100 <= v <= 100),
    "attempts": (frozenset({int}), lambda v: v >= 0),
    "max_attempts": (frozenset({int}), lambda v: v >= 1),
    "timeout": (frozenset({int, float, _NONE}), lambda v: v is None or _seconds(v)),
    "result_ttl": (frozenset({int, float, _NONE}), lambda v: v is None or _seconds(v)),
    "takes_context": (frozenset({bool}), None),
    "payload": (frozenset({dict, _NONE}), None),
    "result": (frozenset({dict, _NONE}), None),
    "worker_ids": (frozenset({list, _NONE}),
                   lambda v: v is None or all(type(w) is str for w in v)),
    "errors": (frozenset({list, _NONE}),
               lambda v: v is None or all(type(e) is dict for e in v)),
    **{key: (_OPTIONAL_STR, None) for key in _TIME_FIELDS},
}
_ERROR_SHAPES = {
    "exception_class_path": str, "message": str, "traceback": str, "worker_id": str,
}
_ABSENT = object()     # a key the record does not have
_REQUIRED = object()   # the default of a field without one


def _default(f):
    if f.default_factory is not MISSING:
        if f.default_factory is not dict:
            raise TypeError(f"from_bytes builds no default of {f.name!r}")  # at import
        return dict
    return _REQUIRED if f.default is MISSING else f.default


def _aware(key: str, value: str | None) -> datetime | None:
    try:
        found = _dt(value)
    except ValueError:
        raise ValueError(f"its {key!r} is not a time: {printable(repr(value))[:80]}") from None
    if found is not None and found.utcoffset() is None:
        raise ValueError(f"its {key!r} has no time zone")
    return found


def _error(data: dict) -> ErrorRecord:
    data = {key: value for key, value in data.items() if key in _ERROR_FIELDS}
    for key, kind in _ERROR_SHAPES.items():
        if key in data and not isinstance(data[key], kind):
            raise ValueError(f"an error's {key!r} is a {type(data[key]).__name__}")
    if "attempt" in data and not _whole(data["attempt"]):
        raise ValueError("an error's 'attempt' is not a whole number")
    for key in ("message", "traceback", "exception_class_path", "worker_id"):
        if key in data:  # written before encodable() was, or by hand
            data[key] = encodable(data[key])
    return ErrorRecord(**data)


# (name, types, check, convert, default, set) of each field, for from_bytes(); convert
# turns the JSON value into the field's (a time, a tuple), given the name for its error.
_CONVERT = {
    **{key: _aware for key in _TIME_FIELDS},
    "worker_ids": lambda _, v: tuple(v or ()),
    "errors": lambda _, v: tuple(_error(e) for e in v or ()),
}
_DECODING = tuple(
    (f.name, *_SHAPES[f.name], _CONVERT.get(f.name), _default(f),
     getattr(StatusRecord, f.name).__set__)
    for f in fields(StatusRecord) if f.init
)
if {d[0] for d in _DECODING} != _SHAPES.keys():  # a field added without its shape
    raise TypeError("records._SHAPES and StatusRecord's fields differ")


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
    """Encode a small record (job, assignment, worker) as compact JSON, keys sorted."""
    return _encode_sorted(data).encode()


def loads(raw: bytes | None, *, path: str = "") -> dict:
    """Decode a small record, raising CorruptRecord if it is not a JSON object."""
    try:
        data = json.loads(raw or b"")
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise CorruptRecord(f"The znode {path} does not hold JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise CorruptRecord(f"The znode {path} does not hold a JSON object.")
    return data
