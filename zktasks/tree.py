"""Name every znode zktasks uses; the one place paths are built. Pure: no I/O.

The table below is the contract operators, the dashboard and other code read
(DESIGN.md, "ZooKeeper tree"). Only this module joins path segments.
"""

import hashlib
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass

# (path pattern, kind, written by, data)
LAYOUT = (
    ("{root}/leader/{uuid}__lock__{seq}", "EPHEMERAL_SEQUENTIAL", "every worker",
     "election contenders (kazoo Lock recipe); the lowest leads; data: worker id. "
     "The leader's own node fences each of its multis."),
    ("{root}/workers/{worker_id}", "EPHEMERAL", "the worker",
     "JSON: host, pid, queues, concurrency, prefetch, started_at, draining"),
    ("{root}/jobs/{queue}/{shard}", "PERSISTENT",
     "whoever first puts a job in it (in a retry after NoNode); the leader deletes it "
     "once empty and a few seconds old",
     "a shard of the queue: '{100-priority:03d}-{epoch_seconds:010d}', the priority and "
     "the second of submission shared by the jobs inside, both read from their names. "
     "Shards sort like the jobs in them, so the leader lists shard names and then only "
     "the first shards it needs (a children list stays under the 1 MB response limit); "
     "counts come from each shard's stat.numChildren; no data"),
    ("{root}/jobs/{queue}/{shard}/{job_node}", "PERSISTENT",
     "submitters; the leader on reassign",
     "one per job waiting to be assigned; name '{100-priority:03d}-{job_id}' sorts by "
     "priority, then submission time, and names its shard (no reads to find a job); "
     "data: JSON id, task, enqueued_at. A job node directly in jobs/{queue} (before "
     "sharding) is moved into its shard by the leader"),
    ("{root}/delayed/{due_minute}", "PERSISTENT",
     "whoever first puts a delayed job due in that minute (made on NoNode); the leader "
     "deletes it once empty and its minute is DELAYED_GRACE past",
     "the epoch second (10 digits) a minute of due times starts at; no data"),
    ("{root}/delayed/{due_minute}/{second}", "PERSISTENT",
     "as above; the leader deletes it once empty and its minute is past",
     "the second of submission (10 digits) of the jobs inside, read from their ids: "
     "bounds a shard by one second of submissions even when all are due at once; no data"),
    ("{root}/delayed/{due_minute}/{second}/{due_ms}-{100-priority}-{job_id}-{queue}",
     "PERSISTENT", "submitters (run_after); workers (retry backoff)",
     "jobs waiting for their time; the name sorts by due time, names its two shards (no "
     "reads to find it) and carries all the leader needs to move the job to jobs/{queue} "
     "when due; no data. A name directly in delayed/ (before sharding) is moved into its "
     "shard by the leader"),
    ("{root}/assignments/{worker_id}", "PERSISTENT", "the worker (with its worker node)",
     "parent of the worker's assignments; the leader deletes it once the worker is gone"),
    ("{root}/assignments/{worker_id}/{job_id}", "PERSISTENT", "the leader",
     "one per job assigned to that worker; data: JSON queue, node, assigned_at"),
    ("{root}/finished/{bucket_ms}[-{ttl_s}]", "PERSISTENT",
     "whoever records a final state (made on first use)",
     "a 10-second bucket of the finished index: finish times from bucket_ms on, of jobs "
     "kept for RESULT_TTL (no suffix) or for their own result_ttl of ttl_s seconds. It "
     "expires at bucket_ms + 10 s + its TTL; the leader then deletes it and its jobs"),
    ("{root}/finished/{bucket}/{second}", "PERSISTENT",
     "whoever records a final state (made on first use)",
     "one second of a bucket: the last digit of the finish second (0-9), so one list "
     "holds a second of finishes (1 MB is ~20,000 of them) while finished/ still holds "
     "one name per 10 seconds; deleted with its bucket; no data"),
    ("{root}/finished/{bucket}/{second}/{job_id}.{S|F}.{queue}", "PERSISTENT",
     "whoever records a final state (in the same multi)",
     "index of finished jobs: result expiry, purge and the dashboard's newest-first "
     "pages list buckets (merging those of one bucket_ms), never status/; no data. "
     "Entries directly in a bucket (before seconds) are read and expired alike"),
    ("{root}/unique/{sha256(unique_key)}", "PERSISTENT",
     "submitters (with the job, in one multi); removed when the job finishes",
     "JSON: job_id, key. Its existence makes a second submit with the key return the "
     "first job (NodeExists decides the race between web processes)"),
    ("{root}/cancel/{job_id}", "PERSISTENT", "result.cancel() of a job a worker holds",
     "JSON: force, requested_at. The holding worker stops the job; removed when it ends"),
    ("{root}/schedules/{name}", "PERSISTENT",
     "the leader; pause_schedule() and resume_schedule() (the shell, the dashboard)",
     "JSON: last_tick (ISO time of the last tick that got its job); advanced in the same "
     "multi that creates the tick's job. error, error_at: why the last attempted tick "
     "failed, noted by the leader and dropped when the next tick is recorded. paused, "
     "paused_at: set by pause_schedule() (no ticks); resume_schedule() writes last_tick "
     "alone (schedule_state.py). One that does not decode is moved to the dead letters "
     "by the leader, and the schedule starts again from now"),
    ("{root}/ratelimits", "PERSISTENT",
     "the leader (set once at the start of each term, fenced by its election znode)",
     "JSON: limits ({queue: rate as written, \"100/m\"}), node (the election znode of "
     "the leader that set it), at (ISO time): the limits that leader keeps, read by "
     "the dashboard and `zktasks status` (its own RATE_LIMITS may differ mid-deploy)"),
    ("{root}/ratelimits/{queue}", "PERSISTENT",
     "the leader (made when its term starts, set in the assignment multis that hand out "
     "the queue's jobs)",
     "JSON: tokens, at (epoch seconds), rate: a rate-limited queue's bucket as the last "
     "hand-out left it; the next leader takes it up (ratelimit.py). Empty until then"),
    ("{root}/status/{job_id}", "PERSISTENT", "submitters, workers, the leader",
     "the job's state record: JSON (payload and result inside are HMAC-signed dill)"),
    ("{root}/deadletter/{at_ms:013d}-{16 random hex}", "PERSISTENT",
     "the leader and workers, moving garbage aside (in the multi that deletes it)",
     "garbage found in the tree, kept for people: JSON path, kind, reason, at, by, job_id, "
     "size, data (base64 of the first bytes), truncated. Names sort by time. The dashboard "
     "lists them; re-queueing or discarding one deletes it"),
)

