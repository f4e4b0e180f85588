"""The dead-letter place: garbage found in the tree is moved aside, once, for people to see.

A znode zktasks cannot use (a foreign name in a queue, an assignment whose data does not
decode, a job without a status record, a corrupt status record, a payload signed with
another key) would otherwise be re-read on every pass, or deleted with its bytes lost.
Instead, whoever finds it moves it to `{ROOT}/deadletter/{at_ms}-{random}` in one multi:
create the entry, delete the original (at the version read, so a znode somebody fixed
meanwhile is left alone); the leader's multis also check its fence. The entry keeps the
original path, why, when, who, the job id when known and the original bytes (base64,
bounded so the entry always fits in a znode). Nothing here unpickles anything.

The dashboard lists the entries; `ZooKeeperBackend.requeue_dead_letter()` sends the job an
entry refers to back to its queue and `discard_dead_letter()` forgets an entry.
"""

import base64
import binascii
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from kazoo.exceptions import KazooException, NoNodeError

from . import records
from .conf import MAX_RECORD_LIMIT
from .exceptions import CorruptRecord, ZooKeeperUnavailableError
from .store import TRANSIENT, Store, failures
from .tree import dead_letter_name, parse_dead_letter_name

logger = logging.getLogger(__name__)

KEEP_BYTES = 64 * 1024   # at most this many bytes of the original are kept
LIST_LIMIT = 200         # entries one listing reads at most
EXPIRE_BATCH = 500       # entries one expiry sweep deletes at most
# Kinds of entry that are the only place their job waits (see expire).
HOLD_KINDS = frozenset({"unreadable_assignment", "misplaced_job"})

