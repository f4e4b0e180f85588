"""Read the zktasks tree for the admin dashboard: page reads and a live per-process cache.

Pages read ZooKeeper directly, one page at a time: pipelined async reads, cursors on
sorted znode names, the finished index for results (never a listing of status/).

The live endpoint reads nothing per request. `LiveState` keeps the overview numbers in
memory, fed by one-shot watches whose callbacks only mark what changed under a lock
(kazoo's event thread never reads and never blocks, rule 5). Its own thread re-reads the
marked paths, at most once a second each, and only while somebody polls; after a
disconnection it re-reads everything. Why not kazoo's ChildrenWatch: it re-lists on
kazoo's thread after every change, which for a queue of 20,000 names is a megabyte per
submitted job; a mark-then-read thread coalesces a burst into one read.

Nothing here unpickles: a job's arguments and return value come from
`backend.get_result`, which verifies their signatures first; raw znode data is shown as
JSON with the signed envelopes replaced by their size.
"""

import base64
import binascii
import json
import logging
import os
import reprlib
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState

from . import envelope, records, schedule_state, serialization
from .client import get_client
from .exceptions import CorruptRecord, PayloadVerificationError, ZooKeeperUnavailableError
from .records import StatusRecord
from .schedules import tick_job_id
from .store import TRANSIENT, Store
from .task import UnloadableValue
from .tree import (
    BUCKET_MS,
    bucket_start,
    delayed_shards,
    finished_bucket,
    finished_entry,
    finished_leaf,
    finished_leaves,
    is_delayed_shard,
    parse_bucket,
    parse_delayed_node,
    parse_finished_entry,
    parse_job_node,
    parse_shard,
    shard_of,
)

logger = logging.getLogger(__name__)

READ_DEADLINE = 3.0      # seconds a page waits for ZooKeeper before showing the banner
CONNECT_WAIT = 3.0       # seconds a request waits for a connection being made
PAGE_SIZE = 50
SCAN_BUDGET = 2_000      # status records a filtered results page reads at most
LIST_BUDGET = 1_000      # finished-index buckets a results page lists at most
DELAYED_BUDGET = 20_000  # delayed job names a queue-filtered delayed page looks at most
ASYNC_BATCH = 200        # async requests in flight at once
REPR_LIMIT = 2_000       # characters of a shown repr()
PREVIEW_LIMIT = 64_000   # characters of a znode's data shown in the tree browser
THROUGHPUT_MINUTES = 10
RECENT_FAILURES = 10
SCHEDULE_GRACE = timedelta(seconds=15)  # a next tick this far past is shown as overdue

UNAVAILABLE = (ZooKeeperUnavailableError, KazooException, KazooTimeoutError, ConnectionError)

# -- connecting without blocking a request ---------------------------------------------

_connect_lock = threading.Lock()
_connect_pool: tuple[int, ThreadPoolExecutor] | None = None
_connecting: dict[tuple, Future] = {}
_last_failure: dict[tuple, BaseException] = {}  # why the last connection attempt failed


def connect(conf, *, wait: float = CONNECT_WAIT):
    """Return this process's started client for `conf`, waiting at most `wait` seconds.

    get_client blocks for CONNECT_TIMEOUT while ZooKeeper is down; a page must not, so
    the connection is made on a helper thread and requests show a banner meanwhile.
    """
    global _connect_pool
    key = (os.getpid(), conf.client_key)
    with _connect_lock:
        if _connect_pool is None or _connect_pool[0] != os.getpid():
            _connect_pool = (os.getpid(), ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="zktasks-dashboard-connect"))
            _connecting.clear()
            _last_failure.clear()
        future = _connecting.get(key)
        if future is None or future.done():
            if future is not None and not future.cancelled() and future.exception():
                _last_failure[key] = future.exception()  # said while trying again
            future = _connect_pool[1].submit(get_client, conf)
            _connecting[key] = future
        failed = _last_failure.get(key)
    try:
        client = future.result(timeout=wait)
    except FutureTimeout:
        # A page that only ever said "still connecting" hid why the last attempt failed
        # (a refused TLS handshake, a wrong HOSTS): say it while trying again.
        said = (f"The last attempt failed: {failed} Trying again; " if failed
                else f"Still connecting to ZooKeeper at {conf.hosts!r}; ")
        raise ZooKeeperUnavailableError(
            said + "this page shows the tree once it answers.") from None
    with _connect_lock:
        _last_failure.pop(key, None)
    if not client.connected:
        raise ZooKeeperUnavailableError(
            f"The connection to ZooKeeper at {conf.hosts!r} is down ({client.state}); "
            "reconnecting."
        )
    return client


def describe(exc: BaseException) -> str:
    """Say in one sentence why ZooKeeper could not be read."""
    if isinstance(exc, ZooKeeperUnavailableError):
        return str(exc)
    if isinstance(exc, NoAuthError):
        return ("ZooKeeper refused the read (NoAuth): this site's AUTH credentials do not "
                "match the ACL of the tree.")
    return f"ZooKeeper could not be read ({type(exc).__name__}: {exc})."


# -- small pure helpers ------------------------------------------------------------------

_repr = reprlib.Repr(maxlevel=4, maxtuple=20, maxlist=20, maxarray=20, maxdict=20,
                     maxset=20, maxfrozenset=20, maxdeque=20, maxstring=400, maxlong=100,
                     maxother=400)


def _time(value) -> datetime | None:
    """An ISO time written into a record; None when absent or not one."""
    try:
        return datetime.fromisoformat(value) if value else None
    except (TypeError, ValueError):
        return None