QUEUE_RE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}\Z")
JOB_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")
_JOB_NODE_RE = re.compile(r"^(\d{3})-([0-9a-f]{32})\Z")
_SHARD_RE = re.compile(r"^(\d{3})-(\d{10})\Z")
_DELAYED_RE = re.compile(r"^(\d{13})-(\d{3})-([0-9a-f]{32})-(.+)\Z")
_DELAYED_SHARD_RE = re.compile(r"^\d{10,13}\Z")
_DEAD_LETTER_RE = re.compile(r"^(\d{13})-[0-9a-f]{16}\Z")


_id_lock = threading.Lock()
_id_last = [0, 0]  # last millisecond used, counter within it


def new_job_id() -> str:
    """Return a fresh job id: 12 hex digits of milliseconds, a 4-digit counter, then 16
    random hex digits.

    Time first, so ids sort by submission time (FIFO among equal priorities) across
    processes whose clocks agree, and strictly in order within one process (the counter,
    and a clock that never steps back here); the random part makes a retried create
    recognisable as our own (the guid trick of ZooKeeper's recipes).
    """
    with _id_lock:
        ms = max(time.time_ns() // 1_000_000, _id_last[0])
        if ms == _id_last[0]:
            _id_last[1] += 1
            if _id_last[1] > 0xFFFF:
                ms, _id_last[1] = ms + 1, 0
        else:
            _id_last[1] = 0
        _id_last[0] = ms
        counter = _id_last[1]
    return f"{ms:012x}{counter:04x}{secrets.token_hex(8)}"


# Any one znode name ZooKeeper accepts (PathUtils.validatePath): not "." or "..", no "/",
# no control characters and none of the ranges it refuses. `\Z`, not `$`, in every
# pattern here: `$` also matches before a final newline ("emails\n").
ZNODE_NAME_RE = re.compile(
    r"^(?!\.\.?\Z)[^/\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]{1,255}\Z")


def is_znode_name(value) -> bool:
    """Whether `value` can be one step of a znode path (a worker id typed by a person)."""
    return isinstance(value, str) and bool(ZNODE_NAME_RE.match(value))


def is_job_id(value: str) -> bool:
    return bool(JOB_ID_RE.match(value))


def job_node_name(priority: int, job_id: str) -> str:
    """Name a pending job so that a plain sort gives the order of assignment."""
    return f"{100 - priority:03d}-{job_id}"


def parse_job_node(name: str) -> tuple[int, str] | None:
    """Return (priority, job_id) of a pending job's name, or None for a foreign name."""
    match = _JOB_NODE_RE.match(name)
    if not match:
        return None
    return 100 - int(match.group(1)), match.group(2)


def job_second(job_id: str) -> int:
    """The second of submission a job id starts with (its first 12 hex digits are ms)."""
    return int(job_id[:12], 16) // 1000


def shard_name(priority: int, job_id: str) -> str:
    """Name the shard of jobs/{queue} a pending job lives in: its priority and second.

    Derived from the job's own name, so every writer (submit, promote, requeue, retry,
    hand back, cancel) finds the path without a read, and a plain sort of shard names
    gives the same order as a sort of the jobs inside them.
    """
    return f"{100 - priority:03d}-{job_second(job_id):010d}"


def shard_of(job_node: str) -> str:
    """The shard of a pending job's node name ('{100-priority:03d}-{job_id}')."""
    return f"{job_node[:3]}-{job_second(job_node[4:]):010d}"


def parse_shard(name: str) -> tuple[int, int] | None:
    """Return (priority, epoch second) of a shard's name, or None for another name."""
    match = _SHARD_RE.match(name)
    if not match:
        return None
    return 100 - int(match.group(1)), int(match.group(2))


# Due times are named in 13 digits of epoch milliseconds (so that names sort by time):
# the last one is in November 2286. Later ones are refused where they are asked for.
DUE_MS_LIMIT = 10**13


def delayed_node_name(due_ms: int, priority: int, job_id: str, queue: str) -> str:
    """Name a job waiting for its time; a plain sort gives the order in which it is due."""
    return f"{due_ms:013d}-{100 - priority:03d}-{job_id}-{queue}"


def parse_delayed_node(name: str) -> tuple[int, int, str, str] | None:
    """Return (due_ms, priority, job_id, queue), or None for a foreign name."""
    match = _DELAYED_RE.match(name)
    # A queue part no queue can have ('..', a '/'): promoting it made a multi ZooKeeper
    # refused on every pass, and no delayed job due after it was promoted.
    if not match or not QUEUE_RE.match(match.group(4)):
        return None
    return int(match.group(1)), 100 - int(match.group(2)), match.group(3), match.group(4)


def delayed_shards(name: str) -> tuple[str, str] | None:
    """The two shards of a delayed job's name: (due minute, second of submission).

    Both come from the name (its due time, and its job id's first digits), so every
    writer and reader finds the path without a read. None for a foreign name.
    """
    parsed = parse_delayed_node(name)
    if parsed is None:
        return None
    return f"{parsed[0] // 60_000 * 60:010d}", f"{job_second(parsed[2]):010d}"


def is_delayed_shard(name: str) -> bool:
    """A due-minute or submission-second shard's name (epoch seconds)."""
    return bool(_DELAYED_SHARD_RE.match(name))


def dead_letter_name(at_ms: int) -> str:
    """Name a dead-letter entry: its time first (a plain sort is by time), then 16 random
    hex digits, so two processes moving garbage aside in the same millisecond never meet."""
    return f"{at_ms:013d}-{secrets.token_hex(8)}"


def parse_dead_letter_name(name: str) -> int | None:
    """Return the time (ms) of a dead-letter entry's name, or None for a foreign name."""
    match = _DEAD_LETTER_RE.match(name)
    return int(match.group(1)) if match else None


BUCKET_MS = 10_000
_BUCKET_RE = re.compile(r"^(\d{13})(?:-([1-9]\d{0,11}))?\Z")
MAX_RESULT_TTL = 10**12 - 1  # seconds: a bucket names a task's own TTL in 12 digits


def ttl_seconds(ttl: float) -> int:
    """Return a per-task result TTL as the whole seconds a bucket name carries (rounded
    up, so a result is never dropped before its TTL)."""
    return max(1, math.ceil(ttl))


def finished_bucket(finished_ms: int, ttl: float | None = None) -> str:
    """Name the 10-second bucket of the finished index that holds a finish time.

    Jobs kept for the global RESULT_TTL share the plain name; a job with its own
    result_ttl goes to a sibling bucket named after that TTL, so the leader can tell
    each bucket's expiry from its name alone: no extra znode or read per job.
    """
    start = f"{finished_ms - finished_ms % BUCKET_MS:013d}"
    return start if ttl is None else f"{start}-{ttl_seconds(ttl)}"


def parse_bucket(name: str) -> tuple[int, int | None] | None:
    """Return (start_ms, ttl_s or None for the global TTL) of a bucket, or None for a
    foreign name."""
    match = _BUCKET_RE.match(name)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)) if match.group(2) else None