# kind -> what it means, for people (the dashboard shows it next to the reason).
KINDS = {
    "foreign_name": "a name that is not a zktasks job name",
    "no_status": "a job whose status record does not exist",
    "unreadable_assignment": "an assignment whose data does not decode",
    "misplaced_job": "a waiting job's node in another shard than its name gives",
    "corrupt_status": "a status record that does not decode (the job was failed)",
    "foreign_signature": "a payload that fails its signature check (the job was failed)",
    "corrupt_schedule": "a schedule's state that does not decode (it started again from now)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """One entry of the dead-letter place, as read back."""

    name: str
    version: int = -1
    path: str = ""
    kind: str = ""
    reason: str = ""
    at: datetime | None = None
    by: str = ""
    job_id: str | None = None
    size: int = 0
    data: bytes = b""
    truncated: bool = False
    unreadable: str = ""   # why the entry itself does not decode (garbage in deadletter/)

    @property
    def meaning(self) -> str:
        return KINDS.get(self.kind, "")


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def keep_bytes(store: Store, beside: int = 0) -> int:
    """How much of the original an entry keeps: KEEP_BYTES, less where znodes are small
    (base64 grows 4/3; 2,000 bytes are left for the rest of the entry), and less where
    the multi creating the entry also writes `beside` bytes: the whole request must stay
    under jute.maxbuffer. Over it, the server drops the connection, and the multi was
    sent again and again (a job near MAX_RECORD_BYTES whose signature failed stayed
    READY for good, its worker reconnecting every few seconds)."""
    room = min(store.options.max_record_bytes, MAX_RECORD_LIMIT - beside)
    return max(0, min(KEEP_BYTES, (room - 2_000) * 3 // 4))


def encode(path: str, raw: bytes | None, *, kind: str, reason: str, by: str,
           job_id: str | None, keep: int) -> bytes:
    raw = raw or b""
    kept = raw[:keep]
    return records.dumps({
        "path": path, "kind": kind, "reason": one_line(reason), "at": records.now().isoformat(),
        "by": by, "job_id": job_id, "size": len(raw), "truncated": len(kept) < len(raw),
        "data": base64.b64encode(kept).decode("ascii"),
    })


def decode(name: str, raw: bytes | None, version: int = -1) -> DeadLetter:
    """Read an entry back; an entry that is itself garbage says so instead of raising."""
    try:
        data = json.loads(raw or b"")
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        at = data.get("at")
        job_id = data.get("job_id")
        return DeadLetter(
            name=name, version=version, path=str(data.get("path", "")),
            kind=str(data.get("kind", "")), reason=str(data.get("reason", "")),
            at=datetime.fromisoformat(at) if isinstance(at, str) else None,
            by=str(data.get("by", "")), job_id=job_id if isinstance(job_id, str) else None,
            size=int(data.get("size", 0)), truncated=bool(data.get("truncated")),
            data=base64.b64decode(str(data.get("data", "")), validate=True),
        )
    except (ValueError, TypeError, OverflowError, binascii.Error, RecursionError) as exc:
        # OverflowError: a "size" of 1e400 (int(inf)); garbage like any other
        at_ms = parse_dead_letter_name(name)
        return DeadLetter(
            name=name, version=version, size=len(raw or b""), data=raw or b"",
            at=datetime.fromtimestamp(at_ms / 1000, UTC) if at_ms else None,
            unreadable=f"This entry is not one zktasks wrote ({exc}); discard it.",
        )


def entry(store: Store, path: str, raw: bytes | None, *, kind: str, reason: str, by: str,
          job_id: str | None = None, beside: int = 0) -> tuple[str, bytes]:
    """Return (path, data) of a new entry about `path`, making sure its parent exists.
    `beside`: bytes the multi carrying it writes besides (keep_bytes).

    Ensuring the parent costs a request, but only on this rare path: a tree made before
    the dead-letter place existed, or an operator who deleted it, must not make the
    multi carrying the entry fail (for a worker, that would drop a job's outcome).
    """
    store.retry(store.client.ensure_path, store.layout.deadletter)
    at_ms = int(records.now().timestamp() * 1000)
    data = encode(path, raw, kind=kind, reason=reason, by=by, job_id=job_id,
                  keep=keep_bytes(store, beside))
    return store.layout.dead_letter(dead_letter_name(at_ms)), data


def move_aside(store: Store, path: str, raw: bytes | None, version: int, *, kind: str,
               reason: str, by: str, job_id: str | None = None,
               fence: str | None = None) -> tuple[str, list]:
    """Create an entry about `path` and delete `path` (at `version`) in one multi.

    Return (entry path, failed ops as store.failures gives them): none means moved.
    With `fence` (the leader's), the multi checks it first: a failure at index 0 then
    means leadership is lost. BadVersion or NoNode on the delete mean somebody changed
    or removed the original meanwhile: nothing was written.
    """
    entry_path, data = entry(store, path, raw, kind=kind, reason=reason, by=by,
                             job_id=job_id)

    def build(txn):
        if fence:
            txn.check(fence, -1)
        txn.create(entry_path, data)
        txn.delete(path, version=version)

    results = store.commit(build, landed=lambda: store.client.exists(entry_path) is not None)
    return entry_path, failures(results)


def read(store: Store, name: str) -> DeadLetter | None:
    try:
        raw, stat = store.retry(store.client.get, store.layout.dead_letter(name))
    except NoNodeError:
        return None
    return decode(name, raw, stat.version)


def names(store: Store) -> list[str]:
    """Every entry's name, newest first."""
    return sorted(store.children(store.layout.deadletter), reverse=True)


def listing(store: Store, limit: int = 50, *, after: str | None = None,
            timeout: float = 10.0) -> list[DeadLetter]:
    """Entries, newest first, at most `limit` (and LIST_LIMIT), after the name `after`.

    Reads are pipelined (async gets), so a page costs one round trip, not one per entry.
    """
    chosen = [n for n in names(store) if after is None or n < after]
    # One over LIST_LIMIT: a full page asks for one more to know whether there is more.
    chosen = chosen[:max(0, min(limit, LIST_LIMIT + 1))]
    requests = [(n, store.client.get_async(store.layout.dead_letter(n))) for n in chosen]
    out = []
    for name, request in requests:
        try:
            raw, stat = request.get(timeout=timeout)
        except NoNodeError:
            continue  # re-queued or discarded meanwhile
        except (*TRANSIENT, KazooException) as exc:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper stopped answering while reading dead-letter entry {name!r} "
                f"({type(exc).__name__})."
            ) from exc
        out.append(decode(name, raw, stat.version))
    return out


def expire(store: Store, *, fence: str | None, now_ms: int, ttl: float | None,
           limit: int) -> tuple[int, int, int]:
    """Delete the entries older than `ttl` seconds (None: kept however old) and then the
    oldest beyond `limit`; return (expired, deleted over the limit, held).

    The leader's job (its fence checked). Without it, garbage arriving without end (a
    foreign client writing into a queue) would grow the place, and ZooKeeper's heap, by
    up to about 90 KB an entry (64 KiB, base64) with no bound. Names sort by time, so
    both kinds are the oldest names. At most EXPIRE_BATCH are deleted a sweep (the rest
    at the next one).

    An entry is held, never deleted here, while it is the only place its job waits: an
    assignment that did not decode (HOLD_KINDS) of a job still READY or RUNNING. Deleting
    it would lose the job; it waits for a person to re-queue or discard it.
    """
    found = sorted(n for n in store.children(store.layout.deadletter)
                   if parse_dead_letter_name(n) is not None)
    old = [n for n in found
           if ttl is not None and parse_dead_letter_name(n) + ttl * 1000 <= now_ms]
    over = found[len(old):][:max(0, len(found) - len(old) - limit)]
    candidates = [*old, *over]
    # Held entries are left out before the batch is cut, a batch's worth of reads at a
    # time: cut first, EXPIRE_BATCH held entries at the old end would fill every sweep's
    # batch and nothing else would ever be deleted.
    doomed: list[str] = []
    held: set[str] = set()
    for start in range(0, len(candidates), EXPIRE_BATCH):
        if len(doomed) >= EXPIRE_BATCH:
            break
        chunk = candidates[start:start + EXPIRE_BATCH]
        holding = _holding_a_job(store, chunk)
        held |= holding
        doomed += [n for n in chunk if n not in holding]
    doomed = doomed[:EXPIRE_BATCH]
    if not doomed:
        return 0, 0, len(held)
    expired = set(old)
    paths = {kind: [store.layout.dead_letter(n) for n in doomed
                    if (n in expired) == kind] for kind in (True, False)}
    return (store.delete_paths(fence, paths[True]), store.delete_paths(fence, paths[False]),
            len(held))


def _holding_a_job(store: Store, names: list[str]) -> set[str]:
    """The entries among `names` that are where an unfinished job waits (pipelined
    reads: the entries, then the status records of the jobs they name)."""
    requests = [(n, store.client.get_async(store.layout.dead_letter(n))) for n in names]
    candidates = {}
    for name, request in requests:
        try:
            raw, stat = request.get(timeout=store.options.session_timeout)
        except NoNodeError:
            continue
        found = decode(name, raw, stat.version)
        if found.kind in HOLD_KINDS and found.job_id:
            candidates[name] = found.job_id
    if not candidates:
        return set()
    status = store.read_statuses(set(candidates.values()))
    held = set()
    for name, job_id in candidates.items():
        try:
            found = status(job_id)
        except CorruptRecord:
            continue
        if found is not None and not found.record.is_finished:
            held.add(name)
    return held


def discard(store: Store, name: str, version: int = -1) -> bool:
    """Delete an entry; False if it was gone already (or changed, given a version)."""
    path = store.layout.dead_letter(name)

    def build(txn):
        txn.delete(path, version=version)

    results = store.commit(build, landed=lambda: store.client.exists(path) is None)
    return not failures(results)