def short_repr(value, limit: int = REPR_LIMIT) -> str:
    """repr() bounded in depth and length; never raises (a hostile __repr__ included)."""
    try:
        text = _repr.repr(value)
    except Exception as exc:
        text = f"<{type(value).__qualname__}: repr() failed: {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_repr(args, kwargs, limit: int = REPR_LIMIT) -> str:
    parts = [short_repr(a, 400) for a in args]
    parts += [f"{k}={short_repr(v, 400)}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _holds_stand_ins(value, budget: int = 10_000) -> bool:
    """Whether serialization.Unloaded stand-ins are among peeked arguments."""
    stack = [value]
    while stack and budget > 0:
        budget -= 1
        item = stack.pop()
        if isinstance(item, serialization.Unloaded):
            return True
        if isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


def duration(start: datetime | None, end: datetime | None) -> str:
    """Say how long from start to end: "45 ms", "3.2 s", "4 min 5 s", "2 h 3 min"."""
    if start is None or end is None:
        return ""
    seconds = max(0.0, (end - start).total_seconds())
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _not_taken_up(leading: datetime | bool | None, now: datetime) -> str:
    """Why a configured schedule has no state yet, if it is late for one ("": not).
    `leading` is a ZooKeeper server's time, `now` this host's: a clock apart by more
    than SCHEDULE_GRACE says so early, or late, by the difference."""
    if leading is False:
        return "no worker leads, so nothing ticks: start `runworker`."
    if leading is None or leading > now - SCHEDULE_GRACE:
        return ""  # an election, or a leader that just took over: its first pass records it
    return ("no tick recorded since the leader took over at "
            f"{leading:%Y-%m-%d %H:%M:%S} UTC: it is not in the leader's SCHEDULES (every "
            "process must have the same), or its state cannot be written there (see the "
            "leader's log).")


def ms_to_datetime(ms: int | float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def took_over(stat) -> datetime:
    """When the leader whose election znode has `stat` took over: the znode is created
    when its owner starts contending, and a leader writes to it on winning, which
    moves mtime to that moment."""
    return ms_to_datetime(stat.mtime if stat.mtime > stat.ctime else stat.ctime)


def election_order(name: str) -> tuple[int, str]:
    """Sort key of kazoo Lock contenders: the sequence number after '__lock__'."""
    _, _, seq = name.rpartition("__lock__")
    return (int(seq), name) if seq.isdigit() else (1 << 62, name)


def stat_dict(stat) -> dict:
    return {
        "czxid": stat.czxid, "mzxid": stat.mzxid, "pzxid": stat.pzxid,
        "ctime": ms_to_datetime(stat.ctime), "mtime": ms_to_datetime(stat.mtime),
        "version": stat.version, "cversion": stat.cversion, "aversion": stat.aversion,
        "ephemeral_owner": f"0x{stat.ephemeralOwner:x}" if stat.ephemeralOwner else "",
        "data_length": stat.dataLength, "num_children": stat.numChildren,
    }


def _envelope_note(value) -> str | None:
    if isinstance(value, dict) and "mac" in value and "data" in value:
        try:
            size = len(base64.b64decode(str(value["data"]), validate=True))
        except (binascii.Error, ValueError):
            size = len(str(value["data"]))
        return f"<signed dill, {size:,} bytes, not shown>"
    return None


def preview(raw: bytes | None, limit: int = PREVIEW_LIMIT) -> dict:
    """Describe a znode's data for people: pretty JSON, text, or the size of binary data.

    Signed envelopes (a job's payload and result) are replaced by their size: they are
    pickles, and the web process neither loads nor shows them.
    """
    if not raw:
        return {"kind": "empty", "text": "", "size": 0}
    size = len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"kind": "binary", "text": "", "size": size}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
        if any(ord(c) < 32 and c not in "\t\r\n" for c in text[:4096]):
            return {"kind": "binary", "text": "", "size": size}
        truncated = len(text) > limit
        return {"kind": "text", "text": text[:limit], "size": size, "truncated": truncated}
    if isinstance(data, dict):
        data = {k: (_envelope_note(v) or v) if k in ("payload", "result") else v
                for k, v in data.items()}
    pretty = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    truncated = len(pretty) > limit
    return {"kind": "json", "text": pretty[:limit], "size": size, "truncated": truncated}


# -- values the pages show -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRow:
    id: str
    task: str = ""
    queue: str = ""
    state: str = ""
    priority: int | None = None
    enqueued_at: datetime | None = None
    due_at: datetime | None = None  # a READY job's run_after, or its retry's backoff
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    worker: str = ""
    error: str = ""
    note: str = ""

    @classmethod
    def from_record(cls, record: StatusRecord, **extra) -> "JobRow":
        error = record.errors[-1] if record.errors else None
        return cls(
            id=record.id, task=record.task, queue=record.queue, state=record.state,
            priority=record.priority, enqueued_at=record.enqueued_at,
            due_at=record.due_at, started_at=record.started_at,
            finished_at=record.finished_at, attempts=record.attempts,
            worker=record.worker_ids[-1] if record.worker_ids else "",
            error=f"{error.exception_class_path}: {error.message}"[:300] if error else "",
            **extra,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    rows: list
    next_cursor: str | None = None
    scanned: int = 0
    exhausted: bool = True
    total: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDetail:
    record: StatusRecord
    version: int
    verified: bool
    verification_error: str = ""
    args: str = ""
    args_note: str = ""
    return_value: str = ""
    result_note: str = ""   # why the value is not shown
    value_note: str = ""    # about the value shown (stand-ins in it)
    history: list = field(default_factory=list)
    places: list = field(default_factory=list)   # (label, znode path) where it is now
    waited: str = ""   # enqueued → first start
    ran: str = ""      # last start → finished


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    name: str
    configured: bool         # in OPTIONS['SCHEDULES'] (else: state left in the tree)
    task: str = ""
    when: str = ""           # "every 60 s", "cron 0 3 * * * (UTC)"
    call: str = ""           # its arguments
    last_tick: datetime | None = None   # the last tick recorded (that got its job)
    last_job: str = ""       # that tick's job id
    last_state: str = ""     # its state; "" when its record is gone (expired, or the
    #                          first tick, which only starts the schedule)
    next_tick: datetime | None = None
    overdue: bool = False    # the next tick is well past: no leader, or its ticks fail
    paused: bool = False     # paused by a person: no ticks until resumed
    paused_at: datetime | None = None
    error: str = ""          # why its last attempted tick failed (the leader notes it)
    error_at: datetime | None = None
    note: str = ""           # what is wrong with the recorded state itself


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    path: str
    relative: str
    stat: dict
    data: dict
    children: list          # (name, relative path, stat dict or None)
    next_cursor: str | None
    parents: list           # (name, relative path)


class Reader:
    """Reads for the dashboard's pages, through one connected client."""

    def __init__(self, backend, client=None):
        self.backend = backend
        self.conf = backend.conf
        self.client = client if client is not None else connect(self.conf)
        self.store = Store(self.client, self.conf)
        self.layout = self.store.layout

    # -- plumbing --------------------------------------------------------------------

    def get(self, path: str):
        """Return (data, stat) of a znode, or None if it does not exist."""
        # Bounded: a plain kazoo call waits for its answer without limit, and one sent
        # again after a dropped connection waited for as long as ZooKeeper was away.
        try:
            with self.store.bounded(READ_DEADLINE):
                return self.store.retry(self.store.client.get, path)
        except NoNodeError:
            return None

    def children(self, path: str) -> list[str]:
        try:
            with self.store.bounded(READ_DEADLINE):
                return self.store.retry(self.store.client.get_children, path)
        except NoNodeError:
            return []

    def get_many(self, paths: Iterable[str]) -> dict[str, tuple | None]:
        """Read many znodes with pipelined async requests; a missing one maps to None."""
        return _gather(self.client, list(paths), "get")

    def exists_many(self, paths: Iterable[str]) -> dict[str, object]:
        return _gather(self.client, list(paths), "exists")

    def statuses(self, job_ids: Iterable[str]) -> dict[str, StatusRecord | Exception | None]:
        """Read status records; a missing one maps to None, a corrupt one to its error."""
        paths = {self.layout.status(j): j for j in job_ids}
        out = {}
        for path, found in self.get_many(paths).items():
            if found is None:
                out[paths[path]] = None
                continue
            try:
                out[paths[path]] = StatusRecord.from_bytes(found[0], path=path)
            except CorruptRecord as exc:
                out[paths[path]] = exc
        return out

    # -- schedules -----------------------------------------------------------------------

    def _leading_since(self) -> datetime | bool | None:
        """When the current leader took over; False when no worker leads; None while
        an election is under way (the first contender went between the two reads)."""
        names = self.children(self.layout.leader)
        if not names:
            return False
        found = self.get(self.layout.election_node(min(names, key=election_order)))
        if found is None:
            return None
        return took_over(found[1])

    def schedules(self, now: datetime | None = None) -> list[ScheduleRow]:
        """Each schedule of OPTIONS['SCHEDULES'], and each one the tree still holds state
        for, with its last tick and that tick's job, its next tick, and the error its
        last attempted tick failed with (the leader keeps it in the schedule's znode)."""
        now = now or records.now()
        configured = {s.name: s for s in self.conf.schedules}
        names = sorted(set(configured) | set(self.children(self.layout.schedules)))
        found = self.get_many(self.layout.schedule(n) for n in names)
        states, lasts, notes = {}, {}, {}
        for name in names:
            path = self.layout.schedule(name)
            item = found.get(path)
            if item is None:
                continue
            try:
                states[name] = state = records.loads(item[0], path=path)
                if (last := schedule_state.last_tick(state, path)) is not None:
                    lasts[name] = last
            except CorruptRecord as exc:
                notes[name] = f"its state cannot be read: {exc}" + (
                    " The leader moves it to the dead letters and starts the schedule "
                    "again from now." if name in configured else "")
        jobs, nexts = {}, {}  # of the schedules with a usable last tick
        for name, tick in list(lasts.items()):
            try:
                jobs[name] = tick_job_id(name, tick)
                if name in configured:
                    nexts[name] = configured[name].next_tick(tick)
            except (OverflowError, ValueError) as exc:
                # A hand-made last tick at the ends of time ("9999-12-31T23:59:00+00:00"):
                # one such row broke the whole Schedules page and `zktasks schedules`.
                del lasts[name]
                jobs.pop(name, None)
                notes[name] = (f"its last tick, {tick.isoformat()}, cannot be used ({exc}); "
                               "the leader's next tick replaces it.")
        found_jobs = self.statuses(jobs.values())
        # A configured schedule with no znode: a leader makes one on its first pass over
        # the schedules (leader.py, _run_schedule), so one still missing a while after
        # the leader took over is not ticking. Its next tick is counted from now, so it
        # never shows as overdue: a note says why (overdue stays "a tick was missed").
        unrecorded = {n for n in configured if found.get(self.layout.schedule(n)) is None}
        leading = self._leading_since() if unrecorded else None
        rows = []
        for name in names:
            schedule, state, last = configured.get(name), states.get(name, {}), lasts.get(name)
            record = found_jobs.get(jobs.get(name, ""))
            paused = bool(state.get("paused"))
            next_tick, overdue = None, False
            if schedule is not None and not paused:
                next_tick = nexts[name] if last is not None else schedule.next_tick(now)
                overdue = next_tick < now - SCHEDULE_GRACE
            if name in unrecorded and not notes.get(name):
                notes[name] = _not_taken_up(leading, now)
            error_at = _time(state.get("error_at")) if state.get("error") else None
            rows.append(ScheduleRow(
                name=name, configured=schedule is not None,
                task=schedule.task if schedule else "",
                when=schedule.when if schedule else "",
                call=call_repr(schedule.args, schedule.kwargs) if schedule else "",
                last_tick=last, last_job=jobs.get(name, ""),
                last_state=record.state if isinstance(record, StatusRecord) else "",
                next_tick=next_tick, overdue=overdue,
                paused=paused, paused_at=_time(state.get("paused_at")) if paused else None,
                error=str(state.get("error") or ""), error_at=error_at,
                note=notes.get(name, "") or ("" if schedule else
                                             "not in SCHEDULES: state left from an earlier "
                                             "configuration"),
            ))
        return rows

    # -- pending and delayed -----------------------------------------------------------

    def queues(self) -> list[str]:
        return sorted(self.children(self.layout.jobs))

    def pending(self, queue: str, *, after: str | None = None,
                limit: int = PAGE_SIZE) -> Page:
        """Jobs waiting in jobs/{queue}, in the order they will be assigned.

        The queue is sharded (tree.LAYOUT): the total comes from the shards' stats and
        only the shards holding this page are listed, never the whole backlog. Jobs from
        before sharding, not yet moved by the leader, are shown in their place.
        """
        listed = self.children(self.layout.queue(queue))
        shards = sorted(n for n in listed if parse_shard(n))
        names = sorted(n for n in listed if parse_job_node(n) and (not after or n > after))
        stats = self.exists_many(self.layout.shard(queue, s) for s in shards)
        total = sum(1 for n in listed if parse_job_node(n)) + sum(
            stat.numChildren for stat in stats.values() if stat is not None)
        first = shard_of(after) if after and parse_job_node(after) else ""
        from_shards = 0
        for shard in shards:
            if shard < first:
                continue
            found = [n for n in self.children(self.layout.shard(queue, shard))
                     if parse_job_node(n) and (not after or n > after)]
            names.extend(found)
            from_shards += len(found)
            if from_shards > limit:
                break
        names.sort()
        chosen = names[:limit]
        more = len(names) > limit
        found = self.statuses(parse_job_node(n)[1] for n in chosen)
        rows = []
        for name in chosen:
            priority, job_id = parse_job_node(name)
            record = found.get(job_id)
            if isinstance(record, StatusRecord):
                rows.append(JobRow.from_record(record, note=name))
            else:
                rows.append(JobRow(id=job_id, queue=queue, priority=priority, note=name,
                                   state="?", error=_missing(record)))
        return Page(rows=rows, next_cursor=chosen[-1] if more and chosen else None,
                    total=total, exhausted=not more)

    def delayed_places(self) -> tuple[list[str], dict[str, list[str]], dict[str, object]]:
        """Where delayed jobs wait: (names directly in delayed/, not migrated yet;
        {minute: its shards, ascending}; {shard path: stat or None}). Lists only the
        two levels of parents and stats the shards: no job name is read."""
        layout = self.layout
        top = self.children(layout.delayed)
        minutes = sorted(m for m in top if is_delayed_shard(m))
        listed = _gather(self.client, [layout.delayed_minute(m) for m in minutes],
                         "get_children")
        shards = {m: sorted(s for s in listed.get(layout.delayed_minute(m)) or ()
                            if is_delayed_shard(s)) for m in minutes}
        stats = _gather(self.client, [layout.delayed_shard(m, s)
                                      for m in minutes for s in shards[m]], "exists")
        return [n for n in top if parse_delayed_node(n)], shards, stats

    def delayed(self, queue: str | None = None, *, after: str | None = None,
                limit: int = PAGE_SIZE, budget: int | None = None) -> Page:
        """Jobs waiting for their run_after or retry backoff, the first due first.

        Names sort by due time and shards are grouped by due minute, so only the minutes
        holding this page are listed, from the cursor's on, never the whole set. The
        total comes from the shards' stats; with a queue filter it is known only when the
        walk reached the last minute (None otherwise: the page says so).

        A queue filter that matches few jobs could walk every minute in one request (a
        million delayed names for an empty page), so a walk stops after the minute that
        brings the names it looked at past `budget` (DELAYED_BUDGET by default): the page
        then holds what matched so far, says how many names it looked at (`scanned`), and
        its cursor resumes after the last of them.
        """
        budget = DELAYED_BUDGET if budget is None else budget
        layout = self.layout
        flat, shards, stats = self.delayed_places()
        first = (delayed_shards(after) or ("",))[0] if after else ""

        def wanted(name):
            parsed = parse_delayed_node(name)
            return (parsed and (queue is None or parsed[3] == queue)
                    and (not after or name > after))

        names = [n for n in flat if wanted(n)]
        walked = [m for m in shards if m >= first]
        complete = False
        looked, furthest = 0, ""  # names past the cursor listed; the greatest of them
        for minute in walked:
            if len(names) > limit:  # a page and one more: the rest is for next pages
                break
            if looked >= budget:
                break  # every name up to `furthest` has been looked at: resume there
            found = _gather(self.client, [layout.delayed_shard(minute, s)
                                          for s in shards[minute]], "get_children")
            for listed in found.values():
                for name in listed or ():
                    parsed = parse_delayed_node(name)
                    if parsed and (not after or name > after):
                        looked += 1
                        furthest = max(furthest, name)
                        if queue is None or parsed[3] == queue:
                            names.append(name)
        else:
            complete = True
        stopped = not complete and len(names) <= limit and bool(furthest)  # by the budget
        if stopped:
            names = [n for n in names if n <= furthest]  # the next page shows the rest
        if queue is None:
            total = len(flat) + sum(st.numChildren for st in stats.values() if st)
        else:  # the queue's total is known only from a walk of every minute
            total = len(names) if not after and complete else None
        names.sort()
        chosen = names[:limit]
        found = self.statuses(parse_delayed_node(n)[2] for n in chosen)
        rows = []
        for name in chosen:
            due_ms, priority, job_id, q = parse_delayed_node(name)
            record = found.get(job_id)
            if isinstance(record, StatusRecord):
                rows.append(JobRow.from_record(record, note=name))
            else:
                rows.append(JobRow(id=job_id, queue=q, priority=priority,
                                   due_at=ms_to_datetime(due_ms), note=name, state="?",
                                   error=_missing(record)))
        if stopped:
            # The page shows what matched, and the next one goes on after the last name
            # looked at.
            return Page(rows=rows, next_cursor=furthest, scanned=looked, total=total,
                        exhausted=False)
        more = len(names) > limit
        return Page(rows=rows, next_cursor=chosen[-1] if more and chosen else None,
                    total=total, exhausted=not more)

    # -- workers and assignments -------------------------------------------------------

    def workers(self) -> dict[str, dict]:
        ids = sorted(self.children(self.layout.workers))
        found = self.get_many(self.layout.worker(w) for w in ids)
        out = {}
        for worker_id in ids:
            item = found.get(self.layout.worker(worker_id))
            if item is None:
                continue
            out[worker_id] = worker_info(worker_id, item[0])
        return out

    def assignments(self) -> list[dict]:
        """Each worker with the jobs assigned to it; parents of vanished workers too."""
        workers = self.workers()
        owners = sorted(set(self.children(self.layout.assignments)) | set(workers))
        listed = _gather(self.client, [self.layout.worker_assignments(o) for o in owners],
                         "get_children")
        job_ids, out = [], []
        for owner in owners:
            ids = sorted(listed.get(self.layout.worker_assignments(owner)) or [])
            job_ids += ids
            out.append({"worker_id": owner, "worker": workers.get(owner),
                        "job_ids": ids, "jobs": []})
        found = self.statuses(job_ids)
        data = self.get_many(self.layout.assignment(o["worker_id"], j)
                             for o in out for j in o["job_ids"])
        for item in out:
            for job_id in item["job_ids"]:
                record = found.get(job_id)
                raw = data.get(self.layout.assignment(item["worker_id"], job_id))
                assigned_at = None
                if raw is not None:
                    try:
                        assigned_at = records.loads(raw[0]).get("assigned_at")
                        assigned_at = datetime.fromisoformat(assigned_at) if assigned_at \
                            else None
                    except (CorruptRecord, ValueError, TypeError):
                        assigned_at = None
                if isinstance(record, StatusRecord):
                    row = JobRow.from_record(record)
                else:
                    row = JobRow(id=job_id, state="?", error=_missing(record))
                item["jobs"].append({"row": row, "assigned_at": assigned_at})
        return out

    # -- results (finished jobs, newest first) ------------------------------------------

    def buckets(self) -> list[str]:
        """The finished index's buckets, newest start first."""
        return sorted((b for b in self.children(self.layout.finished) if parse_bucket(b)),
                      reverse=True)

    def bucket_leaves(self, buckets: list[str]) -> dict[str, dict[str, list[str]]]:
        """Each bucket's leaves and their names (tree.finished_leaves), pipelined."""
        def list_many(relatives):
            found = _gather(self.client, [self.layout.finished_bucket(r) for r in relatives],
                            "get_children")
            return {r: found.get(self.layout.finished_bucket(r)) for r in relatives}
        return finished_leaves(buckets, list_many)

    def _index(self, cursor: str | None, state: str | None,
               stopped: dict) -> Iterator[tuple[str, str]]:
        """Yield (bucket/job_id cursor, job_id) of finished jobs, newest first.

        The cursor names a bucket and a job id, so a deep page skips the newer buckets
        without listing them (no status read needed to find where to resume). Buckets
        are listed with pipelined requests, at most LIST_BUDGET of them per page: past
        that, `stopped["at"]` says where the next page resumes.
        """
        start_bucket, _, start_id = (cursor or "").partition("/")
        start_bucket = bucket_start(start_bucket) if start_bucket else ""
        code = {"SUCCESSFUL": "S", "FAILED": "F"}.get(state or "")
        # Buckets of one start (the global TTL's and per-task TTLs') hold the same ten
        # seconds: they are listed together and merged, and cursors name the start.
        groups: dict[str, list[str]] = {}
        for b in self.buckets():
            if not start_bucket or bucket_start(b) <= start_bucket:
                groups.setdefault(bucket_start(b), []).append(b)
        starts = sorted(groups, reverse=True)
        listed, first, size = 0, 0, 4
        while first < len(starts):
            batch = starts[first:first + size]
            first, size = first + size, min(size * 2, 64)
            leaves = self.bucket_leaves([b for start in batch for b in groups[start]])
            for start in batch:
                entries = set()
                for bucket in groups[start]:
                    for name in (n for names in leaves[bucket].values() for n in names):
                        parsed = parse_finished_entry(name)
                        if parsed and (code is None or parsed[1] == code):
                            entries.add(parsed[0])
                for job_id in sorted(entries, reverse=True):
                    if start_bucket and start == start_bucket and job_id >= start_id:
                        continue
                    yield f"{start}/{job_id}", job_id
                listed += len(groups[start])
                if listed >= LIST_BUDGET and start != starts[-1]:
                    stopped["at"] = f"{start}/{'0' * 32}"  # before every id of it
                    return

    def results(self, *, state: str | None = None, task: str = "", queue: str = "",
                cursor: str | None = None, limit: int = PAGE_SIZE,
                budget: int = SCAN_BUDGET) -> Page:
        """A page of finished jobs, newest first, filtered by state, task and queue.

        The state filter reads only index names; task and queue filters read status
        records, at most `budget` of them per page, so a rare match never makes a slow
        page: the page then says how far it looked and offers to look further.
        """
        stopped: dict = {}
        index = self._index(cursor, state, stopped)
        rows, scanned, last = [], 0, None
        ended = leftover = False
        while len(rows) < limit and scanned < budget:
            want = min(max(limit - len(rows), 1) * (4 if task or queue else 1),
                       ASYNC_BATCH, budget - scanned)
            chunk = list(islice(index, want))
            if not chunk:
                ended = True
                break
            found = self.statuses(job_id for _, job_id in chunk)
            for n, (position, job_id) in enumerate(chunk):
                scanned += 1
                last = position
                record = found.get(job_id)
                if not isinstance(record, StatusRecord):
                    if not task and not queue:
                        rows.append(JobRow(id=job_id, state="?", error=_missing(record)))
                elif (not task or task.lower() in record.task.lower()) and (
                        not queue or record.queue == queue):
                    rows.append(JobRow.from_record(record))
                if len(rows) >= limit:
                    leftover = n + 1 < len(chunk)
                    break
        if not ended and not leftover:
            ended = next(index, None) is None  # peek past the last row looked at
        # Ended: the index is done, or its listing budget is (resume where it stopped).
        next_cursor = stopped.get("at") if ended else last
        return Page(rows=rows, next_cursor=next_cursor, scanned=scanned,
                    exhausted=next_cursor is None)

    # -- one job -----------------------------------------------------------------------

    def get_caught_up(self, path: str):
        """get(path), and if it finds nothing, again once this process's member has
        caught up (Store.catch_up): what another process has just made (a job, a dead
        letter) may not have reached it yet, and a page said "no such" thing."""
        found = self.get(path)
        if found is None:
            self.catch_up()
            found = self.get(path)
        return found

    def catch_up(self) -> None:
        with self.store.bounded(READ_DEADLINE):
            self.store.catch_up()

    def job(self, job_id: str) -> JobDetail | None:
        """Everything the detail page shows; arguments only from a verified payload."""
        path = self.layout.status(job_id)
        found = self.get_caught_up(path)
        if found is None:
            return None
        record = StatusRecord.from_bytes(found[0], path=path)
        verified, why = False, ""
        if record.payload is None:
            why = "This job's record holds no payload."
        else:
            try:
                envelope.open_envelope(record.payload, job_id=job_id, kind=envelope.PAYLOAD,
                                       keys=self.conf.verify_keys)
                verified = True
            except PayloadVerificationError as exc:
                why = str(exc)
        args = args_note = value = result_note = value_note = ""
        if verified:
            args, args_note, value, result_note, value_note = self._call_and_value(record)
        elif record.state == records.SUCCESSFUL:
            result_note = "Not shown: the job's payload did not pass its signature check."
        return JobDetail(record=record, version=found[1].version, verified=verified,
                         verification_error=why, args=args, args_note=args_note,
                         return_value=value, result_note=result_note,
                         value_note=value_note,
                         history=history(record), places=self._places(record),
                         waited=duration(record.enqueued_at, record.started_at),
                         ran=duration(record.last_attempted_at, record.finished_at))

    def _call_and_value(self, record: StatusRecord) -> tuple[str, str, str, str, str]:
        backend = self.backend
        args_note = result_note = value = value_note = ""
        peeked = self._peek_arguments(record)
        if peeked is None:
            args = ""
            if record.args_repr:
                args_note = ("The arguments could not be read in the web process; when "
                             f"submitted they read: {record.args_repr}")
        else:
            args = call_repr(*peeked)
            if _holds_stand_ins(peeked):
                args_note = (
                    "Objects other than plain data are not unpickled in the web process "
                    "(that runs their class's code: one that crashes or hangs would take "
                    "this process with it). When submitted they read: "
                    f"{record.args_repr or '(not recorded)'}")
        if record.state == records.SUCCESSFUL and record.result is not None:
            # From the record this page read (not a second read of it); read as the
            # arguments are, and for the same reason.
            peeked = backend.return_value_of(record, peek=True)
            if isinstance(peeked, UnloadableValue):
                error = peeked.error
                result_note = (f"Not shown: {error}" if isinstance(
                    error, PayloadVerificationError) else
                    f"Not shown: the return value could not be read in the web process "
                    f"({type(error).__name__}: {short_repr(str(error), 300)}).")
            else:
                value = short_repr(peeked)
                if _holds_stand_ins(peeked):
                    value_note = (
                        "Objects other than plain data are not unpickled in the web "
                        "process. When returned it read: "
                        f"{record.result_repr or '(not recorded)'}")
        return args, args_note, value, result_note, value_note

    def _peek_arguments(self, record: StatusRecord) -> tuple[tuple, dict] | None:
        """The job's arguments as serialization.peek_arguments sees them (plain data
        as it is, stand-ins for other objects); None if they cannot be read here."""
        if record.payload is None:
            return None
        try:
            blob = envelope.open_envelope(record.payload, job_id=record.id,
                                          kind=envelope.PAYLOAD,
                                          keys=self.backend.conf.verify_keys)
        except PayloadVerificationError:
            return None  # the page says why (verified is False)
        return serialization.peek_arguments(blob)

    def _places(self, record: StatusRecord) -> list[tuple[str, str]]:
        from .tree import delayed_node_name, job_node_name

        layout = self.layout
        candidates = [("status record", layout.status(record.id))]
        if record.state == records.READY:
            candidates.append(("pending", layout.job(record.queue,
                                                     job_node_name(record.priority, record.id))))
            if record.due_at is not None:
                due_ms = int(record.due_at.timestamp() * 1000)
                candidates.append(("delayed", layout.delayed_job(delayed_node_name(
                    due_ms, record.priority, record.id, record.queue))))
        if record.state in (records.READY, records.RUNNING) and record.worker_ids:
            candidates.append(("assigned", layout.assignment(record.worker_ids[-1],
                                                             record.id)))
        if record.finished_at is not None:
            finished_ms = int(record.finished_at.timestamp() * 1000)
            entry = finished_entry(record.id, record.state, record.queue)
            for leaf in (finished_leaf(finished_ms, record.result_ttl),  # or, if older,
                         finished_bucket(finished_ms, record.result_ttl)):  # directly
                candidates.append(("finished index", layout.finished_entry(leaf, entry)))
        present = self.exists_many(p for _, p in candidates)
        return [(label, path) for label, path in candidates if present.get(path)]

    # -- the raw tree ------------------------------------------------------------------

    def node(self, relative: str, *, after: str | None = None, limit: int = 200) -> NodeView:
        """One znode under ROOT: its stat, a preview of its data, a page of children."""
        path = self.absolute(relative)
        found = self.get(path)
        if found is None:
            raise NoNodeError(path)
        raw, stat = found
        names = sorted(self.children(path))
        start = 0
        if after:
            start = next((i for i, n in enumerate(names) if n > after), len(names))
        chosen = names[start:start + limit]
        child_paths = [f"{path}/{n}" for n in chosen]
        stats = self.exists_many(child_paths)
        base = relative.rstrip("/")
        children = [(n, f"{base}/{n}", stat_dict(stats[p]) if stats.get(p) else None)
                     for n, p in zip(chosen, child_paths, strict=True)]
        parents, acc = [("ROOT", "/")], ""
        for part in [p for p in relative.split("/") if p]:
            acc += "/" + part
            parents.append((part, acc))
        more = start + limit < len(names)
        return NodeView(path=path, relative=relative or "/", stat=stat_dict(stat),
                        data=preview(raw), children=children,
                        next_cursor=chosen[-1] if more and chosen else None, parents=parents)

    def absolute(self, relative: str) -> str:
        """Map a path relative to ROOT to the znode path, refusing anything outside ROOT."""
        parts = [p for p in (relative or "/").split("/") if p]
        if any(p in (".", "..") or len(p) > 255 for p in parts):
            raise ValueError(f"{relative!r} is not a path below ROOT.")
        return "/".join([self.conf.root, *parts])


def worker_info(worker_id: str, raw: bytes | None) -> dict:
    """Decode a worker znode's JSON for display; garbage becomes a note, never an error."""
    try:
        data = records.loads(raw)
    except CorruptRecord:
        return {"id": worker_id, "host": "", "pid": None, "queues": [], "concurrency": None,
                "prefetch": None, "pool": "", "started_at": None, "draining": False,
                "note": "unreadable worker znode"}
    started = data.get("started_at")
    try:
        started = datetime.fromisoformat(started) if isinstance(started, str) else None
    except ValueError:
        started = None
    queues = data.get("queues")
    return {
        "id": worker_id, "host": str(data.get("host", "")), "pid": data.get("pid"),
        "queues": [str(q) for q in queues] if isinstance(queues, list) else [],
        "concurrency": data.get("concurrency"), "prefetch": data.get("prefetch"),
        "pool": str(data.get("pool", "")), "started_at": started,
        "draining": bool(data.get("draining")), "note": "",
    }


def attempts_text(record: StatusRecord) -> str:
    """Attempts made against the limit; starts past it were not failures retried."""
    if record.attempts <= record.max_attempts:
        return f"{record.attempts} of at most {record.max_attempts}"
    return (f"{record.attempts} (max_attempts {record.max_attempts}: the starts past it "
            "followed a lost worker, a retry or a re-queue, not a failure)")


def history(record: StatusRecord) -> list[tuple[datetime | None, str]]:
    """The state history a status record implies, oldest first: (when, what).

    Errors carry no time, so events are ordered by the attempt they belong to: a
    re-queue or retry notes how many attempts had been made when it happened.
    """
    events = []  # (attempt it belongs to, order within it, when, what)
    if record.enqueued_at:
        events.append((0, 0, record.enqueued_at,
                       f"enqueued on queue {record.queue!r} with priority {record.priority}"))
    if record.run_after:
        events.append((0, 1, record.run_after, "due (run_after)"))
    if record.retry_at and record.state == records.READY:  # backing off now (a start
        # clears it): after the attempt whose failure it retries
        events.append((record.attempts, 3, record.retry_at, "retry due (backoff)"))
    if record.started_at:
        first = record.worker_ids[0] if record.worker_ids else "?"
        events.append((1, 0, record.started_at, f"attempt 1 started on {first}"))
    for error in record.errors:
        where = f" on {error.worker_id}" if error.worker_id else ""
        events.append((error.attempt or record.attempts, 1, None,
                       f"attempt {error.attempt or '?'}{where} ended with "
                       f"{error.exception_class_path}"))
    for note in record.extra.get("requeued") or ():
        if isinstance(note, dict):
            try:
                at = datetime.fromisoformat(note.get("at"))
            except (TypeError, ValueError):
                at = None
            after = note.get("attempts")
            if not isinstance(after, int):  # noted before the count was: last known place
                after = max(record.attempts - 1, 0)
            what = ("retried" if note.get("kind") == "retry" else
                    f"re-queued from the dead letters ({note.get('kind') or '?'})")
            events.append((after, 2, at, what))
    if record.attempts > 1 and record.last_attempted_at:
        last = record.worker_ids[-1] if record.worker_ids else "?"
        events.append((record.attempts, 0, record.last_attempted_at,
                       f"attempt {record.attempts} started on {last}"))
    end = record.attempts + 1
    if record.finished_at:
        events.append((end, 0, record.finished_at, f"finished: {record.state}"))
    elif record.state == records.RUNNING:
        events.append((end, 0, None, "running now"))
    else:
        events.append((end, 0, None, "waiting to run"))
    events.sort(key=lambda event: event[:2])  # stable: same place keeps its order
    return [(when, what) for _, _, when, what in events]


def _missing(found) -> str:
    if isinstance(found, Exception):
        return str(found)
    return "status record missing"


def _gather(client, paths: list[str], op: str) -> dict:
    """Run one kazoo async op over many paths, ASYNC_BATCH in flight; NoNode maps to None."""
    call = {"get": client.get_async, "exists": client.exists_async,
            "get_children": client.get_children_async}[op]
    out = {}
    deadline = time.monotonic() + READ_DEADLINE * 3
    for start in range(0, len(paths), ASYNC_BATCH):
        batch = paths[start:start + ASYNC_BATCH]
        pending = [(p, call(p)) for p in batch]
        for path, result in pending:
            try:
                out[path] = result.get(timeout=max(0.1, deadline - time.monotonic()))
            except NoNodeError:
                out[path] = None
            except TRANSIENT as exc:
                raise ZooKeeperUnavailableError(
                    f"ZooKeeper stopped answering while reading {path!r} "
                    f"({type(exc).__name__})."
                ) from exc
            except KazooTimeoutError as exc:
                raise ZooKeeperUnavailableError(
                    f"ZooKeeper did not answer in time while reading {path!r}."
                ) from exc
    return out


# -- the live cache ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Bucket:
    succeeded: int = 0
    failed: int = 0
    failed_ids: tuple[str, ...] = ()     # newest first
    per_queue: dict = field(default_factory=dict)  # queue -> [S, F], when names carry it


class LiveState:
    """The overview's numbers for one ROOT, kept current by watches; one per process.

    Watch callbacks run on kazoo's event thread: they only add a key to `_dirty` under
    a lock and wake this object's thread, which does every read (rule 5). Keys:
    "*" (everything), "workers", "w:{id}", "a:{id}", "queues", "q:{queue}", "delayed",
    "leader", "finished", "b:{bucket}", "j:{job_id}", "deadletter", "schedules".
    """

    MIN_INTERVAL = 1.0      # seconds between two reads of one path; also how often the
    #                         pending counts of sharded queues are re-read (below)
    BIG_INTERVAL = 5.0      # the same for a children list of more than BIG names
    BIG = 5_000
    IDLE_AFTER = 60.0       # no poll for this long: stop reading (marks accumulate)
    MAX_WATCHED_JOBS = 200

    def __init__(self, client, layout):
        self.client = client
        self.layout = layout
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._dirty: set[str] = {"*"}
        self._last_read: dict[str, float] = {}
        self._watchers: dict[str, object] = {}
        self.generation = 0
        self.last_poll = time.monotonic()
        self.error = ""
        self.as_of: datetime | None = None
        # The view, guarded by _lock.
        self.workers: dict[str, dict] = {}
        self.assigned: dict[str, set[str]] = {}
        self.assigned_queue: dict[str, str] = {}
        self.pending: dict[str, int] = {}
        self._sharded: set[str] = set()  # queues with shards: their counts are polled
        # Delayed shards (path -> (cversion, Counter per queue)): polled the same way.
        self._delayed_cache: dict[str, tuple[int, Counter]] = {}
        self.delayed: dict[str, int] = {}
        self.leader: dict | None = None
        self.buckets: dict[str, _Bucket] = {}
        self.failures: list[dict] = []
        self._failure_cache: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.job_polled: dict[str, float] = {}
        self.topics: dict[str, int] = {}
        self._topic_serial = 0
        self.dead_letters: tuple[int, str] = (0, "")  # count, newest name
        self.schedules: dict[str, int] = {}  # name -> its znode's version (ticks move it)
        self._thread = threading.Thread(target=self._run, name="zktasks-dashboard-live",
                                        daemon=True)
        client.add_listener(self._on_state)
        self._thread.start()

    # -- kazoo's thread: mark and wake, nothing else -----------------------------------

    def _watcher(self, key: str):
        watcher = self._watchers.get(key)
        if watcher is None:
            def watcher(event, key=key):
                self._mark("*" if event.type == EventType.NONE else key)
            self._watchers[key] = watcher
        return watcher

    def _on_state(self, state) -> None:
        if state == KazooState.CONNECTED:
            self._mark("*")  # watches may be lost: re-read everything
        else:
            self._wake.set()

    def _mark(self, key: str) -> None:
        with self._lock:
            self._dirty.add(key)
        self._wake.set()

    # -- requests --------------------------------------------------------------------------

    def snapshot(self, *, job_id: str | None = None, wait: float = 1.5) -> dict:
        """The overview as JSON-ready data, from memory.

        It waits (briefly) for a read only when there is nothing current to give: the
        first poll, the first poll after an idle spell (marks were left unread), or a
        job asked about for the first time.
        """
        now = time.monotonic()
        with self._lock:
            was_idle = now - self.last_poll > self.IDLE_AFTER
            self.last_poll = now
            new_job = bool(job_id) and job_id not in self.jobs
            if new_job:
                self._watch_job(job_id)
            if job_id:
                self.job_polled[job_id] = now
            if was_idle:
                self._dirty |= {f"q:{q}" for q in self._sharded}
            if self.as_of is None or new_job or (was_idle and self._dirty):
                self._wake.set()
                generation = self.generation
                self._changed.wait_for(
                    lambda: self.generation > generation or self._stop.is_set(),
                    timeout=wait)
            return self._snapshot(job_id)

    def _watch_job(self, job_id: str) -> None:
        if len(self.jobs) >= self.MAX_WATCHED_JOBS:
            oldest = min(self.jobs, key=lambda j: self.job_polled.get(j, 0))
            self.jobs.pop(oldest, None)
            self.job_polled.pop(oldest, None)
        self.jobs[job_id] = {"id": job_id, "state": None, "version": None}
        self._dirty.add(f"j:{job_id}")

    def _snapshot(self, job_id: str | None) -> dict:
        connected = self.client.connected
        workers = []
        for worker_id in sorted(self.workers):
            info = dict(self.workers[worker_id])
            info["assigned"] = len(self.assigned.get(worker_id, ()))
            info["started_at"] = _iso(info.get("started_at"))
            workers.append(info)
        # Jobs assigned to a live worker: running, or prefetched to run next. The key
        # "running" is the same count under its first name, kept for scripts that read it.
        assigned: dict[str, int] = {}
        for ids in self.assigned.values():
            for j in ids:
                queue = self.assigned_queue.get(j, "?")
                assigned[queue] = assigned.get(queue, 0) + 1
        finished_q: dict[str, list[int]] = {}
        succeeded = failed = 0
        for bucket in self.buckets.values():
            succeeded += bucket.succeeded
            failed += bucket.failed
            for queue, (s, f) in bucket.per_queue.items():
                item = finished_q.setdefault(queue, [0, 0])
                item[0] += s
                item[1] += f
        names = sorted(set(self.pending) | set(self.delayed) | set(assigned) | set(finished_q))
        queues = [{
            "name": q, "pending": self.pending.get(q, 0), "delayed": self.delayed.get(q, 0),
            "assigned": assigned.get(q, 0), "running": assigned.get(q, 0),
            "succeeded": finished_q[q][0] if q in finished_q else None,
            "failed": finished_q[q][1] if q in finished_q else None,
        } for q in names]
        data = {
            "ok": connected and not self.error and self.as_of is not None,
            "connected": connected,
            "error": self.error if connected else (
                f"The connection to ZooKeeper is down ({self.client.state}); the numbers "
                "below are from before it went."),
            "as_of": _iso(self.as_of),
            "leader": dict(self.leader) if self.leader else None,
            "workers": workers,
            "queues": queues,
            "totals": {
                "workers": len(workers),
                "pending": sum(self.pending.values()),
                "delayed": sum(self.delayed.values()),
                "assigned": sum(assigned.values()),
                "running": sum(assigned.values()),
                "succeeded": succeeded,
                "failed": failed,
                "dead_letters": self.dead_letters[0],
            },
            "throughput": self._throughput(),
            "recent_failures": list(self.failures),
            "topics": dict(self.topics),
        }
        if data["ok"]:
            data["error"] = ""
        if job_id and job_id in self.jobs:
            data["job"] = dict(self.jobs[job_id])
        return data

    def _throughput(self) -> list[dict]:
        """Finished jobs per minute over the last minutes (from bucket sizes)."""
        now_ms = int(time.time() * 1000)
        this_minute = now_ms - now_ms % 60_000
        counts = dict.fromkeys(range(THROUGHPUT_MINUTES), 0)
        for name, bucket in self.buckets.items():
            start = parse_bucket(name)[0]
            age = (this_minute - (start - start % 60_000)) // 60_000
            if 0 <= age < THROUGHPUT_MINUTES:
                counts[age] += bucket.succeeded + bucket.failed
        return [{"minute": _iso(ms_to_datetime(this_minute - age * 60_000)),
                 "count": counts[age]} for age in reversed(range(THROUGHPUT_MINUTES))]

    def bucket_counts(self, before_ms: int | None, states: tuple[str, ...]) -> int:
        """How many finished records a purge of whole buckets before `before_ms` removes."""
        with self._lock:
            total = 0
            for name, bucket in self.buckets.items():
                if before_ms is not None and parse_bucket(name)[0] + BUCKET_MS > before_ms:
                    continue
                total += (bucket.succeeded if "SUCCESSFUL" in states else 0) + (
                    bucket.failed if "FAILED" in states else 0)
            return total

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        try:
            self.client.remove_listener(self._on_state)
        except Exception:  # the client may be closed already
            logger.debug("remove_listener failed", exc_info=True)
        with self._lock:
            self._changed.notify_all()

    @property
    def idle_for(self) -> float:
        return time.monotonic() - self.last_poll

    # -- this object's thread: every read -------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.idle_for > self.IDLE_AFTER or not self.client.connected:
                continue
            now = time.monotonic()
            with self._lock:
                # A job added to (or assigned from) an existing shard fires no watch we
                # hold: a watch on a shard's children would mean listing it. Its count
                # (stat.numChildren) is re-read instead, once a MIN_INTERVAL.
                self._dirty |= {f"q:{q}" for q in self._sharded
                                if now - self._last_read.get(f"q:{q}", 0.0)
                                >= self.MIN_INTERVAL}
                # The same for delayed shards: a stat each (BIG_INTERVAL past BIG of
                # them), and a list of those whose children changed.
                if self._delayed_cache and now - self._last_read.get("delayed", 0.0) >= (
                        self.MIN_INTERVAL if len(self._delayed_cache) <= self.BIG
                        else self.BIG_INTERVAL):
                    self._dirty.add("delayed")
                if "*" in self._dirty:
                    dirty, self._dirty = self._dirty, set()
                else:
                    dirty = {k for k in self._dirty
                             if now - self._last_read.get(k, 0.0) >= self._interval(k)}
                    self._dirty -= dirty
                    if self._dirty:
                        self._wake.set()  # come back for the rate-limited ones
            if not dirty and self.as_of is not None:
                if self._wake.is_set():
                    self._stop.wait(0.25)
                continue
            try:
                self._refresh(dirty)
                error = ""
            except TRANSIENT + (ZooKeeperUnavailableError, KazooTimeoutError) as exc:
                with self._lock:
                    self._dirty |= dirty
                error = describe(exc)
                self._stop.wait(0.5)
            except KazooException as exc:
                with self._lock:
                    self._dirty |= dirty
                error = describe(exc)
                logger.warning("dashboard live read failed: %s", error)
                self._stop.wait(2.0)
            except Exception:
                logger.exception("dashboard live read failed")
                with self._lock:
                    self._dirty |= dirty
                error = "The dashboard could not read the tree; see the server log."
                self._stop.wait(2.0)
            with self._lock:
                self.error = error
                if not error:
                    self.as_of = records.now()
                self.generation += 1
                self._changed.notify_all()

    def _interval(self, key: str) -> float:
        return self.MIN_INTERVAL if self._last_read.get("size:" + key, 0) <= self.BIG \
            else self.BIG_INTERVAL

    def _read(self, key: str, size: int = 0) -> None:
        self._last_read[key] = time.monotonic()
        self._last_read["size:" + key] = size

    def _delayed_counts(self) -> dict[str, int]:
        """Delayed jobs per queue, listing only the shards that changed.

        delayed/ and its minutes are listed with a watch (key "delayed": a shard made or
        deleted). The shards are stat'ed; only those whose children changed since they
        were last listed (another cversion) are listed again, without a watch: a shard
        being promoted would fire one on every batch the leader moves, and relisting
        every shard then read every delayed name, a million of them at scale. Jobs added
        to or promoted from a shard are caught by the poll in _run instead.
        """
        layout = self.layout
        top = self._children([(layout.delayed, "delayed")])[layout.delayed] or []
        minutes = [layout.delayed_minute(m) for m in top if is_delayed_shard(m)]
        listed = self._children([(m, "delayed") for m in minutes])
        paths = [f"{m}/{sec}" for m in minutes for sec in listed.get(m) or ()
                 if is_delayed_shard(sec)]
        stats = _gather(self.client, paths, "exists")
        changed = [p for p in paths if stats.get(p) is not None
                   and self._delayed_cache.get(p, (None,))[0] != stats[p].cversion]
        found = _gather(self.client, changed, "get_children")
        cache = {}
        for path in paths:
            if path in changed:
                if found.get(path) is not None:  # None: deleted since its stat
                    cache[path] = (stats[path].cversion, Counter(
                        parsed[3] for n in found[path] if (parsed := parse_delayed_node(n))))
            elif path in self._delayed_cache and stats.get(path) is not None:
                cache[path] = self._delayed_cache[path]
        self._delayed_cache = cache
        counts = Counter(parsed[3] for n in top if (parsed := parse_delayed_node(n)))
        for _, per_queue in cache.values():
            counts.update(per_queue)
        return dict(counts)

    def _children(self, paths_keys: list[tuple[str, str]]) -> dict[str, list[str] | None]:
        """List children with a watch each (pipelined); a missing parent maps to None."""
        out = {}
        for start in range(0, len(paths_keys), ASYNC_BATCH):
            batch = [(p, k, self.client.get_children_async(p, watch=self._watcher(k)))
                     for p, k in paths_keys[start:start + ASYNC_BATCH]]
            for path, key, result in batch:
                try:
                    names = result.get(timeout=READ_DEADLINE)
                except NoNodeError:
                    # Watch its creation instead; reading it again then lists it.
                    self.client.exists_async(path, watch=self._watcher(key))
                    names = None
                out[path] = names
                self._read(key, len(names or ()))
        return out

    def _gets(self, paths_keys: list[tuple[str, str | None]]) -> dict[str, tuple | None]:
        out = {}
        for start in range(0, len(paths_keys), ASYNC_BATCH):
            batch = [(p, k, self.client.get_async(
                p, watch=self._watcher(k) if k else None))
                for p, k in paths_keys[start:start + ASYNC_BATCH]]
            for path, key, result in batch:
                try:
                    out[path] = result.get(timeout=READ_DEADLINE)
                except NoNodeError:
                    out[path] = None
                    if key:
                        # No watch is left on a node that does not exist: a job page
                        # opened for a job this member had not applied yet never
                        # updated. Watch its creation instead, as _children does.
                        self.client.exists_async(path, watch=self._watcher(key))
                if key:
                    self._read(key)
        return out

    def _bump(self, topic: str, changed: bool) -> None:
        if changed:
            # One counter for all topics: a topic forgotten (below) and followed again
            # never repeats a value a page's stale signature could match.
            self._topic_serial += 1
            self.topics[topic] = self._topic_serial

    def _refresh(self, dirty: set[str]) -> None:
        full = "*" in dirty
        layout = self.layout

        # Workers and their assignments.
        worker_ids = set(self.workers)
        if full or "workers" in dirty:
            listed = self._children([(layout.workers, "workers")])[layout.workers] or []
            worker_ids = set(listed)
            for new in worker_ids - set(self.workers):
                dirty |= {f"w:{new}", f"a:{new}"}
        read_workers = [w for w in worker_ids if full or f"w:{w}" in dirty]
        found = self._gets([(layout.worker(w), f"w:{w}") for w in read_workers])
        read_assigned = [w for w in worker_ids if full or f"a:{w}" in dirty]
        assigned = self._children([(layout.worker_assignments(w), f"a:{w}")
                                   for w in read_assigned])
        known_queue = dict(self.assigned_queue)
        new_jobs = [(w, j) for w in read_assigned
                    for j in (assigned.get(layout.worker_assignments(w)) or ())
                    if j not in known_queue]
        data = self._gets([(layout.assignment(w, j), None) for w, j in new_jobs])
        for w, j in new_jobs:
            raw = data.get(layout.assignment(w, j))
            try:
                known_queue[j] = str(records.loads(raw[0]).get("queue", "?")) if raw else "?"
            except CorruptRecord:
                known_queue[j] = "?"

        # Queues, delayed jobs, the leader.
        queue_names = set(self.pending)
        if full or "queues" in dirty:
            queue_names = set(self._children([(layout.jobs, "queues")])[layout.jobs] or [])
        read_queues = [q for q in queue_names
                       if full or f"q:{q}" in dirty or q not in self.pending]
        listed_queues = self._children([(layout.queue(q), f"q:{q}") for q in read_queues])
        shard_stats = _gather(self.client, [
            layout.shard(q, n) for q in read_queues
            for n in listed_queues.get(layout.queue(q)) or () if parse_shard(n)], "exists")
        delayed = self._delayed_counts() if full or "delayed" in dirty else None
        leader = self.leader
        if full or "leader" in dirty:
            leader = self._read_leader()
        dead = None
        if full or "deadletter" in dirty:
            names = self._children([(layout.deadletter, "deadletter")])[layout.deadletter]
            dead = (len(names or ()), max(names or [""]))

        schedules = None
        if full or "schedules" in dirty:
            # Own names: `found` and `listed` above are read again below.
            schedule_names = self._children(
                [(layout.schedules, "schedules")])[layout.schedules] or []
            schedule_states = self._gets([(layout.schedule(n), "schedules")
                                          for n in schedule_names])
            schedules = {n: state[1].version for n in schedule_names
                         if (state := schedule_states.get(layout.schedule(n))) is not None}

        # The finished index.
        bucket_names = set(self.buckets)
        if full or "finished" in dirty:
            listed = self._children([(layout.finished, "finished")])[layout.finished] or []
            bucket_names = {b for b in listed if parse_bucket(b)}
        read_buckets = [b for b in bucket_names
                        if full or f"b:{b}" in dirty or b not in self.buckets]
        # A bucket and its seconds are watched under one key: a change in any of them
        # lists the bucket's (at most 11) lists again.
        gone = set()

        def list_many(relatives):
            found = self._children([(layout.finished_bucket(r), f"b:{r.split('/', 1)[0]}")
                                    for r in relatives])
            out = {r: found.get(layout.finished_bucket(r)) for r in relatives}
            gone.update(r for r, names in out.items() if names is None)
            return out

        listed_buckets = finished_leaves(read_buckets, list_many)
        buckets = {}
        for b in read_buckets:
            if b not in gone:
                buckets[b] = _count_bucket([n for names in listed_buckets[b].values()
                                            for n in names])

        # Jobs somebody is looking at.
        with self._lock:
            watched = [j for j in self.jobs if full or f"j:{j}" in dirty]
        statuses = self._gets([(layout.status(j), f"j:{j}") for j in watched])

        # Recent failures: read the status of the newest failed ids not seen before.
        with self._lock:
            merged = {b: self.buckets[b] for b in bucket_names if b in self.buckets}
        merged.update(buckets)
        newest_failed = []
        by_start: dict[str, list[str]] = {}
        for b in merged:
            by_start.setdefault(bucket_start(b), []).append(b)
        for start in sorted(by_start, reverse=True):  # buckets of one start merged
            newest_failed.extend(sorted((j for b in by_start[start]
                                         for j in merged[b].failed_ids), reverse=True))
            if len(newest_failed) >= RECENT_FAILURES:
                break
        newest_failed = newest_failed[:RECENT_FAILURES]
        unknown = [j for j in newest_failed if j not in self._failure_cache]
        failure_data = self._gets([(layout.status(j), None) for j in unknown])
        for j in unknown:
            self._failure_cache[j] = failure_summary(j, failure_data.get(layout.status(j)))
        self._failure_cache = {j: self._failure_cache[j] for j in newest_failed}

        with self._lock:
            before = (self.workers.copy(), {k: len(v) for k, v in self.assigned.items()})
            for gone in set(self.workers) - worker_ids:
                self.workers.pop(gone, None)
                self.assigned.pop(gone, None)
            for w in read_workers:
                item = found.get(layout.worker(w))
                if item is None:
                    self.workers.pop(w, None)
                else:
                    self.workers[w] = worker_info(w, item[0])
            for w in read_assigned:
                names = assigned.get(layout.worker_assignments(w))
                self.assigned[w] = set(names or ())
            live = set().union(*self.assigned.values()) if self.assigned else set()
            self.assigned_queue = {j: q for j, q in known_queue.items() if j in live}
            after = (self.workers, {k: len(v) for k, v in self.assigned.items()})
            self._bump("workers", before[0] != after[0])
            self._bump("assignments", before[1] != after[1])

            old_queues = (dict(self.pending), dict(self.delayed))
            for q in set(self.pending) - queue_names:
                self.pending.pop(q, None)
                self._sharded.discard(q)
            for q in read_queues:
                names = listed_queues.get(layout.queue(q))
                if names is None:
                    self.pending.pop(q, None)
                    self._sharded.discard(q)
                else:
                    stats = [shard_stats.get(layout.shard(q, n)) for n in names
                             if parse_shard(n)]
                    self.pending[q] = sum(1 for n in names if parse_job_node(n)) + sum(
                        stat.numChildren for stat in stats if stat is not None)
                    if stats:
                        self._sharded.add(q)
                    else:
                        self._sharded.discard(q)
                    self._bump(f"q:{q}", old_queues[0].get(q) != self.pending[q])
            if delayed is not None:
                self.delayed = delayed
                self._bump("delayed", old_queues[1] != delayed)
            self._bump("queues", old_queues != (self.pending, self.delayed))

            self._bump("leader", leader != self.leader)
            self.leader = leader
            if dead is not None:
                self._bump("deadletter", dead != self.dead_letters)
                self.dead_letters = dead
            if schedules is not None:
                self._bump("schedules", schedules != self.schedules)
                self.schedules = schedules

            old_totals = _totals(self.buckets)
            for b in set(self.buckets) - bucket_names:
                self.buckets.pop(b, None)
            self.buckets.update(buckets)
            self._bump("finished", old_totals != _totals(self.buckets))
            failures = [self._failure_cache[j] for j in newest_failed]
            self._bump("failures", failures != self.failures)
            self.failures = failures

            for j in watched:
                if j not in self.jobs:
                    continue
                item = statuses.get(layout.status(j))
                state = _state_of(item)
                job = {"id": j, "state": state,
                       "version": item[1].version if item else None,
                       "mzxid": item[1].mzxid if item else None}
                self._bump(f"job:{j}", job != self.jobs[j])
                self.jobs[j] = job
            for j in [j for j in self.jobs if time.monotonic() - self.job_polled.get(j, 0)
                      > self.IDLE_AFTER]:
                self.jobs.pop(j, None)
                self.job_polled.pop(j, None)
            # Topics of jobs no page follows, and of queues gone: one per job page ever
            # opened otherwise, copied into every live.json answer (a resource audit).
            for topic in [t for t in self.topics
                          if (t.startswith("job:") and t[4:] not in self.jobs)
                          or (t.startswith("q:") and t[2:] not in self.pending)]:
                del self.topics[topic]
            followed = ({f"w:{w}" for w in self.workers} | {f"a:{w}" for w in self.workers}
                        | {f"q:{q}" for q in self.pending} | {f"b:{b}" for b in self.buckets}
                        | {f"j:{j}" for j in self.jobs})
        # Forget the watch functions and read times of what is no longer followed (a
        # watch still armed keeps its function alive; firing, it marks a key nobody reads).
        for key in [k for k in self._watchers if ":" in k and k not in followed]:
            del self._watchers[key]
        for key in [k for k in self._last_read if ":" in k.removeprefix("size:")
                    and k.removeprefix("size:") not in followed]:
            del self._last_read[key]

    def _read_leader(self) -> dict | None:
        names = self._children([(self.layout.leader, "leader")])[self.layout.leader] or []
        if not names:
            return None
        first = min(names, key=election_order)
        found = self._gets([(self.layout.election_node(first), None)])
        item = found.get(self.layout.election_node(first))
        if item is None:
            self._mark("leader")
            return None
        raw, stat = item
        return {"worker": (raw or b"").decode("utf-8", "replace")[:200], "node": first,
                "since": _iso(took_over(stat)), "contenders": len(names),
                "rate_limits": self._read_rate_limits(first)}

    def _read_rate_limits(self, leader_node: str) -> dict[str, str] | None:
        """The limits the leader said it keeps (kept_rate_limits), watched with the
        leader. For display only: unreadable here (an ACL), they are unknown and the
        pages show their own settings, the rest of the overview unharmed."""
        try:
            found = self._gets([(self.layout.ratelimits, "leader")])
        except NoAuthError:
            return None
        return kept_rate_limits(found.get(self.layout.ratelimits), leader_node)


def _count_bucket(names: list[str]) -> _Bucket:
    bucket = _Bucket()
    failed = []
    for name in names:
        parsed = parse_finished_entry(name)
        if not parsed:
            continue
        job_id, code, queue = parsed
        if code == "S":
            bucket.succeeded += 1
        else:
            bucket.failed += 1
            failed.append(job_id)
        if queue is not None:
            item = bucket.per_queue.setdefault(queue, [0, 0])
            item[0 if code == "S" else 1] += 1
    bucket.failed_ids = tuple(sorted(failed, reverse=True))
    return bucket


def _totals(buckets: dict) -> tuple[int, int, int]:
    return (len(buckets), sum(b.succeeded for b in buckets.values()),
            sum(b.failed for b in buckets.values()))


def _state_of(item) -> str | None:
    if item is None:
        return None
    try:
        state = json.loads(item[0] or b"").get("state")
    except (ValueError, AttributeError, RecursionError):
        return "?"
    return state if state in records.STATES else "?"


def failure_summary(job_id: str, item) -> dict:
    """A failed job as the overview lists it (text only, never a pickle)."""
    if item is None:
        return {"id": job_id, "task": "", "queue": "", "error": "", "message": "(gone)",
                "finished_at": None, "attempts": 0}
    try:
        record = StatusRecord.from_bytes(item[0], path=f"status/{job_id}")
    except CorruptRecord as exc:
        return {"id": job_id, "task": "", "queue": "", "error": "CorruptRecord",
                "message": str(exc)[:300], "finished_at": None, "attempts": 0}
    error = record.errors[-1] if record.errors else None
    return {
        "id": job_id, "task": record.task, "queue": record.queue,
        "error": error.exception_class_path if error else "",
        "message": (error.message if error else "")[:300],
        "finished_at": _iso(record.finished_at), "attempts": record.attempts,
    }


def _iso(value) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


# -- one LiveState per (process, client, ROOT) ----------------------------------------------

_live_lock = threading.Lock()
_live: dict[tuple, LiveState] = {}
MAX_LIVE_STATES = 8
DROP_IDLE_AFTER = 600.0


def kept_rate_limits(item: tuple | None, leader_node: str) -> dict[str, str] | None:
    """The limits the leader of election znode `leader_node` said it keeps (the data of
    `ratelimits`, leader.py's _publish_rate_limits and `item` as read): {queue: "100/m"},
    or None while unknown (not said yet by this leader, a release before it said, or
    unreadable)."""
    try:
        data = records.loads(item[0]) if item is not None and item[0] else None
    except CorruptRecord:
        return None
    if not isinstance(data, dict) or data.get("node") != leader_node \
            or not isinstance(data.get("limits"), dict):
        return None
    return {str(queue): str(text)[:40] for queue, text in data["limits"].items()}


def with_rate_limits(data: dict, conf) -> dict:
    """A snapshot with each queue's rate limit ("100/m", or None) as the leader keeps it
    (the snapshot's leader's `rate_limits`), or, while the leader has not said, as this
    process's RATE_LIMITS has it (`rate_limit_source` "leader" or "settings"). Where the
    two differ (mid-deploy, a process started with other settings), `rate_limit_here`
    is this process's. A limited queue no job has used yet gets a row of its own, so
    its limit shows."""
    here = {queue: limit.text for queue, limit in conf.rate_limits.items()}
    kept = (data.get("leader") or {}).get("rate_limits")
    limits = here if kept is None else kept
    queues = {q["name"]: q for q in data.get("queues", [])}
    for name in (set(limits) | set(here)) - set(queues):
        queues[name] = {"name": name, "pending": 0, "delayed": 0, "assigned": 0, "running": 0,
                        "succeeded": None, "failed": None}
    rows = []
    for name, q in sorted(queues.items()):
        row = {**q, "rate_limit": limits.get(name),
               "rate_limit_source": "settings" if kept is None else "leader"}
        if kept is not None and here.get(name) != kept.get(name):
            row["rate_limit_here"] = here.get(name)
            row["rate_limit_differs"] = True
        rows.append(row)
    return {**data, "queues": rows}


def live_state(backend, client=None) -> LiveState:
    """Return this process's LiveState for the backend's ROOT, starting it on first use."""
    conf = backend.conf
    client = client if client is not None else connect(conf)
    key = (os.getpid(), id(client), conf.root)
    with _live_lock:
        state = _live.get(key)
        if state is not None and state.client is client:
            return state
        # Drop states of closed clients, of other processes and long-idle ones.
        for old_key, old in list(_live.items()):
            if (old_key[0] != os.getpid() or old.idle_for > DROP_IDLE_AFTER
                    or not old.client.connected and old.client.state == KazooState.LOST):
                old.close()
                del _live[old_key]
        while len(_live) >= MAX_LIVE_STATES:
            oldest = max(_live, key=lambda k: _live[k].idle_for)
            _live.pop(oldest).close()
        state = LiveState(client, Store(client, conf).layout)
        _live[key] = state
        return state


def reset_live_states() -> None:
    """Stop every LiveState of this process (settings changed, tests)."""
    with _live_lock:
        for state in _live.values():
            state.close()
        _live.clear()


def _on_setting_changed(*, setting, **kwargs):
    if setting == "TASKS":
        reset_live_states()


def connect_signals() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(_on_setting_changed, dispatch_uid="zktasks.dashboard")