def bucket_expiry_ms(name: str, default_ttl: float) -> int | None:
    """Return when a bucket's results expire (epoch ms): the end of its 10 seconds plus
    its TTL (the global one for a plain name). None for a foreign name."""
    parsed = parse_bucket(name)
    if parsed is None:
        return None
    start, ttl = parsed
    return start + BUCKET_MS + int((default_ttl if ttl is None else ttl) * 1000)


def bucket_start(name: str) -> str:
    """The 13-digit start of a bucket's name: what newest-first pages and cursors sort
    and merge by (buckets of one start but different TTLs hold the same 10 seconds)."""
    return name[:13]


_SECOND_RE = re.compile(r"^[0-9]\Z")


def finished_leaf(finished_ms: int, ttl: float | None = None) -> str:
    """Name, relative to finished/, the list an index entry goes in: its bucket and the
    second of the finish inside it ("1700000010000/3", "1700000010000-60/3").

    Why a second level: a bucket of 10 s passed ZooKeeper's 1 MB response limit at about
    2,300 finishes/s (bench/scale.py, a million jobs); a list per second holds ten times
    that, and finished/ keeps one name per 10 s for the leader to list.
    """
    return f"{finished_bucket(finished_ms, ttl)}/{finished_ms // 1000 % 10}"


