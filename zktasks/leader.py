"""Elect a leader and run its duties: assign pending jobs, hand back dead workers' jobs.

Election is kazoo's Lock recipe (ephemeral sequential znodes with a uuid prefix, each
contender watching only its predecessor). kazoo does not stop a leader when its session
goes, so this module does (Curator's SUSPENDED/LOST policy): on SUSPENDED the leader
assigns nothing; on reconnection it checks its election znode is still its own; on LOST it
abdicates and contends again. Every multi it issues checks its own sequential election
znode, a name that can never come back, so a paused leader's late writes fail (rule 2).

Watches only set flags and wake the leader thread, which does every read itself: its
reads then follow its own writes in ZooKeeper's per-client order, so its view never
regresses behind its own multis (a recipe's callback, reading on kazoo's thread, could
deliver a list read before our last multi).
"""

import heapq
import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kazoo.exceptions import (
    BadVersionError,
    CancelledError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.protocol.states import EventType, KazooState

from . import deadletter, records, schedule_state
from .exceptions import CorruptRecord, ZooKeeperUnavailableError
from .handler import inline_watch
from .ratelimit import Buckets
from .store import MAX_WORKER_LOSSES, TRANSIENT, Store, failures
from .tree import (
    QUEUE_RE,
    delayed_shards,
    is_delayed_shard,
    job_node_name,
    parse_delayed_node,
    parse_job_node,
    parse_shard,
    shard_of,
)

logger = logging.getLogger(__name__)

BATCH = 100              # jobs per assignment multi (ops = 2 per job + the fence)
RECONCILE_EVERY = 30.0   # seconds between full re-reads even when no watch fired
RELIST_EVERY = 0.1       # seconds: the most often a queue with local work is re-listed
EXPIRE_EVERY = 10.0      # seconds: the longest between sweeps of expired results
SCHEDULE_RETRY = 5.0     # seconds before a schedule tick that failed is tried again
SCHEDULE_SKEW = 60.0     # seconds a schedule's last tick may lie ahead of this clock
SCHEDULE_ERROR_CHARS = 500  # of a failing schedule's error, kept in its znode
# One expiry sweep handles at most this many finished buckets and entries (a few tenths
# of a second): it runs on the leader's only thread; the rest waits for the next tick.
EXPIRE_BUCKETS = 50
EXPIRE_ENTRIES = 2_000
SHARD_GRACE = 2.0        # seconds: an empty shard is deleted once its second is this old
# Jobs one a second each open a shard, and deleting each emptied one alone was a fourth
# write transaction per job (bench/run.py --sparse). An empty shard old enough to delete
# rides in the next assignment multi (up to RIDE_MAX of them), or, with nothing to
# assign for 5-15 s, goes with the others on a multiple of SWEEP_ALIGN seconds (epoch
# time) in one fenced multi of its own.
SWEEP_ALIGN = 10.0
RIDE_MAX = 50
DELAYED_LOAD = 10_000     # due delayed names loaded at once (more once those are moved)
DELAYED_GRACE = 60.0     # seconds past its minute before an empty delayed shard is deleted


def _announce(result) -> None:
    """task_enqueued for a tick's job, as backend.write() sends it for a submit (Celery
    beat's publish signals fire in beat's process too). On a thread of its own: a
    receiver must never hold up the leader's assignments, nor end its term by raising."""
    from django.tasks import task_backends
    from django.tasks.signals import task_enqueued

    def send():
        try:
            task_enqueued.send(type(task_backends[result.backend]), task_result=result)
        except Exception:
            logger.exception("task_enqueued receiver failed job=%s", result.id)

    threading.Thread(target=send, name="zktasks-tick-signal", daemon=True).start()


def _worker_fields(data) -> tuple[frozenset[str], int, int, bool]:
    """(queues, concurrency, prefetch, draining) of a worker znode's data; ValueError
    when it is not what a worker writes."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    queues = data.get("queues") or ()
    if not isinstance(queues, list | tuple) or not all(isinstance(q, str) for q in queues):
        raise ValueError(f"its queues are {records.printable(repr(queues))[:80]}")

    def count(key: str, default: int, least: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"its {key} is {records.printable(repr(value))[:40]}")
        return max(least, value)

    return (frozenset(queues), count("concurrency", 1, 1), count("prefetch", 0, 0),
            bool(data.get("draining")))


def _oldest(held: dict[str, tuple]) -> str | None:
    """The job of a vanished worker's assignments made first (lowest czxid), or None
    when there is none or several share that transaction (one assign multi): the one
    job that worker may have run without a RUNNING record (worker._unrecorded_start
    runs a job so only while it is the worker's one assignment, and every assignment
    made after it is newer). Two made in one multi were both listed at once, so
    neither ran that way."""
    if not held:
        return None
    czxids = sorted((stat.czxid, job_id) for job_id, (_, stat) in held.items())
    if len(czxids) > 1 and czxids[0][0] == czxids[1][0]:
        return None
    return czxids[0][1]


class LeadershipLost(Exception):
    """Our election znode is gone: stop acting as leader at once."""


@dataclass(slots=True)
class WorkerView:
    worker_id: str
    queues: frozenset[str] = frozenset()
    concurrency: int = 1
    prefetch: int = 0
    draining: bool = False
    assigned: set[str] = field(default_factory=set)

    def serves(self, queue: str) -> bool:
        return not self.queues or queue in self.queues

    @property
    def capacity(self) -> int:
        return self.concurrency + self.prefetch

    @property
    def free(self) -> int:
        return 0 if self.draining else self.capacity - len(self.assigned)

    @property
    def idle(self) -> int:
        """Runners with no job assigned: a job sent here starts at once."""
        return 0 if self.draining else max(0, self.concurrency - len(self.assigned))

    @property
    def wants_work(self) -> bool:
        """Refill once half the prefetched jobs are gone, not after each job: under a
        backlog that makes assignments batches (one multi for many jobs), and the
        worker still has jobs queued while the refill travels. A runner never waits:
        the refill comes before the queue runs dry."""
        queued = len(self.assigned) - self.concurrency
        return self.free > 0 and queued <= self.prefetch // 2


class Leader:
    """Contend for leadership with one identity; lead while elected."""

    def __init__(self, store: Store, identity: str, *, stop: threading.Event):
        self.store = store
        self.client = store.client
        self.layout = store.layout
        self.identity = identity
        self.stop_event = stop
        self.wake = threading.Event()
        self.lock = None
        self.fence: str | None = None
        self.is_leader = False
        self.suspended = False
        self.fence_lost = False
        self.on_change = None  # optional callback(bool) for logs and tests
        # Optional callback(record) once this leader has failed a job itself (its workers
        # kept vanishing): the worker sends task_finished for it.
        self.on_failed = None
        # What needs re-reading; "*" means everything.
        self._dirty: set[str] = {"*"}
        self._dirty_lock = threading.Lock()
        self.workers: dict[str, WorkerView] = {}
        # Pending jobs, sharded (see tree.LAYOUT): the sorted shard names of each queue,
        # the children of the first shards only (enough to fill free capacity), and
        # their concatenation, which is what plan() hands out from.
        self.shards: dict[str, list[str]] = {}
        self.loaded: dict[str, dict[str, list[str]]] = {}
        self.pending: dict[str, list[str]] = {}
        self.max_listed = 0  # the longest children list read (tests, the scale bench)
        self._sweep_at: float | None = None  # when a kept empty shard is due to go alone
        # (queue, shard, due) of the empty shards old enough to delete, this tick's.
        self._riders: list[tuple[str, str, bool]] = []
        self._born: dict[str, float] = {}  # shard key -> its znode's ctime (epoch seconds)
        self._stale: set[str] = set()  # queues whose pending view plan() left wrong
        self.delayed: list[str] = []  # sorted names of due jobs: the first is due first
        self._delayed_next_ms: int | None = None  # the first due time not loaded yet
        self.assignments_total = 0
        self._unserved: set[str] = set()  # queues with jobs no live worker serves (warned)
        self._last_expiry = -math.inf  # monotonic; not 0.0, which counts from boot
        self._next_expiry = 0.0       # epoch seconds the earliest finished bucket expires
        self._expiry_cursor = ""      # where a capped expiry sweep resumes (expire_finished)
        self._last_cancel_sweep = -math.inf
        self._watch_fns: dict[str, Callable] = {}  # see _watch
        self._finished_watch = self._watch("finished")
        # A persistent recursive watch on assignments/ (connection.py), while leading:
        # each assignment made or deleted, (worker id, job id, created) in order, so
        # that a worker's finishes need no listing of its assignments. With one-shot
        # watches, each change cost a child watch and a get_children: in a stream of
        # no-op jobs a list of both workers' assignments per assignment multi, 0.5
        # requests a job of 3.8 (bench/README, "The leader follows assignments").
        self._assignments_watched = False
        self._assignment_events: list[tuple[str, str, bool]] = []
        self._assignment_events_lock = threading.Lock()
        # Jobs were left pending after the last plan (no free slot, or a token): only
        # then does a finish wake the leader. Otherwise its event waits for the next
        # tick (a job's arrival): woken per finish, the leader ticked per job in a
        # stream, and assignments that had shared multis went one by one.
        self._waiting = True
        self._woken = False  # a wake-up for the events noted is on its way
        self._next_ticks: dict[str, float] = {}  # wall-clock times (epoch seconds)
        self._unanswered_ticks: dict[str, tuple] = {}  # name -> (tick, result) in flight
        self._known_ticks: dict[str, object] = {}  # name -> last tick seen recorded, this term
        self._buckets_taken_up = False  # this term's (see _take_up_buckets)
        self._clock_offset = time.time() - time.monotonic()  # to see the clock set back
        self._listed_at: dict[str, float] = {}
        self._deferred: set[str] = set()
        self._broken_schedules: dict[str, str] = {}  # name -> the error it failed with
        self._stuck_garbage: set[str] = set()  # paths that could not be moved aside
        self.buckets = Buckets(store.options.rate_limits, time.monotonic())
        self._throttled: set[str] = set()  # limited queues whose jobs wait for a token

    # -- election ----------------------------------------------------------------------

    def contend(self) -> bool:
        """Block until elected (True) or told to stop (False)."""
        self.lock = self.client.Lock(self.layout.leader, identifier=self.identity)
        try:
            acquired = self.lock.acquire()
        except CancelledError:
            return False
        if not acquired or self.stop_event.is_set():
            self._release()
            return False
        self.fence = self.layout.election_node(self.lock.node)
        # A LOST seen while we waited belongs to the session kazoo's Lock left behind (it
        # makes a new node on the new session and goes on waiting): forget it before
        # checking the fence on the session that holds it. kazoo delivers a LOST before
        # any reply on the next session, so one that comes after this check is ours, and
        # _lead() steps down for it. Without this, a contender whose session expired while
        # it waited was elected and stepped down at once (bench/chaos.py saw it twice a
        # run: "leader elected", "leadership lost", the next contender elected in 20 ms).
        self.fence_lost = False
        if not self._own_fence():
            return False
        try:
            # Stamp the election znode: its mtime then says since when we lead (the
            # dashboard shows it); the fence checks existence, not this version.
            self.client.set(self.fence, self.identity.encode())
        except KazooException:
            return False
        return True

    def _own_fence(self) -> bool:
        """Confirm the election znode exists and belongs to our current session."""
        try:
            stat = self.client.exists(self.fence)
        except TRANSIENT:
            return False
        client_id = self.client.client_id  # None while the connection is down
        return (stat is not None and client_id is not None
                and stat.ephemeralOwner == client_id[0])

    def cancel(self) -> None:
        self.stop_event.set()
        self.wake.set()
        if self.lock is not None:
            self.lock.cancel()

    def _release(self) -> None:
        if self.lock is None:
            return
        try:
            self.lock.release()
        except KazooException:
            logger.debug("leader lock release failed", exc_info=True)
        self.lock = None

    # -- connection state (called on kazoo's thread: never block, never call ZooKeeper) --

    def on_state(self, state) -> None:
        if state == KazooState.SUSPENDED:
            self.suspended = True
        elif state == KazooState.CONNECTED:
            self.suspended = False
            self.mark("*")
        elif state == KazooState.LOST:
            self.suspended = True
            self.fence_lost = True
        self.wake.set()

    def mark(self, key: str) -> None:
        with self._dirty_lock:
            self._dirty.add(key)
        self.wake.set()

    def _watch(self, key: str):
        """The watch function for `key`, one per key: kazoo keeps a path's functions in a
        set until the path changes, and a new closure per read added one at every re-read
        of an unchanged path (each 30 s reconcile, each term, each delayed mark: 209
        idle paths grew by 61 functions each in 45 s of fast reconciles)."""
        fire = self._watch_fns.get(key)
        if fire is None:
            @inline_watch  # it only marks and wakes: run on kazoo's connection thread
            def fire(event):
                # kazoo fires NONE on disconnect and forgets the watch: re-read everything.
                self.mark("*" if event.type == EventType.NONE else key)
            self._watch_fns[key] = fire
        return fire

    @inline_watch  # it only notes and wakes: run on kazoo's connection thread
    def _on_assignment_event(self, event) -> None:
        """The persistent watch on assignments/: note the job made or deleted under a
        worker's assignments, and wake the leader (once for all it has not read)."""
        if event.type not in (EventType.CREATED, EventType.DELETED):
            return
        prefix = self.layout.assignments + "/"
        if not event.path.startswith(prefix):
            return
        worker_id, sep, job_id = event.path[len(prefix):].partition("/")
        if not sep or not job_id or "/" in job_id:
            return  # a worker's parent node, or deeper than an assignment
        with self._assignment_events_lock:
            if not self._assignments_watched:
                return  # not leading: nobody reads them
            created = event.type == EventType.CREATED
            self._assignment_events.append((worker_id, job_id, created))
            # Made by us (assignments are the leader's), or a finish with nothing
            # waiting for its slot: noted for the next tick, no wake-up.
            wake = not created and self._waiting and not self._woken
            self._woken |= wake
        if wake:
            self.mark("assignments")

    def _watch_assignments(self) -> None:
        """Arm (again) the persistent watch on assignments/, at a full read: the server
        forgets it with the connection, and the full read that follows a reconnection
        lists every worker's assignments after arming it, so nothing missed is lost.
        Events noted until now are in those lists."""
        try:
            armed = self.store.watch_persistently(self.layout.assignments,
                                                  self._on_assignment_event)
        except BaseException:
            self._unwatch_assignments()
            raise
        with self._assignment_events_lock:
            self._assignments_watched = armed
            self._assignment_events = []

    def _unwatch_assignments(self) -> None:
        """Stop following assignments (the term is over); the next term arms again."""
        with self._assignment_events_lock:
            watched, self._assignments_watched = self._assignments_watched, False
            self._assignment_events = []
        if watched:
            self.store.unwatch_persistently(self.layout.assignments,
                                            self._on_assignment_event)

    def _take_assignment_events(self) -> list[tuple[str, str, bool]]:
        with self._assignment_events_lock:
            events, self._assignment_events = self._assignment_events, []
            self._woken = False
        return events

    def _note_waiting(self) -> None:
        """After a plan: whether jobs wait for a slot, which a finish then wakes us for;
        a finish noted while nothing waited (during this tick) wakes us now."""
        waiting = any(self.pending.values())
        with self._assignment_events_lock:
            self._waiting = waiting
            wake = waiting and not self._woken and any(
                not created for _, _, created in self._assignment_events)
            self._woken |= wake
        if wake:
            self.mark("assignments")

    def _unwatch(self, *keys: str) -> None:
        """Forget the functions of keys whose path is gone (a worker, a shard, a queue)."""
        for key in keys:
            self._watch_fns.pop(key, None)

    # -- leading -----------------------------------------------------------------------

    def run(self) -> None:
        """Contend and lead until stopped; contend again after losing leadership."""
        while not self.stop_event.is_set():
            try:
                if not self.contend():
                    self._release()
                    if self.stop_event.is_set():
                        return
                    continue
                self._lead()
            except LeadershipLost as exc:
                logger.warning("leadership lost worker=%s reason=%s", self.identity, exc)
            except (KazooException, ZooKeeperUnavailableError) as exc:
                logger.warning("leader error worker=%s error=%r; contending again",
                               self.identity, exc)
            except Exception:
                # A bug in one duty must not leave the cluster without a leader.
                logger.exception("leader failed worker=%s; contending again", self.identity)
            finally:
                self._set_leader(False)
                self._unwatch_assignments()
                self._release()
            # Back off briefly so a flapping connection does not spin.
            self.stop_event.wait(0.2)

    def _set_leader(self, value: bool) -> None:
        if value != self.is_leader:
            self.is_leader = value
            if value:
                logger.info("leader elected worker=%s fence=%s", self.identity, self.fence)
            else:
                logger.info("leader stepped down worker=%s", self.identity)
            if self.on_change:
                self.on_change(value)

    def _lead(self) -> None:
        self._set_leader(True)
        self._unserved = set()  # a new term warns again
        self._next_ticks.clear()  # and reads every schedule's state anew
        self._unanswered_ticks.clear()  # what landed meanwhile may be another leader's
        self._known_ticks.clear()
        for queue, limit in sorted(self.buckets.limits.items()):
            logger.info("rate limit queue=%s %s (for the whole cluster)", queue, limit.text)
        self._buckets_taken_up = False  # _tick takes them up before any hand-out
        self.mark("*")  # rule 6: a new leader reconciles from the whole tree
        last_full = time.monotonic()  # the mark just above is the first full read
        while not self.stop_event.is_set():
            if self.fence_lost:
                raise LeadershipLost("session expired")
            if self.suspended:
                self.wake.wait(1.0)
                self.wake.clear()
                continue
            now = time.monotonic()
            if now - last_full > RECONCILE_EVERY:
                self.mark("*")
                last_full = now
            self.wake.clear()
            try:
                self._tick()
            except (*TRANSIENT, ZooKeeperUnavailableError):
                # Outcome unknown: re-read the truth after reconnecting. (A process frozen
                # past the session timeout wakes with every retry deadline already spent.)
                self.mark("*")
                self.wake.wait(0.1)
                continue
            # Sleep until a watch fires, the next delayed job is due or the next expiry
            # sweep: no polling.
            self.wake.wait(min(EXPIRE_EVERY, self._until_next_due(),
                               self._until_next_tick(), self._until_next_expiry(),
                               self._until_sweep(), self._until_token(),
                               RELIST_EVERY if self._deferred else RECONCILE_EVERY))

    def _tick(self) -> None:
        if self._delayed_next_ms is not None and time.time() * 1000 >= self._delayed_next_ms:
            self._delayed_next_ms = None
            self.mark("delayed")  # the next delayed jobs are due: read them
        with self._dirty_lock:
            dirty, self._dirty = self._dirty | self._deferred, set()
        self._deferred = set()
        if dirty:
            if "*" in dirty and not self._own_fence():
                raise LeadershipLost("election znode gone")
            self._refresh(dirty)
            if "*" in dirty or "workers" in dirty:
                self._reassign_orphans()
        self._load_shards(dirty)
        self._promote_due()
        self._run_schedules()
        if not self._buckets_taken_up:
            # Here, not at the term's start, so that ZooKeeper trouble is retried as any
            # read of the tick is (not a term given up); nothing is handed out before.
            self._take_up_buckets()
            self._publish_rate_limits()
            self._buckets_taken_up = True
        self._assign()
        self._note_waiting()
        self._sweep_shards()
        self._note_unserved()
        self._expire_results(listed=bool(dirty & {"*", "finished"}))

    # -- reads ---------------------------------------------------------------------------

    def _refresh(self, dirty: set[str]) -> None:
        full = "*" in dirty
        if full:
            self._watch_assignments()
        # Taken before any list below: a worker listed now has these in its list, and
        # what changes after it comes as the next events.
        events = self._take_assignment_events()
        if full or "workers" in dirty:
            live = set(self.store.children(self.layout.workers, watch=self._watch("workers")))
            for gone in set(self.workers) - live:
                del self.workers[gone]
                self._unwatch(f"a:{gone}", f"w:{gone}")
            for worker_id in live - set(self.workers):
                self.workers[worker_id] = WorkerView(worker_id)
                dirty.add(f"w:{worker_id}")
                dirty.add(f"a:{worker_id}")
        listed = set()
        for worker_id, view in self.workers.items():
            if full or f"w:{worker_id}" in dirty:
                self._read_worker(view)
            if full or f"a:{worker_id}" in dirty:
                path = self.layout.worker_assignments(worker_id)
                watch = None if self._assignments_watched else self._watch(f"a:{worker_id}")
                view.assigned = set(self.store.children(path, watch=watch))
                listed.add(worker_id)
        for worker_id, job_id, created in events:  # in order: the last word on each job
            view = self.workers.get(worker_id)
            if view is not None and worker_id not in listed:
                if created:
                    view.assigned.add(job_id)
                else:
                    view.assigned.discard(job_id)
        if full or "queues" in dirty:
            queues = self.store.children(self.layout.jobs, watch=self._watch("queues"))
            for queue in queues:
                if queue not in self.shards:
                    dirty.add(f"q:{queue}")
            for queue in set(self.shards) - set(queues):
                self._forget_queue(queue)
        now = time.monotonic()
        for queue in set(self.shards) | {k[2:] for k in dirty if k.startswith("q:")}:
            if not (full or f"q:{queue}" in dirty):
                continue
            if self._defer(f"q:{queue}", queue, full, now):
                continue
            watch = self._watch(f"q:{queue}")
            names = self.store.children(self.layout.queue(queue), watch=watch)
            self._seen(names)
            self._listed_at[f"q:{queue}"] = now
            unsharded = sorted(n for n in names if parse_job_node(n))
            if unsharded:
                self._migrate(queue, unsharded)
            self.shards[queue] = sorted(n for n in names if parse_shard(n))
            for name in names:
                if not parse_job_node(name) and not parse_shard(name):
                    self._move_aside(
                        self.layout.unsharded_job(queue, name), kind="foreign_name",
                        reason=f"{name!r} in queue {queue!r} is not a pending job's name "
                               "('{100-priority:03d}-{job_id}') nor a shard's "
                               "('{100-priority:03d}-{second:010d}').")

        if full or "delayed" in dirty:
            self._load_delayed()

    def _load_delayed(self) -> None:
        """Load the names of the delayed jobs that are due, at most DELAYED_LOAD, and the
        first due time among the others (when to wake). Never the whole of delayed/: the
        due minutes are listed, then the shards of those that have begun (and of the
        first one), each list bounded by one second of submissions; names not due are
        dropped as they are read, so memory holds only what is about to move.

        Every list is watched under one key, so any change re-reads this part. Empty
        shards and minutes are deleted once their minute is DELAYED_GRACE past (writers
        only add jobs due in the future; one racing with the delete makes it again).
        """
        layout = self.layout
        watch = self._watch("delayed")
        names = self.store.children(layout.delayed, watch=watch)
        self._seen(names)
        flat = sorted(n for n in names if parse_delayed_node(n))
        if flat:
            self._migrate_delayed(flat)
        minutes = sorted(n for n in names if is_delayed_shard(n))
        for name in set(names) - set(flat) - set(minutes):
            self._move_aside(layout.unsharded_delayed_job(name), kind="foreign_name",
                             reason=f"{name!r} in delayed/ is neither a due minute "
                                    "('{epoch_second:010d}') nor a delayed job's name "
                                    "('{due_ms}-{100-priority}-{job_id}-{queue}').")
        now = time.time()
        now_ms = int(now * 1000)
        due: list[str] = []
        later: str | None = None  # the first name not due yet (names sort by due time)
        for minute in minutes:
            start = int(minute)
            if later is not None and start * 1000 > now_ms:
                break  # a later minute: nothing in it is due before `later`
            past = start + 60 + DELAYED_GRACE < now
            seconds = self.store.children(layout.delayed_minute(minute), watch=watch)
            self._seen(seconds)
            if not seconds and past:
                self._delete_empty(layout.delayed_minute(minute))
                continue
            for second in sorted(seconds):
                path = layout.delayed_shard(minute, second)
                if not is_delayed_shard(second):
                    self._move_aside(path, kind="foreign_name",
                                     reason=f"{second!r} in delayed/{minute} is not a "
                                            "second of submission ('{epoch_second:010d}').")
                    continue
                jobs = self.store.children(path, watch=watch)
                self._seen(jobs)
                if not jobs and past:
                    self._delete_empty(path)
                for name in jobs:
                    if delayed_shards(name) != (minute, second):
                        parsed = parse_delayed_node(name)
                        self._move_aside(f"{path}/{name}",
                                         kind="misplaced_job" if parsed else "foreign_name",
                                         reason=f"{name!r} in delayed/{minute}/{second} is "
                                                "not the name of a delayed job of that "
                                                "shard." + (" Re-queueing the entry sends the "
                                                            "job back to its right place."
                                                            if parsed else ""),
                                         job_id=parsed[2] if parsed else None)
                    elif int(name[:13]) <= now_ms:
                        due.append(name)
                    elif later is None or name < later:
                        later = name
                if len(due) >= DELAYED_LOAD:
                    break
            if len(due) >= DELAYED_LOAD:
                later = None  # more are due: the watches of the moves bring us back
                break
        self.delayed = sorted(due)
        self._delayed_next_ms = int(later[:13]) if later else None

    def _delete_empty(self, path: str) -> None:
        """Delete an empty delayed shard or minute: NotEmpty (a job just landed) and NoNode
        (gone already) are fine; a failed fence means we no longer lead."""
        self._raise_if_fence(self.store.delete_empty(self.fence, path))

    def _migrate_delayed(self, names: list[str]) -> None:
        """Move delayed jobs written before sharding into their shards (fenced batches)."""
        for start in range(0, len(names), BATCH):
            batch = names[start:start + BATCH]
            failed = failures(self.store.move_unsharded_delayed(self.fence, batch))
            if failed:
                self._raise_if_fence(failed)
                logger.info("unsharded delayed jobs not moved reason=%r", failed[0])
                return
            logger.info("moved unsharded delayed jobs into shards count=%d", len(batch))

    def _defer(self, key: str, queue: str, full: bool, now: float) -> bool:
        """Put off re-listing `key` while the local view still has jobs to hand out.

        Our own assignment deletes fire these watches too: re-listing after every batch
        costs a list per batch; new arrivals wait RELIST_EVERY at most. The event is
        kept, and a timer brings us back.
        """
        if (not full and self.pending.get(queue)
                and now - self._listed_at.get(key, 0.0) < RELIST_EVERY):
            self._deferred.add(key)
            return True
        return False

    def _seen(self, names: list[str]) -> None:
        self.max_listed = max(self.max_listed, len(names))

    def _forget_queue(self, queue: str) -> None:
        for shard in self.loaded.get(queue, {}):
            self._born.pop(f"s:{queue}/{shard}", None)
            self._unwatch(f"s:{queue}/{shard}")
        self._unwatch(f"q:{queue}")
        self._listed_at.pop(f"q:{queue}", None)
        self.shards.pop(queue, None)
        self.loaded.pop(queue, None)
        self.pending.pop(queue, None)

    def _free_for(self, queue: str) -> int:
        return sum(w.free for w in self.workers.values() if w.free > 0 and w.serves(queue))

    def _load_shards(self, dirty: set[str]) -> None:
        """Keep the children of each queue's first shards, enough to fill free capacity.

        Never the whole backlog: shards past that are only names (one list per queue).
        Empty shards met on the way that are old enough to delete are noted
        (`_riders`, `_sweep_state`): `_assign` and `_sweep_shards` delete them.
        """
        full = "*" in dirty
        now = time.monotonic()
        self._sweep_at = None
        self._riders = []
        for queue, shards in self.shards.items():
            need = max(BATCH, self._free_for(queue))
            loaded = self.loaded.get(queue, {})
            kept: dict[str, list[str]] = {}
            count = 0
            changed = queue in self._stale
            for shard in shards:
                if count >= need:
                    break
                key = f"s:{queue}/{shard}"
                nodes = loaded.get(shard)
                if nodes is None or full or key in dirty:
                    if nodes is not None and self._defer(key, queue, full, now):
                        pass
                    else:
                        names, born = self.store.children_and_ctime(
                            self.layout.shard(queue, shard), watch=self._watch(key))
                        self._born[key] = born
                        self._seen(names)
                        # Under a backlog a shard holds thousands of names and is listed
                        # again every RELIST_EVERY: parse only those not seen valid in it
                        # before (parsing them all was 5 % of the leading worker's CPU
                        # draining 6,000 jobs, bench --profile).
                        known = set(nodes or ())
                        nodes = sorted(n for n in names if n in known or (
                            parse_job_node(n) and shard_of(n) == shard))
                        self._listed_at[key] = now
                        changed = True
                        foreign = set(names) - set(nodes) if len(nodes) < len(names) else ()
                        for name in foreign:
                            self._move_foreign(queue, shard, name)
                if not nodes:
                    state = self._sweep_state(shard, key)
                    if state:
                        self._riders.append((queue, shard, state == "due"))
                kept[shard] = nodes
                count += len(nodes)
            if changed or kept.keys() != loaded.keys():
                for shard in loaded.keys() - kept.keys():
                    self._forget_shard(f"s:{queue}/{shard}")
                self.loaded[queue] = kept
                self.pending[queue] = [n for nodes in kept.values() for n in nodes]
        self._stale.clear()

    def _forget_shard(self, key: str) -> None:
        self._listed_at.pop(key, None)
        self._born.pop(key, None)
        self._unwatch(key)

    def _move_foreign(self, queue: str, shard: str, name: str) -> None:
        """Move aside a name a shard should not hold. A job's name in another shard
        than its own: assigning it deletes the path its name gives, so its multi failed
        on every try, with the jobs planned beside it (a leader spinning on them)."""
        parsed = parse_job_node(name)
        if parsed is None:
            reason = (f"{name!r} in shard {queue}/{shard} is not a pending job's name "
                      "('{100-priority:03d}-{job_id}').")
        else:
            reason = (f"Pending job {name!r} was found in shard {queue}/{shard}; its name "
                      f"belongs in shard {shard_of(name)!r}. Re-queueing the entry sends "
                      "the job back to its right place.")
        # A job's node is the only place the job waits: "misplaced_job" entries are
        # held (deadletter.HOLD_KINDS), never expired while the job is unfinished.
        self._move_aside(self.layout.shard_child(queue, shard, name),
                         kind="misplaced_job" if parsed else "foreign_name",
                         reason=reason, job_id=parsed[1] if parsed else None)

    def _sweep_state(self, shard: str, key: str) -> str | None:
        """Whether an empty shard may be deleted: None (not yet), "ready" (with an
        assignment multi) or "due" (in a multi of its own if none goes out).

        Ready: its second is SHARD_GRACE past, and so is the znode's creation. A
        submitter that made the shard again (a late clock, a retried submit) sends its
        job right after; deleting the shard in between would send it round again, and a
        leader that sweeps each new shard at once could keep it going round. Due: the
        first multiple of SWEEP_ALIGN at least half of it later, so that the shards of
        the seconds in between go in one multi, and that a job coming meanwhile takes
        it along (on the next multiple itself, the shard of three seconds ago, ready
        then, went alone just before the job of that second came).
        """
        parsed = parse_shard(shard)
        ready_at = max(parsed[1] + SHARD_GRACE + 1 if parsed else 0,
                       self._born.get(key, 0.0) + SHARD_GRACE)
        due_at = (math.ceil((ready_at + SWEEP_ALIGN / 2) / SWEEP_ALIGN) * SWEEP_ALIGN
                  if SWEEP_ALIGN else ready_at)
        now = time.time()
        if now >= due_at:
            return "due"
        self._sweep_at = min(self._sweep_at or due_at, due_at)
        return "ready" if now >= ready_at else None

    def _sweep_shards(self) -> None:
        """Delete the due empty shards that no assignment multi took along, together."""
        due = [(queue, shard) for queue, shard, is_due in self._riders if is_due]
        self._riders = []
        if not due:
            return
        try:
            gone = self.store.delete_shards(self.fence, due)
        except NoNodeError as exc:
            raise LeadershipLost("fence check failed deleting empty shards") from exc
        self._shards_gone(gone)

    def _shards_gone(self, gone) -> None:
        """Forget shards deleted (by us or someone else): (queue, shard) pairs. A job
        landing in one later makes it again, and the queue's watch shows it."""
        by_queue: dict[str, set[str]] = {}
        for queue, shard in gone:
            by_queue.setdefault(queue, set()).add(shard)
            self.loaded.get(queue, {}).pop(shard, None)
            self._forget_shard(f"s:{queue}/{shard}")
        for queue, shards in by_queue.items():
            if queue in self.shards:
                self.shards[queue][:] = [s for s in self.shards[queue] if s not in shards]
            logger.debug("empty shards deleted queue=%s count=%d", queue, len(shards))

    def _until_sweep(self) -> float:
        if self._sweep_at is None:
            return RECONCILE_EVERY
        return max(0.0, self._sweep_at - time.time()) + 0.001

    def _migrate(self, queue: str, nodes: list[str]) -> None:
        """Move pending jobs written before sharding into their shards (fenced batches).

        Runs whenever a queue's listing shows such a job: on election for old trees,
        and for jobs an older submitter writes during a rolling upgrade.
        """
        for start in range(0, len(nodes), BATCH):
            batch = nodes[start:start + BATCH]
            results = self.store.move_unsharded(self.fence, queue, batch)
            failed = failures(results)
            if failed:
                self._raise_if_fence(failed)
                logger.info("unsharded jobs not moved queue=%s reason=%r", queue, failed[0])
                break
            logger.info("moved unsharded jobs into shards queue=%s count=%d", queue,
                        len(batch))
        self._listed_at.pop(f"q:{queue}", None)
        self.mark(f"q:{queue}")

    def _until_next_due(self) -> float:
        if self.delayed:
            return 0.0  # loaded names are due: _promote_due moves them
        if self._delayed_next_ms is None:
            return RECONCILE_EVERY
        return max(0.0, self._delayed_next_ms / 1000 - time.time()) + 0.001

    def _until_next_tick(self) -> float:
        if not self._next_ticks:
            return RECONCILE_EVERY
        return max(0.0, min(self._next_ticks.values()) - time.time()) + 0.001

    def _run_schedules(self) -> None:
        """Submit one job for each schedule whose tick has come (missed ticks coalesce)."""
        offset = time.time() - time.monotonic()
        if offset < self._clock_offset - SCHEDULE_SKEW:
            # The wall clock was set back (NTP stepping a clock that ran fast): the
            # next ticks computed before are that far in the future now, and every
            # schedule would skip its ticks until then. Read their states again.
            logger.warning("the clock went back %.0f s; reading every schedule again",
                           self._clock_offset - offset)
            self._next_ticks.clear()
        self._clock_offset = offset
        now = records.now()
        for schedule in self.store.options.schedules:
            next_at = self._next_ticks.get(schedule.name)
            if next_at is not None and time.time() < next_at:
                continue
            try:
                done = self._run_schedule(schedule, now)
            except TRANSIENT:
                raise
            except LeadershipLost:
                raise
            except Exception as exc:  # a broken schedule must not stop the leader
                error = f"{type(exc).__name__}: {exc}"
                if self._broken_schedules.get(schedule.name) != error:
                    logger.error("schedule failed name=%s error=%r", schedule.name, exc)
                    self._note_schedule_error(schedule, error)
                self._broken_schedules[schedule.name] = error
                done = False
            try:
                next_at = schedule.next_tick(now).timestamp()
            except Exception:  # raised above already, and noted: it must not end the term
                next_at = math.inf
            if done:
                self._broken_schedules.pop(schedule.name, None)
                self._next_ticks[schedule.name] = next_at
            else:
                # Not recorded: again soon. Waiting for the next tick would fold this
                # one into it (a daily schedule would lose a day).
                self._next_ticks[schedule.name] = min(time.time() + SCHEDULE_RETRY, next_at)

    def _run_schedule(self, schedule, now) -> bool:
        """Submit the schedule's due tick; return whether its state is up to date."""
        from datetime import timedelta

        path = self.layout.schedule(schedule.name)
        if schedule.name in self._unanswered_ticks:
            # Reconnected to a member that may not have applied our lost-answer multi
            # yet: catch up first, or the tick would read as not recorded and its job's
            # NodeExists as an earlier leader's (never announced).
            self.client.sync(path)
        try:
            raw, stat = self.client.get(path)
        except NoNodeError:
            raw, stat = None, None
        try:
            recorded = records.loads(raw, path=path) if stat else {}
            last = schedule_state.last_tick(recorded, path)
        except CorruptRecord as exc:
            # Unreadable (written by hand?): waiting for somebody to fix it would stop the
            # schedule for good. Its bytes go to the dead letters and the schedule starts
            # again from now, as a new one does (a pause it may have held is lost with it).
            self._move_aside(path, raw=raw, version=stat.version, kind="corrupt_schedule",
                             reason=f"the state of schedule {schedule.name!r} does not "
                                    f"decode ({exc}); the schedule starts again from now")
            self._known_ticks.pop(schedule.name, None)
            return False  # the next pass (SCHEDULE_RETRY) makes its state anew
        version = stat.version if stat else None
        if recorded.get("paused"):
            return True  # schedule_state.resume() records the tick it resumes from
        if stat is None and schedule.name in self._known_ticks:
            # Its znode deleted by hand after this term saw a tick recorded: go on from
            # that tick. Taken for a new schedule, it started again from now, and the
            # tick due meanwhile never ran. (A tick that did run since, by another
            # leader, is not run again: its job id is the tick's, NodeExists below.)
            last = self._known_ticks[schedule.name]
            logger.warning("schedule state missing name=%s; made again from its last tick "
                           "%s", schedule.name, last.isoformat())
        latest = schedule.latest_tick(now)
        state = records.dumps({"last_tick": latest.isoformat()})
        if last is None:
            # A new schedule starts from now: record the current tick, run the next one.
            # (A znode without last_tick: paused and resumed before any leader saw it.)
            return self._set_schedule(path, state, version, schedule.name, latest)
        if last > now + timedelta(seconds=SCHEDULE_SKEW):
            # Recorded by a leader whose clock ran ahead: waiting for it would skip every
            # tick until then. Start again from now; a tick that did run is not run again
            # (its job id is the tick's: NodeExists below).
            logger.warning("schedule state is in the future name=%s last_tick=%s now=%s "
                           "(clocks of the leaders differ?); starting again from now",
                           schedule.name, last.isoformat(), now.isoformat())
            return self._set_schedule(path, state, version, schedule.name, latest)
        self._known_ticks[schedule.name] = last
        # A tick in flight at the last pass, now recorded: its multi landed.
        self._announce_landed(schedule.name, last)
        if latest <= last:
            if stat is None:  # made again, as it was
                return self._set_schedule(path, records.dumps({"last_tick": last.isoformat()}),
                                          None, schedule.name, last)
            return True
        record, result = self._tick_record(schedule, latest)
        # Until answered: a multi that lands with its answer lost (ConnectionLoss) is
        # found recorded at the next pass, and announced there (_announce_landed).
        self._unanswered_ticks[schedule.name] = (latest, result)
        results = self.store.submit_tick(self.fence, record, path, state, version)
        self._unanswered_ticks.pop(schedule.name, None)
        failed = failures(results)
        if not failed:
            logger.info("schedule tick name=%s tick=%s job=%s", schedule.name,
                        latest.isoformat(), record.id)
            _announce(result)
            self._known_ticks[schedule.name] = latest
            return True
        self._raise_if_fence(failed)
        index, error = failed[0]
        if index == 1 and isinstance(error, NodeExistsError):
            # Already submitted by an earlier leader: advance the schedule only.
            return self._set_schedule(path, state, version, schedule.name, latest)
        if isinstance(error, BadVersionError):
            # Paused or resumed since it was read: read it again soon (a paused
            # schedule gets no tick: this multi made nothing).
            return False
        if index == 3 and version is None and isinstance(error, NoNodeError):
            # Its state made again (above), under a schedules/ deleted by hand too.
            self._make_schedules_again()
            return False
        logger.warning("schedule tick refused name=%s error=%r", schedule.name, error)
        self._note_schedule_error(schedule, f"ZooKeeper refused the tick's job: {error!r}")
        return False

    def _announce_landed(self, name: str, last) -> None:
        """Send task_enqueued for a tick whose multi's answer was lost, once its state
        shows that tick recorded and its job is there (it landed)."""
        unanswered = self._unanswered_ticks.pop(name, None)
        if unanswered is None or unanswered[0] != last:
            return
        result = unanswered[1]
        if self.store.read_status(result.id) is not None:
            logger.info("schedule tick name=%s tick=%s job=%s (its answer was lost; it "
                        "landed)", name, last.isoformat(), result.id)
            _announce(result)

    def _set_schedule(self, path: str, state: bytes, version: int | None, name: str,
                      tick) -> bool:
        """Write a schedule's state (its last tick, `tick`) over the version read; False
        (read it again soon) when it changed or appeared meanwhile: paused, resumed, or
        another leader."""
        try:
            if version is None:
                self.client.create(path, state)
            else:
                self.client.set(path, state, version=version)
        except NoNodeError:
            if version is None:
                self._make_schedules_again()
            return False
        except (BadVersionError, NodeExistsError):
            return False
        self._known_ticks[name] = tick
        return True

    def _make_schedules_again(self) -> None:
        """A create's parent, schedules/, is gone (deleted by hand): nothing makes it
        again but this (the skeleton is made once per process), and every schedule
        stopped for good, in silence."""
        logger.warning("the schedules znode %s is missing; making it again",
                       self.layout.schedules)
        self.store.retry(self.client.ensure_path, self.layout.schedules)

    def _note_schedule_error(self, schedule, error: str) -> None:
        """Keep why a schedule's tick failed in its znode, next to its last tick, for
        `manage.py zktasks schedules` and the dashboard (the log says it once).

        Best effort: a versioned set that gives up on any conflict or trouble (the next
        failure notes it again); the next recorded tick writes the state without it.
        The znode is not created here: the leader makes it on first seeing the schedule,
        and a state without last_tick would read as a new schedule.
        """
        path = self.layout.schedule(schedule.name)
        try:
            raw, stat = self.client.get(path)
            state = records.loads(raw, path=path)
            if state.get("error") == error[:SCHEDULE_ERROR_CHARS]:
                return
            state.update(error=error[:SCHEDULE_ERROR_CHARS], error_at=records.now().isoformat())
            self.client.set(path, records.dumps(state), version=stat.version)
        except Exception as exc:  # best effort; never what ends the leader's term
            logger.debug("schedule error not noted name=%s: %r", schedule.name, exc)

    def _tick_record(self, schedule, tick):
        from django.tasks import task_backends

        backend = task_backends[self.store.options.alias]
        return backend.schedule_job(schedule, job_id=schedule.job_id(tick),
                                    tick=tick.isoformat())

    def _read_worker(self, view: WorkerView) -> None:
        path = self.layout.worker(view.worker_id)
        try:
            watch = self._watch(f"w:{view.worker_id}")
            raw, _ = self.store.retry(self.client.get, path, watch=watch)
            # Parsed here too: a field of the wrong type ("concurrency": null) raised
            # past this guard and ended the term, and every next leader's at its first
            # read of the same znode, so nothing was assigned anywhere.
            fields = _worker_fields(records.loads(raw, path=path))
        except NoNodeError:
            view.draining = True  # gone; the children watch will drop it
            return
        except Exception as exc:  # garbage in a worker znode: never crash the leader
            logger.error("unreadable worker znode path=%s error=%s; it gets no jobs",
                         path, exc)
            view.draining = True
            return
        view.queues, view.concurrency, view.prefetch, view.draining = fields

    # -- duties --------------------------------------------------------------------------

    def _reassign_orphans(self) -> None:
        """Hand back the jobs of workers whose znode is gone (rule 6)."""
        owners = self.store.children(self.layout.assignments, watch=None)
        for owner in owners:
            # A worker registering right now makes its assignments parent and its worker
            # znode in one multi, which can fall between our two reads: ask again.
            if owner in self.workers or self.client.exists(self.layout.worker(owner)):
                continue
            parent = self.layout.worker_assignments(owner)
            jobs = self.store.children(parent)
            if jobs:
                logger.warning("worker vanished worker=%s jobs=%d: handing its jobs back",
                               owner, len(jobs))
            held = self._read_held(owner, jobs)
            oldest = _oldest(held)
            # The oldest last: should this term end half-way, the next leader still
            # finds it the oldest of what is left, and counts it as this one would have.
            for job_id in sorted(held, key=lambda j: j == oldest):
                self._requeue(owner, job_id, held[job_id], held_alone=job_id == oldest)
            try:
                self.client.delete(parent)
            except (NoNodeError, NotEmptyError):
                pass

    def _read_held(self, owner: str, jobs: list[str]) -> dict[str, tuple]:
        """{job id: (bytes, stat)} of a vanished worker's assignments still there."""
        held = {}
        for job_id in jobs:
            try:
                held[job_id] = self.client.get(self.layout.assignment(owner, job_id))
            except NoNodeError:
                pass
        return held

    def _requeue(self, owner: str, job_id: str, got: tuple, *, held_alone: bool) -> None:
        """Hand back one job of a vanished worker; `got`: its assignment's (bytes,
        stat); `held_alone`: it is the oldest of them (Store.requeue)."""
        path = self.layout.assignment(owner, job_id)
        raw, stat = got
        try:
            info = records.loads(raw, path=path)
            queue, node = str(info["queue"]), str(info["node"])
            # Checked here, not met as a ValueError building the path (which ended the
            # term, and every next leader's at the same reconcile: no one assigned) or
            # as a multi refused on every try (a queue with a '/').
            if not QUEUE_RE.match(queue):
                raise CorruptRecord(f"{queue!r} is not a queue name")
            parsed = parse_job_node(node)
            if parsed is None:
                raise CorruptRecord(f"{node!r} is not a pending job's name")
            if parsed[1] != job_id:
                raise CorruptRecord(f"{node!r} names another job than {job_id!r}")
        except (CorruptRecord, KeyError) as exc:
            self._move_aside(path, raw=raw, version=stat.version, job_id=job_id,
                             kind="unreadable_assignment",
                             reason=f"Assignment of vanished worker {owner!r}: {exc}")
            return
        try:
            status = self.store.read_status(job_id)
        except CorruptRecord as exc:
            # Handed back as it is: the worker that gets it fails it and keeps its bytes.
            logger.error("unreadable status job=%s error=%s", job_id, exc)
            status = None
        else:
            if status is None:
                self._move_aside(path, raw=raw, version=stat.version, job_id=job_id,
                                 kind="no_status",
                                 reason=f"Job {job_id} of vanished worker {owner!r} has no "
                                        "status record.")
                return
        results, final = self.store.requeue(self.fence, owner, job_id, queue, node, status,
                                            held_alone=held_alone)
        failed = failures(results)
        if failed:
            self._raise_if_fence(failed)
            logger.info("requeue skipped job=%s from=%s reason=%s", job_id, owner, failed)
            if isinstance(failed[0][1], NotEmptyError):
                self._clear_under(path)
            self.mark("*")
            return
        if final:
            logger.error("job failed: its workers kept vanishing job=%s from=%s losses=%d "
                         "(retry it once the cause is fixed)", job_id, owner,
                         MAX_WORKER_LOSSES)
            if self.on_failed:
                self.on_failed(final)
        else:
            logger.warning("job handed back job=%s from=%s", job_id, owner)
        self.mark(f"q:{queue}")

    def _move_aside(self, path: str, *, kind: str, reason: str, job_id: str | None = None,
                    raw: bytes | None = None, version: int | None = None) -> None:
        """Move garbage to the dead letters in a fenced multi, logging it once.

        Once moved, the name is gone from the listing, so it is neither re-read nor logged
        again. One that cannot be moved (it has children) is logged once and then only
        skipped; one changed or removed meanwhile is simply looked at again next time.
        """
        if path in self._stuck_garbage:
            return
        if raw is None:
            try:
                raw, stat = self.store.retry(self.client.get, path)
            except NoNodeError:
                return
            version = stat.version
        entry, failed = deadletter.move_aside(
            self.store, path, raw, version, kind=kind, reason=reason, job_id=job_id,
            by=f"leader {self.identity}", fence=self.fence)
        if not failed:
            logger.error("garbage moved aside path=%s kind=%s entry=%s reason=%s", path, kind,
                         entry, reason)
            return
        self._raise_if_fence(failed)
        error = failed[0][1]
        if isinstance(error, NotEmptyError):
            if len(self._stuck_garbage) > 10_000:
                self._stuck_garbage.clear()
            self._stuck_garbage.add(path)
            logger.error("garbage not moved aside path=%s: it has children; delete it by "
                         "hand (it is skipped meanwhile)", path)
        else:
            logger.info("garbage changed before it was moved aside path=%s error=%r", path,
                        error)

    def _clear_under(self, path: str) -> None:
        """The delete of `path` in a multi was refused (NotEmpty): what is under it is
        not zktasks' (a hand-made znode), so it goes to the dead letters and the next try
        deletes `path`. Without this the leader sent the same refused multi on every
        pass (hundreds a second), and a pending job that sorted first sank every batch
        with it: nothing was assigned (found by a leader audit)."""
        try:
            children = self.store.retry(self.client.get_children, path)
        except NoNodeError:
            return
        for child in children:
            self._move_aside(f"{path}/{child}", kind="foreign_name",
                             reason=f"a znode under {path}, which the leader deletes as "
                                    "it moves the job on; zktasks makes none there")

    def _promote_due(self) -> None:
        """Move delayed jobs whose time has come to their queue, in fenced batches."""
        now_ms = int(time.time() * 1000)
        due = []
        for name in self.delayed:
            due_ms, priority, job_id, queue = parse_delayed_node(name)
            if due_ms > now_ms:
                break
            due.append((name, queue, job_node_name(priority, job_id)))
        for start in range(0, len(due), BATCH):
            batch = due[start:start + BATCH]
            results = self.store.promote(self.fence, batch)
            failed = failures(results)
            if failed:
                self._raise_if_fence(failed)
                # A queue parent is missing or the entry vanished (cancelled): re-read.
                name, queue, _ = batch[(failed[0][0] - 1) // 2]
                logger.warning("promotion refused job=%s error=%r", name, failed[0][1])
                if isinstance(failed[0][1], NotEmptyError):
                    self._clear_under(self.layout.delayed_job(name))
                self.mark("delayed")
                self.mark("queues")
                return
            done = {name for name, _, _ in batch}
            self.delayed = [n for n in self.delayed if n not in done]
            for _name, queue, node in batch:
                logger.info("job due job=%s queue=%s", node.split("-", 1)[1], queue)
                # Its shard's watch (or the queue's, for a new shard) fires too; marking
                # now spares waiting for it. A deferred re-list would hide the new job.
                self._listed_at.pop(f"s:{queue}/{shard_of(node)}", None)
                self.mark(f"s:{queue}/{shard_of(node)}")
                self._listed_at.pop(f"q:{queue}", None)
                self.mark(f"q:{queue}")

    def _expire_results(self, listed: bool) -> None:
        """Delete finished records whose bucket's TTL has passed (kazoo has no TTL nodes,
        so this is the leader's job).

        Each bucket's expiry is in its name (its start, plus the global RESULT_TTL or
        the per-task TTL it carries), so one listing of finished/ tells what is due now
        and when the next bucket is: the leader sleeps until then. The listing sets a
        watch, so a new bucket (say of a job with a one-second TTL) is seen at once; a
        sweep runs on that event, when the next expiry comes, and every EXPIRE_EVERY.
        """
        now = time.time()
        if not (listed or now >= self._next_expiry
                or time.monotonic() - self._last_expiry >= EXPIRE_EVERY):
            return
        self._last_expiry = time.monotonic()
        try:
            # Capped: expired buckets left over make the next expiry now, so the leader
            # comes back after its next tick's assignments.
            deleted, next_ms, self._expiry_cursor = self.store.expire_finished(
                fence=self.fence, now_ms=int(now * 1000),
                default_ttl=self.store.options.result_ttl, watch=self._finished_watch,
                max_buckets=EXPIRE_BUCKETS, max_entries=EXPIRE_ENTRIES,
                after=self._expiry_cursor)
        except NoNodeError as exc:
            raise LeadershipLost("fence check failed during expiry") from exc
        self._next_expiry = next_ms / 1000 if next_ms is not None else float("inf")
        if deleted:
            logger.info("expired results count=%d", deleted)
        if time.monotonic() - self._last_cancel_sweep >= EXPIRE_EVERY:
            self._last_cancel_sweep = time.monotonic()
            self._sweep_cancel_requests()
            self._expire_dead_letters(now)

    def _expire_dead_letters(self, now: float) -> None:
        """Bound the dead-letter place: DEAD_LETTER_TTL and DEAD_LETTER_LIMIT (see
        deadletter.expire), at most every EXPIRE_EVERY, listing names only."""
        options = self.store.options
        try:
            expired, over, held = deadletter.expire(
                self.store, fence=self.fence, now_ms=int(now * 1000),
                ttl=options.dead_letter_ttl, limit=options.dead_letter_limit)
        except NoNodeError as exc:
            raise LeadershipLost("fence check failed during dead-letter expiry") from exc
        if expired:
            logger.info("expired dead letters count=%d ttl=%gs", expired,
                        options.dead_letter_ttl)
        if over:
            logger.warning(
                "deleted the %d oldest dead letters: more than DEAD_LETTER_LIMIT=%d. "
                "Something keeps writing znodes zktasks cannot use (see the newest on "
                "the dashboard's dead-letter page); raise the limit to keep more.",
                over, options.dead_letter_limit)
        if held:
            logger.info("kept %d dead letters past DEAD_LETTER_TTL or DEAD_LETTER_LIMIT: "
                        "each is where an unfinished job waits; re-queue or discard them",
                        held)

    def _until_next_expiry(self) -> float:
        return max(0.0, self._next_expiry - time.time()) + 0.001

    def _sweep_cancel_requests(self) -> None:
        """Delete cancel requests whose job has finished or is gone (answered).

        Only a record read as finished, or read as missing (NoNode), answers a request:
        a read that failed tells nothing, and the job may still be running, so its
        request is kept for the next sweep."""
        for job_id in self.store.children(self.layout.cancel):
            try:
                found = self.store.read_status(job_id)
            except (*TRANSIENT, ZooKeeperUnavailableError) as exc:
                # The next reads would wait as long for nothing: end the sweep here.
                logger.debug("cancel sweep stopped job=%s error=%r", job_id, exc)
                return
            except Exception as exc:
                logger.debug("cancel request kept job=%s error=%r", job_id, exc)
                continue
            if found is None or found.record.is_finished:
                try:
                    self.client.delete(self.layout.cancel_request(job_id))
                except NoNodeError:
                    pass

    def _take_up_buckets(self) -> None:
        """Start the term with the buckets the last leader left (ratelimit.py), not full
        ones: a rolling deploy changes leader once per restarted worker."""
        if not self.buckets.limits:
            return
        states = self.store.rate_states(sorted(self.buckets.limits))
        now, wall = time.monotonic(), time.time()
        for queue, data in states.items():
            if data is None:
                continue  # never written: full, as a first term starts
            try:
                state = records.loads(data, path=self.layout.rate_state(queue))
                at = state.get("at")
                ok = (isinstance(at, int | float) and not isinstance(at, bool)
                      and self.buckets.restore(queue, state.get("tokens"), wall - at, now))
            except (CorruptRecord, OverflowError):
                ok = False
            if ok:
                logger.info("rate limit queue=%s taken up: %.2f of %d tokens", queue,
                            self.buckets.state(queue, now)["tokens"],
                            self.buckets.limits[queue].burst)
            else:
                logger.warning("rate limit queue=%s: the bucket kept at %s is unreadable; "
                               "starting with a full one", queue,
                               self.layout.rate_state(queue))

    def _publish_rate_limits(self) -> None:
        """Say which limits this term keeps (tree.py, `ratelimits`): the dashboard and
        `zktasks status` show them rather than their own process's RATE_LIMITS, which a
        deploy that changes a limit makes differ from the leader's for a while. Written
        with no limits too, so that the last leader's stop showing. For display only: a
        write refused for another reason than the fence (an ACL set by hand) is logged
        and the term goes on (the pages then show their own settings)."""
        data = records.dumps({
            "limits": {queue: limit.text for queue, limit in self.buckets.limits.items()},
            "node": self.fence.rpartition("/")[2], "at": records.now().isoformat()})
        failed = self.store.publish_rate_limits(self.fence, data)
        self._raise_if_fence(failed)
        if failed:
            logger.warning("could not write the rate limits this leader keeps to %s: %r; "
                           "the dashboard and `zktasks status` show their own settings",
                           self.layout.ratelimits, failed[0][1])

    def _rate_states(self, batch, now: float) -> dict[str, bytes]:
        """The buckets of the limited queues in `batch`, to write with it."""
        wall = time.time()
        return {queue: records.dumps({**self.buckets.state(queue, now), "at": wall})
                for queue in {q for q, _, _ in batch if q in self.buckets.limits}}

    def _assign(self) -> None:
        plan = self.plan()
        # Empty shards old enough to delete go in the first multi, at no transaction of
        # their own (the rest, if due, go alone: _sweep_shards).
        rides = [(q, s) for q, s, _ in self._riders[:RIDE_MAX]] if plan else []
        del self._riders[:len(rides)]
        for start in range(0, len(plan), BATCH):
            batch = plan[start:start + BATCH]
            rates = self._rate_states(batch, time.monotonic())
            results = self.store.assign(self.fence, batch, rates, sweep=rides)
            failed = failures(results)
            first_ride = 1 + 2 * len(batch) + len(rates)
            if failed and rides and failed[0][0] >= first_ride:
                # A job just landed in that shard (NotEmpty), or it is gone (NoNode):
                # the batch again without the shards, which come back next tick.
                index, error = failed[0]
                queue, shard = rides[index - first_ride]
                logger.debug("empty shard kept queue=%s shard=%s error=%r; assigning "
                             "without it", queue, shard, error)
                if isinstance(error, NoNodeError):
                    self._shards_gone([(queue, shard)])
                else:
                    self._listed_at.pop(f"s:{queue}/{shard}", None)
                    self.mark(f"s:{queue}/{shard}")
                results = self.store.assign(self.fence, batch, rates)
                failed = failures(results)
            elif rides and not failed:
                self._shards_gone(rides)
            rides = []
            if failed:
                self._raise_if_fence(failed)
                # Refused, the multi assigned none of its batch, and the batches after it
                # are not sent: their tokens go back (an unknown outcome, a connection
                # lost, keeps them spent: the limit errs on the slow side).
                self._give_back(plan[start:])
                self._explain_refusal(batch, failed)
                for queue, node, worker_id in plan[start + BATCH:]:  # planned, never sent
                    self.workers.get(worker_id, WorkerView(worker_id)).assigned.discard(
                        node.split("-", 1)[1])
                    self._stale.add(queue)  # rebuild its view from the loaded shards
                return
            assigned: dict[tuple[str, str], list[str]] = {}
            for queue, node, worker_id in batch:
                assigned.setdefault((worker_id, queue), []).append(node.split("-", 1)[1])
                nodes = self.loaded.get(queue, {}).get(shard_of(node))
                if nodes and nodes[0] == node:
                    del nodes[0]
                elif nodes and node in nodes:
                    nodes.remove(node)
            # One line per worker and queue, not per job: under a backlog a batch holds up
            # to BATCH jobs, and a log record per job was a few percent of a worker's CPU.
            for (worker_id, queue), ids in assigned.items():
                logger.info("assigned count=%d queue=%s worker=%s jobs=%s", len(ids), queue,
                            worker_id, ",".join(ids))
            self.assignments_total += len(batch)

    def _note_unserved(self) -> None:
        """Warn once when jobs wait in a queue that no live worker serves, and say when
        one does again. Without it they waited in silence: a worker started without
        --queues serves QUEUES, or only "default" when QUEUES is [] (any name accepted).
        A few queues times a few workers: cheap enough for every tick."""
        unserved = {queue for queue, nodes in self.pending.items()
                    if nodes and not any(w.serves(queue) for w in self.workers.values())}
        for queue in sorted(unserved - self._unserved):
            logger.warning("jobs wait in queue=%s and no live worker serves it; start one "
                           "with: manage.py runworker --queues %s", queue, queue)
        for queue in sorted(self._unserved - unserved):
            logger.info("queue=%s is served again, or has no jobs waiting", queue)
        self._unserved = unserved

    def _give_back(self, moves) -> None:
        now = time.monotonic()
        for queue, count in Counter(queue for queue, _, _ in moves).items():
            self.buckets.give_back(queue, count, now)

    def _explain_refusal(self, batch, failed) -> None:
        """Learn from a refused batch so the next plan does not repeat it."""
        index, error = failed[0]
        if index > 2 * len(batch):
            # A bucket's znode (written after the batch's ops) is gone: made again.
            logger.warning("rate limit state refused error=%r; making its znodes again",
                           error)
            self.store.rate_states(sorted(self.buckets.limits))
            self._undo_view(batch)
            return
        queue, node, worker_id = batch[(index - 1) // 2]
        creating = (index - 1) % 2 == 0
        if not creating and isinstance(error, NotEmptyError):
            self._clear_under(self.layout.job(queue, node))
        if creating and isinstance(error, NoNodeError) and worker_id in self.workers:
            # The worker's assignments parent is missing: it is leaving or broken.
            logger.error("worker has no assignments znode worker=%s; not assigning to it",
                         worker_id)
            self.workers[worker_id].draining = True
        else:
            # Typically the job vanished (cancelled) or a worker left: re-read, replan.
            logger.debug("assignment batch refused job=%s error=%r", node, error)
            self.mark(f"a:{worker_id}")
        self._undo_view(batch)

    def _undo_view(self, batch) -> None:
        """Undo our optimistic view of a refused batch; the re-read gives the truth."""
        for q, n, w in batch:
            self.workers.get(w, WorkerView(w)).assigned.discard(n.split("-", 1)[1])
            key = f"s:{q}/{shard_of(n)}"
            self._listed_at.pop(key, None)  # our view of that shard is wrong: re-list it
            self.mark(key)
            self.mark(f"q:{q}")

    def _raise_if_fence(self, failed) -> None:
        if failed and failed[0][0] == 0 and isinstance(failed[0][1], NoNodeError):
            raise LeadershipLost("fence check failed")

    def plan(self, now: float | None = None) -> list[tuple[str, str, str]]:
        """Decide (queue, job_node, worker) moves: highest priority, then oldest, first;
        each to the serving worker with the most idle runners, then the most free slots.
        Updates the local view.

        The per-queue lists are already sorted: a lazy merge stops as soon as the free
        slots are spent, so a plan costs what it assigns, not the size of the backlog.

        A queue with a rate limit (ratelimit.py) hands out no more jobs than its bucket
        holds, and only to a runner with nothing assigned, so a job starts when it is
        handed out: prefetched behind other jobs, several would start together once
        runners free up, over the limit. While such a job has a token and waits for a
        runner, the workers that serve its queue get none of the jobs after it in this
        plan, so that one frees up: without that hold, a backlog of another queue would
        keep their runners full for good.
        """
        eligible = [w for w in self.workers.values() if w.wants_work]
        self._throttled = set()
        if not eligible:
            return []
        now = time.monotonic() if now is None else now
        queues = [q for q, nodes in self.pending.items() if nodes]
        allowance = {q: n for q in queues
                     if (n := self.buckets.allowance(q, now)) is not None}
        streams = [zip(self.pending[q], itertools.repeat(q)) for q in queues]
        moves = []
        taken: dict[str, int] = {}
        blocked: set[str] = set()  # no eligible worker with a free slot serves it
        held: set[str] = set()  # workers kept free for a rate-limited job
        for node, queue in heapq.merge(*streams):
            if queue in blocked:
                continue
            limited = queue in allowance
            if limited and allowance[queue] <= 0:
                workers = []
                self._throttled.add(queue)
            elif limited:
                serving = [w for w in eligible if w.serves(queue) and w.worker_id not in held]
                workers = [w for w in serving if w.idle > 0]
                if not workers:
                    held.update(w.worker_id for w in serving)
            else:
                workers = [w for w in eligible
                           if w.free > 0 and w.serves(queue) and w.worker_id not in held]
            if not workers:
                blocked.add(queue)
                if len(blocked) == len(queues) or not any(
                        w.free > 0 and w.worker_id not in held for w in eligible):
                    break
                continue
            # Idle runners first: prefetch slots count as free too, and a worker whose
            # prefetch grew (16 for short jobs) would otherwise queue a job behind a
            # long one while another worker sits idle.
            target = max(workers, key=lambda w: (w.idle, w.free, w.worker_id))
            target.assigned.add(node.split("-", 1)[1])
            taken[queue] = taken.get(queue, 0) + 1
            if limited:
                allowance[queue] -= 1
            moves.append((queue, node, target.worker_id))
        # Within a queue the moves are a prefix of its sorted list: once no worker can
        # take a job of that queue, none takes a later one in this plan.
        for queue, count in taken.items():
            del self.pending[queue][:count]
            # Given back if the multi is refused (_assign); kept spent if its outcome is
            # unknown: the limit errs on the slow side.
            self.buckets.take(queue, count, now)
        return moves

    def _until_token(self, now: float | None = None) -> float:
        """Seconds until a throttled queue may hand out its next job."""
        now = time.monotonic() if now is None else now
        return min((self.buckets.wait(q, now, want=len(self.pending[q]))
                    for q in self._throttled if self.pending.get(q)), default=math.inf)