def is_finished_second(name: str) -> bool:
    """Tell a bucket's second (a leaf list) from an entry written directly in it."""
    return bool(_SECOND_RE.match(name))


def finished_leaves(buckets, list_many) -> dict[str, dict[str, list[str]]]:
    """Map each bucket to its leaves and their names: {bucket: {leaf: names}}.

    A leaf is relative to finished/: "bucket/second", or the bucket itself when it holds
    entries directly (written before seconds existed). `list_many(relatives)` lists
    several at once and returns {relative: names, or None if gone}; this function does
    no I/O of its own, so the store, the dashboard and its live cache each list in
    their own way (plain, pipelined, watched). A missing bucket maps to {}.
    """
    out: dict[str, dict[str, list[str]]] = {}
    seconds = []
    listed = list_many(list(buckets))
    for bucket in buckets:
        names = listed.get(bucket) or []
        direct = [n for n in names if not is_finished_second(n)]
        out[bucket] = {bucket: direct} if direct else {}
        seconds += [f"{bucket}/{n}" for n in sorted(names) if is_finished_second(n)]
    listed = list_many(seconds) if seconds else {}
    for leaf in seconds:
        out[leaf.split("/", 1)[0]][leaf] = listed.get(leaf) or []
    return out


def finished_entry(job_id: str, state: str, queue: str) -> str:
    """Name an index entry: the job, its final state (S or F) and its queue, so counts by
    state and queue need no reads."""
    return f"{job_id}.{'S' if state == 'SUCCESSFUL' else 'F'}.{queue}"


def parse_finished_entry(name: str) -> tuple[str, str, str | None] | None:
    """Return (job_id, "S" or "F", queue) of an index entry, or None for a foreign name.

    The queue is None in entries written before it was part of the name.
    """
    parts = name.split(".", 2)
    if len(parts) < 2 or parts[1] not in ("S", "F") or not is_job_id(parts[0]):
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


@dataclass(frozen=True, slots=True)
class Layout:
    """Paths below one ROOT."""

    root: str

    @property
    def leader(self) -> str:
        return f"{self.root}/leader"

    @property
    def workers(self) -> str:
        return f"{self.root}/workers"

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"

    @property
    def delayed(self) -> str:
        return f"{self.root}/delayed"

    def delayed_minute(self, minute: str) -> str:
        return f"{self.delayed}/{minute}"

    def delayed_shard(self, minute: str, second: str) -> str:
        return f"{self.delayed}/{minute}/{second}"

    def delayed_job(self, name: str) -> str:
        """A delayed job's path, inside the shards its name points to. A foreign name
        (garbage to move aside) is where it can only be: directly in delayed/."""
        shards = delayed_shards(name)
        if shards is None:
            return self.unsharded_delayed_job(name)
        return f"{self.delayed}/{shards[0]}/{shards[1]}/{name}"

    def unsharded_delayed_job(self, name: str) -> str:
        """Where versions before sharding put a delayed job (the leader migrates it)."""
        return f"{self.delayed}/{name}"

    @property
    def finished(self) -> str:
        return f"{self.root}/finished"

    def finished_bucket(self, bucket: str) -> str:
        """A bucket, or any leaf below finished/ ("bucket/second")."""
        return f"{self.finished}/{bucket}"

    def finished_entry(self, leaf: str, entry: str) -> str:
        """An index entry in a leaf ("bucket/second", or a bucket for older entries)."""
        return f"{self.finished}/{leaf}/{entry}"

    @property
    def unique(self) -> str:
        return f"{self.root}/unique"

    def unique_key(self, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{self.unique}/{digest}"

    @property
    def schedules(self) -> str:
        return f"{self.root}/schedules"

    def schedule(self, name: str) -> str:
        return f"{self.schedules}/{name}"

    @property
    def ratelimits(self) -> str:
        """The rate-limited queues' buckets, as the last leader left them (made by the
        leader, not part of the skeleton)."""
        return f"{self.root}/ratelimits"

    def rate_state(self, queue: str) -> str:
        return f"{self.ratelimits}/{queue}"

    @property
    def cancel(self) -> str:
        return f"{self.root}/cancel"

    def cancel_request(self, job_id: str) -> str:
        return f"{self.cancel}/{job_id}"

    @property
    def deadletter(self) -> str:
        return f"{self.root}/deadletter"

    def dead_letter(self, name: str) -> str:
        return f"{self.deadletter}/{name}"

    @property
    def assignments(self) -> str:
        return f"{self.root}/assignments"

    @property
    def status_dir(self) -> str:
        return f"{self.root}/status"

    def election_node(self, node: str) -> str:
        return f"{self.leader}/{node}"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}/{worker_id}"

    def queue(self, queue: str) -> str:
        return f"{self.jobs}/{queue}"

    def shard(self, queue: str, shard: str) -> str:
        return f"{self.jobs}/{queue}/{shard}"

    def job(self, queue: str, node: str) -> str:
        """The path of a pending job: inside the shard its name points to."""
        return f"{self.jobs}/{queue}/{shard_of(node)}/{node}"

    def shard_child(self, queue: str, shard: str, name: str) -> str:
        """Any child of a shard, by its name (a foreign one, to move aside)."""
        return f"{self.shard(queue, shard)}/{name}"

    def unsharded_job(self, queue: str, node: str) -> str:
        """Where versions before sharding put a pending job (the leader migrates it)."""
        return f"{self.jobs}/{queue}/{node}"

    def worker_assignments(self, worker_id: str) -> str:
        return f"{self.assignments}/{worker_id}"

    def assignment(self, worker_id: str, job_id: str) -> str:
        return f"{self.assignments}/{worker_id}/{job_id}"

    def status(self, job_id: str) -> str:
        return f"{self.status_dir}/{job_id}"

    def skeleton(self) -> tuple[str, ...]:
        """The persistent parents every process may assume once created."""
        return (self.leader, self.workers, self.jobs, self.delayed, self.assignments,
                self.status_dir, self.finished, self.unique, self.cancel, self.schedules,
                self.deadletter)
