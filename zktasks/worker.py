"""The worker: register, take assignments, run them, record outcomes; knows no argparse.

One main thread reads the worker's own assignments when its watch fires (rule 7: a
worker watches only its own parent; a persistent recursive watch where ZooKeeper has
them, which names each change, so that only new jobs are read: see _read_assignments)
and queues them; runner threads each take one (or
a few jobs shorter than a round trip, see `MAX_STARTS`), record RUNNING (fenced by the
assignment znode), hand it to the executor, then record the outcome and delete the
assignment in one multi. There are twice as many runners as
execution slots (`concurrency`): for short jobs, the next one's RUNNING write is in
flight while a job runs, so a slot does not idle for a ZooKeeper round trip (see
`LOOKAHEAD`). Every worker also contends for leadership (leader.py) unless told not to.

Connection states (rule 3): SUSPENDED starts nothing new; on reconnection with the same
session work goes on; on LOST every ephemeral is gone, so the worker registers again
under a new identity. Jobs still running under the old identity finish, but their
outcome is written only if their old assignment still exists (never over a newer attempt).
"""

import collections
import heapq
import json
import logging
import math
import os
import queue
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.tasks import TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from kazoo.exceptions import ConnectionLoss, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType, KazooState
from kazoo.recipe.watchers import ChildrenWatch

from . import deadletter, envelope, executor, records, serialization
from .client import new_client, start
from .committer import Commit, Committer
from .exceptions import (
    CorruptRecord,
    PayloadTooLarge,
    PayloadVerificationError,
    ZooKeeperUnavailableError,
)
from .executor import BATCH_MAX, TAKEN_BACK, Execution, Outcome, ProcessRunner, make_runner
from .handler import inline_watch
from .leader import Leader
from .prefetch import Prefetch
from .records import ErrorRecord, StatusRecord
from .store import TRANSIENT, Store, Versioned, failures, mark_draining

logger = logging.getLogger(__name__)


_STOP = object()

# Runner threads per execution slot. A runner records RUNNING (one ZooKeeper round trip,
# about a millisecond with fsync) before its job may execute; with one runner per slot
# the slot idles for that round trip on every job, which capped a 2-slot worker at about
# 500 no-op jobs/s and stretched 10 ms jobs to 12. The extra runners take a job only
# while recent jobs ran for at most LOOKAHEAD_MAX_S: then one runner's write is in
# flight while another's job runs, and a job shown RUNNING while it waits for a slot
# waits about that long. Long jobs keep the exact behaviour (RUNNING means executing).
# Should the worker die, a job waiting for a slot is handed back like the job running
# beside it (WorkerLost), as any job started in that worker would be.
LOOKAHEAD = 2
LOOKAHEAD_MAX_S = 0.05
# A runner that finds more ready jobs than idle runners takes several at once while jobs
# are shorter than a round trip, and hands all their starts to the committer in one go:
# one wake-up and one wait instead of one per job. With task processes the batch then goes
# to one of them in one message, which reports each outcome as it ends (run_many): one
# wake-up of that process per batch, not per job. The batch is cut so that its jobs add
# up to about BATCH_SPAN_S: a job waits RUNNING behind the others of its batch about that
# long at most. Longer jobs go one by one (batched, 10 ms jobs lost throughput to runners
# holding jobs while others idled). 16 jobs and 4 ms rather than 8 and 2 ms: with two task
# processes per worker, backlog drains of no-op jobs went from 1,172 to 1,485 jobs/s
# (six alternating pairs of `bench/run.py --jobs 4000 --only zktasks-pipelined-noop-2w`,
# means; write transactions per job 0.35-0.51 -> 0.26-0.28); 32 gained nothing more.
MAX_STARTS = BATCH_MAX  # a batch goes to one task process in one message (run_many)
BATCH_SPAN_S = 0.004
# A short job a worker holds alone (no other assignment of it in ZooKeeper, nothing else
# running) runs without its RUNNING write: at low load a job then costs three write
# transactions (submit, assign, outcome), not four, and a round trip less of latency.
# Its attempt is still counted should the worker die: the leader counts one for the
# oldest assignment of a vanished worker (Store.requeue's `held_alone`), which is the
# one job such a worker may have begun unrecorded (see _unrecorded_start). Only for
# tasks whose recent runs averaged at most this long: a longer job shows RUNNING while
# it runs, as before, and one that runs long this time has its RUNNING written after
# committer.LATE_START (0.1 s).
UNRECORDED_START_MAX_S = LOOKAHEAD_MAX_S
TASK_AVERAGES_MAX = 1000  # tasks whose run times a worker keeps
# Seconds between whole listings of a worker's assignments when a persistent watch tells
# it every change (idle moments only): the leader's RECONCILE_EVERY, for the worker.
RELIST_EVERY = 30.0


@dataclass(order=True)
class _Queued:
    sort_key: tuple
    job_id: str = field(compare=False)
    found: Versioned = field(compare=False)
    worker_id: str = field(compare=False)


@dataclass(frozen=True, slots=True)
class _Run:
    """A job whose start is recorded, ready for the executor."""

    blob: bytes
    running: StatusRecord
    commit: Commit
    call: object           # the loaded call, when signal receivers need it; else None
    execution: Execution


@dataclass(eq=False)
class _Held:
    """A thread-pool runner's batch, run in turn on that runner's thread: the jobs not
    begun yet, and since when the current one runs. Past BATCH_PATIENCE_S another runner
    takes the rest (Worker._take_overdue). Under Worker._cond."""

    rest: collections.deque
    since: float
    gone: set[str]  # the ids taken: the batch's runner no longer lets go of them


class Worker:
    """Run jobs of one backend alias until stopped."""

    def __init__(self, *, backend: str = "default", queues: list[str] | None = None,
                 concurrency: int = 1, pool: str = "process", name: str | None = None,
                 lead: bool = True, prefetch: int | None = None,
                 drain_timeout: float = 30.0, max_tasks_per_child: int | None = None,
                 max_memory_per_child: int | None = None,
                 startup_timeout: float | None = None):
        self.backend = task_backends[backend]
        from .backend import ZooKeeperBackend

        if not isinstance(self.backend, ZooKeeperBackend):
            raise ValueError(
                f"Backend {backend!r} is {type(self.backend).__name__}, not a "
                "ZooKeeperBackend; runworker only serves zktasks backends."
            )
        self.options = self.backend.conf
        self.queues = sorted(set(queues or []))
        self.concurrency = max(1, int(concurrency))
        # 4 per runner as Celery's default, 16 while jobs are short (prefetch.py): under
        # a backlog the leader then hands out jobs in batches, and a runner never waits
        # for the leader's next assignment. A job prefetched behind long ones waits for a
        # free runner here: for long jobs, pass 0 or 1 (runworker --prefetch).
        self._prefetch = Prefetch(self.concurrency, prefetch)
        self._prefetch_posted = False  # a "prefetch" event is on its way to the main loop
        self.pool_name = pool
        self.base_name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.lead = lead
        self.drain_timeout = drain_timeout
        self.startup_timeout = startup_timeout  # None: wait for ZooKeeper at start
        # Jobs still running when a drain timed out: interrupted, handed back, run again.
        self.unfinished = 0
        self.committer: Committer | None = None
        self.worker_id: str | None = None
        self.client = None
        self.store: Store | None = None
        self.leader: Leader | None = None
        self.runner = make_runner(pool, self.concurrency, max_tasks=max_tasks_per_child,
                                  max_memory_kb=max_memory_per_child)
        # At most `concurrency` jobs execute at once, whatever the number of runners.
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._run_avg: float | None = None  # moving average of execution time (seconds)
        # The same, per task: a job is started early (a batch's, a lookahead runner's)
        # only if its own task's runs were short. The worker-wide average alone would
        # start a long task's jobs early right after short ones.
        self._task_avg: dict[str, float] = {}

        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._ready: list[_Queued] = []
        self._known: set[str] = set()       # assigned to the current identity, not finished
        # Our assignments as ZooKeeper last showed them (the whole list, then the watch's
        # events, less those our own outcomes deleted), read or not: a job runs without
        # its start written only when it is the one assignment here (_unrecorded_start).
        self._listed: set[str] = set()
        self.unrecorded_starts = 0          # jobs so run
        # Jobs with a cancel request, as last listed: one may reach us after it was asked
        # for (its worker died before it could act, and the leader handed the job back).
        self._cancels: frozenset[str] = frozenset()
        self._running: dict[str, str] = {}  # job_id -> worker_id it runs under
        self._idle_runners = 0              # runner threads waiting for a job
        self._idle_lookahead = 0            # ... of them, lookahead runners
        self._arrivals = 0                  # jobs queued here so far
        self.missed_wakeups = 0             # jobs a runner found only at its 1 s poll
        self.batched_starts = 0             # jobs started in a runner's batch (MAX_STARTS)
        # Jobs taken back from a batch held up by a long job (ProcessRunner.run_many),
        # their starts recorded: any runner runs them before new jobs (_run_moved).
        self._moved: collections.deque[tuple[_Queued, _Run]] = collections.deque()
        self.moved_runs = 0                 # jobs so taken back
        self._held: list[_Held] = []        # thread pool: batches run in turn (the same)
        self._paused = False
        self._draining = False
        self._untold = False  # draining, and the worker znode does not say so yet
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()  # stop() was called (seen at startup)
        self._stopped = threading.Event()
        self._session: int | None = None
        self._lost = False
        # Set on kazoo's thread the instant a session ends (LOST), long before the main
        # loop may read its event; cleared once registered on the next session. kazoo
        # delivers LOST before any reply on the next session, so a start that lands
        # there (a retry of a write cut off by the expiry) is seen with this set, or
        # after a new registration changed worker_id (_ready_to_run).
        self._session_ended = False
        # Our assignments are watched by a persistent recursive watch where the client and
        # server allow it (connection.py): each assignment created or deleted arrives as
        # an event naming it, in order, and none costs a get_children. `_relist`: list
        # them whole next time (at registration, after a reconnection: the server forgot
        # the watch, and what changed meanwhile is read back).
        self._persistent: str | None = None  # the assignments path so watched
        self._changes: list[tuple[str, bool]] = []  # (job id, created) since last read
        self._changes_lock = threading.Lock()
        # Jobs whose outcome is being written (their assignment goes with it): the
        # deletion the watch then reports is our own, and needs no reading. Under a
        # backlog these are half the events; waking the main loop for each cost the
        # tuned row a tenth of its throughput (bench/README). Under _changes_lock.
        self._finishing: set[str] = set()
        self._reassigned: set[str] = set()  # of those, assigned to us again meanwhile
        self._relist = True
        self._listed_at = -math.inf  # monotonic time of the last whole list
        # (worker id, getter, job ids) of status reads whose answers did not come within
        # the bound: the next try waits on them again (_fetch_statuses). Main loop only.
        self._unanswered: tuple | None = None
        self.registered = threading.Event()
        self.completed = 0

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() is called; return after a clean exit."""
        # Task processes set up Django (seconds) while we connect; we register only once
        # they can run jobs (ProcessRunner.wait_ready).
        began = time.monotonic()
        self.runner.start()
        try:
            self.client = self._connect(began)
        except BaseException:
            self.runner.stop(force=True)
            raise
        if self.client is None:
            logger.info("stopped while connecting to ZooKeeper; never registered")
            self.runner.stop(force=True)
            self._stopped.set()
            return
        self.store = Store(self.client, self.options)
        self.committer = Committer(self.store, on_idle=lambda: self._wake_if_draining(None))
        self.committer.start()
        try:
            self.store.ensure_skeleton()
            for q in self.queues or ["default"]:
                self.store.ensure_queue(q)
            self._warn_if_open()
            ready = self.runner.wait_ready(abort=self._stop_requested)
        except BaseException:
            self._close_unregistered()
            raise
        if not ready:
            logger.info("stopped while the task processes set up; never registered")
            self._close_unregistered()
            return
        if self.pool_name == "process":
            # setup=shared: forks of one fork server that set Django up once.
            logger.info("task processes ready count=%d took=%.1fs setup=%s",
                        self.concurrency, time.monotonic() - began,
                        "shared" if self.runner.forked else "each")
        self.client.add_listener(self._on_state)
        # Again (a new identity) if the session changed under the first try.
        self.store.retry(self._register, deadline=self.options.connect_timeout)
        threads = [threading.Thread(target=self._runner_loop, name=f"zktasks-run-{i}",
                                    args=(i >= self.concurrency,), daemon=True)
                   for i in range(self.concurrency * LOOKAHEAD)]
        for t in threads:
            t.start()
        leader_stop = threading.Event()
        leader_thread = None
        if self.lead:
            leader_thread = threading.Thread(target=self._lead, args=(leader_stop,),
                                             name="zktasks-leader", daemon=True)
            leader_thread.start()
        else:
            self._watch_contenders()
        try:
            self._main_loop()
        finally:
            if self.leader is not None:
                self.leader.cancel()
            leader_stop.set()
            if leader_thread is not None:
                # Cut off from ZooKeeper, the leader's lock recipe waits for a connection
                # that may not come back: the session's end (or close) resigns for it.
                leader_thread.join(5 if self.client.connected else 0.5)
            with self._cond:
                self._cond.notify_all()
            # Runner threads are done after a drain; after a forced stop a thread-pool job
            # may still run: do not wait for it, our session's end hands it back.
            for t in threads:
                t.join(2.0)
            self.committer.close(timeout=5.0)
            self._deregister()
            self.runner.stop(force=True)
            self.client.remove_listener(self._on_state)
            self.client.stop()
            self.client.close()
            self._stopped.set()
            logger.info("worker stopped worker=%s completed=%d", self.worker_id, self.completed)

    def _close_unregistered(self) -> None:
        """Undo what run() set up before registering."""
        self.committer.close(timeout=5.0)
        self.runner.stop(force=True)
        self.client.stop()
        self.client.close()
        self._stopped.set()

    def stop(self, *, graceful: bool = True) -> None:
        """Ask the worker to leave: drain first when graceful, else at once."""
        self._stop_requested.set()
        # A drain already under way (asked through ZooKeeper) is not a reason to stop at
        # once: one SIGTERM then abandoned its running jobs (WorkerLost) and exited 0.
        # Escalating is the caller's choice (runworker's second signal).
        self._events.put(("drain", None) if graceful else ("stop", None))

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def _warn_if_open(self) -> None:
        open_paths = self.store.open_to_anyone()
        if open_paths:
            root = self.options.root
            logger.error(
                "AUTH is set, but %d znode(s) under %s were created before it and are open "
                "to anyone (world:anyone), who can read payloads there and delete or add "
                "jobs: %s. Give the whole tree the digest ACL once, in zkCli.sh (ZooKeeper "
                "3.6+): addauth digest USER:PASSWORD, then setAcl -R %s auth::cdrwa",
                len(open_paths), root, ", ".join(open_paths[:5]), root)

    def _connect(self, began: float):
        """A started client, or None if stop() came first. Until ZooKeeper answers, try
        again each CONNECT_TIMEOUT, saying why, for startup_timeout seconds (None: for as
        long as it takes): workers are often started with, or before, the ensemble (a
        compose file, a host's boot), and one that exited at once needed a restart
        policy to come back. Celery retries its broker at startup the same way."""
        attempts = 0
        while True:
            try:
                return start(new_client(self.options), self.options,
                             abort=self._stop_requested)
            except ZooKeeperUnavailableError as exc:
                attempts += 1
                waited = time.monotonic() - began
                if self.startup_timeout is not None and waited >= self.startup_timeout:
                    raise
                logger.warning("%s Trying again (attempt %d, %.0f s so far%s).", exc,
                               attempts + 1, waited,
                               "" if self.startup_timeout is None else
                               f" of --startup-timeout {self.startup_timeout:g}")

    # -- registration ------------------------------------------------------------------

    def _register(self) -> None:
        """Create our assignments parent and ephemeral worker znode in one multi."""
        self.worker_id = f"{self.base_name}-{secrets.token_hex(3)}"
        layout = self.store.layout
        info = records.dumps({
            "host": socket.gethostname(), "pid": os.getpid(), "queues": self.queues,
            "concurrency": self.concurrency, "prefetch": self.prefetch,
            "pool": self.pool_name, "started_at": records.now().isoformat(),
            "draining": self._draining,
        })
        worker_id = self.worker_id

        def build(txn):
            txn.create(layout.worker_assignments(worker_id), b"")
            txn.create(layout.worker(worker_id), info, ephemeral=True)

        results = self.store.commit(
            build, landed=lambda: self.client.exists(layout.worker(worker_id)) is not None,
            deadline=self.options.connect_timeout,
        )
        failed = failures(results)
        if failed and not isinstance(failed[0][1], NodeExistsError):
            raise failed[0][1]
        client_id = self.client.client_id
        if client_id is None:  # dropped right after the multi: register again later
            raise ConnectionLoss("the connection dropped while registering")
        # The multi may have landed on a session that expired before its answer came:
        # the resend on the next session then failed on the assignments parent (which
        # outlives sessions) and looked like success, while the ephemeral worker znode
        # had gone with the old session. Registered there, this worker would be alive
        # and idle under an identity nobody sees. Checked, so it registers afresh.
        stat = self.store.retry(self.client.exists, layout.worker(worker_id))
        if stat is None or stat.ephemeralOwner != client_id[0]:
            raise ConnectionLoss(f"registered as {worker_id} on a session that ended "
                                 "before the answer came")
        self._session = client_id[0]
        if self.leader is not None:
            self.leader.identity = worker_id  # contend under the new identity next time
        self._lost = False
        self._session_ended = False  # after worker_id changed: see _ready_to_run
        self._paused = False
        self._relist = True
        # Cancel requests first: a job handed to us may have one (_read_assignments).
        self._events.put(("cancels", None))
        self._events.put(("assignments", None))
        self._events.put(("own", None))
        self.registered.set()
        logger.info("worker registered worker=%s queues=%s concurrency=%d pool=%s "
                    "prefetch=%d%s", worker_id, ",".join(self.queues) or "*",
                    self.concurrency, self.pool_name, self.prefetch,
                    "" if self._prefetch.fixed else " (follows the jobs)")

    def _watch_contenders(self) -> None:
        """A --no-leader worker says so when no worker contends for leadership: its
        jobs would otherwise wait without a word. kazoo's ChildrenWatch re-arms itself
        (after a reconnection too); it calls back in kazoo's event thread."""
        seen = {"empty": None}

        def on_contenders(children):
            empty = not children
            if empty and seen["empty"] is not True:
                logger.warning("no worker contends for leadership worker=%s: jobs are not "
                               "assigned until one runs without --no-leader",
                               self.worker_id)
            elif not empty and seen["empty"]:
                logger.info("a worker contends for leadership again worker=%s count=%d",
                            self.worker_id, len(children))
            seen["empty"] = empty
            return not self._stopping.is_set()  # False: stop watching

        ChildrenWatch(self.client, self.store.layout.leader, on_contenders)

    def _deregister(self) -> None:
        if self.worker_id is None or self._lost:
            return
        layout = self.store.layout
        worker_id = self.worker_id

        def build(txn):
            txn.delete(layout.worker(worker_id))
            txn.delete(layout.worker_assignments(worker_id))

        unanswered = ("worker left without deregistering worker=%s (ZooKeeper did not "
                      "answer): its session's end hands its jobs back")
        if not self.client.connected:
            logger.info(unanswered, worker_id)  # the bound below would be spent waiting
            return
        try:
            # Bounded: with ZooKeeper away this waited for its return, and the worker
            # with it. Leaving without it is safe: the session's end hands the jobs back.
            with self.store.bounded(2.0):
                results = self.store.commit(build, deadline=2.0)
            if failures(results):
                # Assignments are left (a forced stop): our session's end makes the
                # leader hand them back.
                logger.info("worker left with assignments worker=%s", worker_id)
        except Exception:
            logger.info(unanswered, worker_id, exc_info=logger.isEnabledFor(logging.DEBUG))

    @property
    def prefetch(self) -> int:
        """Jobs this worker asks to hold beyond the ones it runs (prefetch.py)."""
        return self._prefetch.current

    def _advertise_prefetch(self) -> None:
        """Write a changed prefetch into our worker znode; the leader's watch on it
        reads it. On the main loop, as _begin_drain's write to the same znode."""
        self._prefetch_posted = False  # first: the next finished job may post again
        if self._lost or self._paused or self._draining:
            return  # the next finished job asks again
        now = time.monotonic()
        value = self._prefetch.wanted(self._run_avg, now)
        if value is None:
            return

        def change(data: dict) -> bool:
            # Never over a drain request: that one is read through our own watch.
            if data.get("draining") or data.get("prefetch") == value:
                return False
            data["prefetch"] = value
            return True

        try:
            # Bounded (see _read_own_znode): a connection that drops after the check
            # above would otherwise hold the main loop, and a stop, until ZooKeeper is
            # back. A write that timed out may still land: the version guards a drain
            # request, and the next finished job finds the value already there.
            with self.store.bounded():
                data = self.store.update_worker(self.worker_id, change)
        except ZooKeeperUnavailableError:
            logger.debug("prefetch not advertised (ZooKeeper unreachable) worker=%s",
                         self.worker_id)
            return  # the next finished job asks again
        if data is None or data.get("prefetch") != value:
            return  # gone (_register writes the current value), or draining
        before = self._prefetch.current
        self._prefetch.advertised(value, now)
        logger.info("prefetch %d -> %d worker=%s (jobs average %.1f ms)", before, value,
                    self.worker_id, (self._run_avg or 0) * 1000)

    # -- leader ------------------------------------------------------------------------

    def _lead(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self._stopping.is_set():
            self.registered.wait()
            self.leader = Leader(self.store, self.worker_id, stop=stop)
            self.leader.on_failed = self._leader_failed
            try:
                self.leader.run()
            except Exception:
                # Never leave this worker unable to lead: log, and contend again.
                logger.exception("leader thread failed worker=%s; contending again",
                                 self.worker_id)
                stop.wait(0.5)

    # -- events (kazoo's thread: never block, never call ZooKeeper) --------------------

    def _on_state(self, state) -> None:
        if state == KazooState.LOST:
            self._session_ended = True
        self._events.put(("state", state))
        if self.leader is not None:
            self.leader.on_state(state)

    @inline_watch
    def _on_own_znode(self, event) -> None:
        self._events.put(("own", None))

    @inline_watch
    def _on_cancels(self, event) -> None:
        self._events.put(("cancels", None))

    @inline_watch
    def _on_assignments(self, event) -> None:
        self._events.put(("assignments", event.type == EventType.NONE))

    @inline_watch
    def _on_assignment_change(self, event) -> None:
        """The persistent watch on our assignments: note which, and wake the main loop
        (once for all changes it has not read yet)."""
        parent, _, job_id = event.path.rpartition("/")
        if parent != self._persistent or event.type not in (EventType.CREATED,
                                                             EventType.DELETED):
            return
        created = event.type == EventType.CREATED
        with self._changes_lock:
            if job_id in self._finishing:
                if created:
                    # Retried and assigned to us again before _recorded forgot it.
                    self._reassigned.add(job_id)
                return  # else our own finish: _recorded forgets the job, nothing to read
            self._changes.append((job_id, created))
            first = len(self._changes) == 1
        if first:
            self._events.put(("assignments", False))

    # -- main loop ---------------------------------------------------------------------

    def _main_loop(self) -> None:
        drain_deadline = None
        retry_later: list[tuple] = []
        while True:
            timeout = 1.0 if drain_deadline is None else 0.2
            try:
                kind, value = self._events.get(timeout=timeout)
            except queue.Empty:
                kind, value = None, None
                if (self._persistent is not None
                        and time.monotonic() - self._listed_at > RELIST_EVERY):
                    # Events are hints (DESIGN rule 5): now and then, the whole list.
                    self._relist = True
                    self._events.put(("assignments", None))
                for event in retry_later:  # events whose reads failed: once a second
                    self._events.put(event)
                retry_later.clear()
            try:
                result = self._dispatch(kind, value, drain_deadline)
            except (ZooKeeperUnavailableError, KazooException) as exc:
                # A frozen process (SIGSTOP, a long GC) wakes past every retry deadline:
                # ZooKeeper errors here are never fatal; the read is simply tried again.
                logger.warning("ZooKeeper call failed worker=%s event=%s error=%r; retrying",
                               self.worker_id, kind, exc)
                if (kind, value) not in retry_later:
                    retry_later.append((kind, value))
                continue
            except Exception:
                # A bug must not take the worker's main thread down: its running jobs,
                # drains and re-registrations all go through here.
                logger.exception("worker event failed worker=%s event=%s; retrying it",
                                 self.worker_id, kind)
                if kind is not None and (kind, value) not in retry_later:
                    retry_later.append((kind, value))
                continue
            if result is _STOP:
                return
            if isinstance(result, float):
                drain_deadline = result

    def _dispatch(self, kind, value, drain_deadline):
        """Handle one event; return _STOP to leave, or a new drain deadline."""
        if kind == "stop":
            logger.warning("worker stopping now worker=%s running=%d", self.worker_id,
                           len(self._running))
            self._stopping.set()
            self.runner.stop(force=True)
            return _STOP
        if kind == "drain":
            if self._draining:
                return None
            drain_deadline = time.monotonic() + self.drain_timeout
            self._begin_drain()
        elif kind == "state":
            self._handle_state(value)
        # Reads not while the connection is suspended: the CONNECTED that ends it queues
        # all three again. kazoo fires watches as the connection drops, and their events
        # come before the SUSPENDED one: read then, each waited CONNECT_TIMEOUT in
        # kazoo's queue, and the SUSPENDED itself (and a drain, a stop) waited behind
        # them. The client's live state says so at once.
        elif kind == "assignments" and self._may_read():
            self._read_assignments()
            if self._draining and self._ready and not self._untold:
                # Assigned before the leader read our drain: back they go, as those
                # held when it began. Not while our znode does not say draining: the
                # leader would give them straight back to us, and again.
                self._hand_back_ready()
        elif kind == "drain-again" and self._may_read():
            self._tell_draining()
            if not self._untold:
                self._hand_back_ready()
        elif kind == "own" and self._may_read():
            self._read_own_znode()
        elif kind == "cancels" and self._may_read():
            self._read_cancels()
        elif kind == "prefetch":
            self._advertise_prefetch()
        elif kind == "finished":
            pass
        if drain_deadline is not None:
            if not self._running and not self.committer.pending():
                self._stopping.set()
                return _STOP
            if time.monotonic() > drain_deadline:
                self.unfinished = len(self._running)
                logger.warning("drain timed out worker=%s running=%d", self.worker_id,
                               self.unfinished)
                self._stopping.set()
                self.runner.stop(force=True)
                return _STOP
        return drain_deadline

    def _may_read(self) -> bool:
        return not self._lost and not self._paused and self.client.connected

    def _handle_state(self, state) -> None:
        if state == KazooState.SUSPENDED:
            self._paused = True
            logger.warning("ZooKeeper connection suspended worker=%s: starting nothing new",
                           self.worker_id)
        elif state == KazooState.LOST:
            client_id = self.client.client_id
            if not self._lost and client_id is not None and client_id[0] == self._session:
                # Stale: a CONNECTED queued before it found the next session and we
                # registered there already (a busy main loop reads events late). kazoo
                # reports a LOST while no session is live, so this one is not ours;
                # taken as ours, it registered a second identity and left the first one
                # alive and idle on this session, where the leader gave it jobs nobody
                # would read.
                logger.info("session-expired notice for an earlier session ignored "
                            "worker=%s", self.worker_id)
                return
            self._drop_session()
        elif state == KazooState.CONNECTED:
            client_id = self.client.client_id
            if client_id is None:
                # The connection dropped again before we got here: kazoo's next
                # CONNECTED event (queued after its SUSPENDED) does this work.
                return
            if self._lost or client_id[0] != self._session:
                if not self._lost:
                    self._drop_session()  # its LOST is queued behind this event
                self._register()  # on failure the main loop posts this event again
            else:
                self._paused = False
                self._relist = True  # the server forgot our watches with the connection
                logger.info("ZooKeeper connection resumed worker=%s", self.worker_id)
                self._events.put(("cancels", None))  # first, as in _register
                self._events.put(("assignments", None))
                self._events.put(("own", None))
                if self._draining:
                    self._events.put(("drain-again", None))  # what the outage deferred
            with self._cond:
                self._cond.notify_all()

    def _drop_session(self) -> None:
        """Our session is gone: forget its jobs (the leader hands them back) and ask
        their runs to stop; the next CONNECTED registers a new identity."""
        self._lost = True
        self._paused = True
        with self._cond:
            self._ready.clear()
            self._known.clear()
            self._listed.clear()
        with self._changes_lock:
            self._finishing.clear()
            self._reassigned.clear()
        with self._cond:
            running = len(self._running)
        logger.error("ZooKeeper session expired worker=%s: its jobs will be handed "
                     "back; registering again", self.worker_id)
        if running:
            # The leader hands their jobs back and they run again: a task that checks
            # cancel_requested() can stop now instead of running alongside its rerun
            # (the failure it then reports is dropped, see _settle).
            self.runner.abandon_running()
            logger.warning("asked %d running job(s) of worker=%s to stop "
                           "(zktasks.cancel_requested() is True for them)",
                           running, self.worker_id)

    def _watch_assignments(self, path: str) -> bool:
        """Arm the persistent watch on our assignments (again); False: one-shot watches
        it is (kazoo's own connection handler, or a server older than 3.6)."""
        if self._persistent not in (None, path):  # a new identity after a lost session
            self.store.unwatch_persistently(self._persistent, self._on_assignment_change)
            self._persistent = None
        armed = self.store.watch_persistently(path, self._on_assignment_change)
        self._persistent = path if armed else None
        return armed

    def _assignment_changes(self, path: str) -> tuple[set[str], set[str] | None] | None:
        """(present, absent) job ids since the last read, from the persistent watch's
        events; None when the whole list is to be read."""
        if self._relist or self._persistent != path:
            return None
        with self._changes_lock:
            changes, self._changes = self._changes, []
        last = dict(changes)  # in order: the last word on each job
        return ({j for j, created in last.items() if created},
                {j for j, created in last.items() if not created})

    def _read_assignments(self) -> None:
        layout = self.store.layout
        worker_id = self.worker_id
        path = layout.worker_assignments(worker_id)
        changes = self._assignment_changes(path)
        if changes is None:
            # Changes noted until now are in the list; those after it arrive as events.
            with self._changes_lock:
                self._changes = []
            # Cleared before the list, not after: one set while it travels (_recorded,
            # a job assigned to us again as it finished) must survive to list again.
            self._relist = False
            try:
                persistent = self._watch_assignments(path)
                # Bounded (see _read_own_znode): listed as the connection drops (right
                # after registering, say), the read waited in kazoo's queue for
                # ZooKeeper's return, and the main loop, a drain and a stop with it.
                with self.store.bounded():
                    current = set(self.store.children(
                        path, watch=None if persistent else self._on_assignments))
            except TRANSIENT:
                self._relist = True
                return  # the state handler re-reads after reconnecting
            except BaseException:
                self._relist = True
                raise
            self._listed_at = time.monotonic()
            changes = (current, None)
        present, absent = changes
        with self._cond:
            if absent is None:  # the whole list: what is not in it was taken back
                absent = self._known - present
                self._listed = set(present)
            else:
                self._listed = (self._listed | present) - absent
            taken_back = (absent & self._known) - set(self._running)
            if taken_back:
                self._ready = [q for q in self._ready if q.job_id not in taken_back]
                heapq.heapify(self._ready)
                self._known -= taken_back
            new = present - self._known
        # Sent unbounded (a bounded store reads one by one, without multiRead), waited
        # for bounded: an answer lost with the connection was read again in kazoo's
        # queue, and the main loop, a drain and a stop with it, waited for ZooKeeper's
        # return (see _read_own_znode).
        fetch = self._fetch_statuses(worker_id, sorted(new))
        ready = []
        try:
            for job_id in sorted(new):
                try:
                    with self.store.bounded():
                        found = fetch(job_id)
                except CorruptRecord as exc:
                    self._fail_corrupt(worker_id, job_id, exc)
                    continue
                except TRANSIENT:
                    self._relist = True  # these changes are not read again as events
                    return
                except ZooKeeperUnavailableError:
                    # Past the bound: the answers may still be on their way (a slow
                    # link, records of a megabyte). Kept, for the next try to wait on.
                    self._unanswered = (worker_id, fetch, new)
                    self._relist = True
                    raise
                except BaseException:
                    self._relist = True  # as above; the main loop reports the error
                    raise
                if found is None:
                    self._set_aside_orphan(worker_id, job_id)
                    continue
                ready.append(_Queued((-found.record.priority, job_id), job_id, found,
                                     worker_id))
        finally:
            # Cancelled before they reached us: never started here (after a read that
            # failed half-way, they are read again with the rest).
            doomed = [q for q in ready if q.job_id in self._cancels]
            if doomed:
                ready = [q for q in ready if q.job_id not in self._cancels]
            # All at once: a runner woken here sees the whole batch (and may take several
            # short jobs, _runner_loop), and the runners are woken once, not per job.
            if ready:
                with self._cond:
                    for item in ready:
                        self._known.add(item.job_id)
                        heapq.heappush(self._ready, item)
                    self._arrivals += len(ready)
                    wake = len(ready)
                    if self._idle_lookahead and not (
                            self._short_jobs() and self._short_task(self._ready[0])):
                        # A lookahead runner woken for this job turns it down and waits
                        # again, taking the wake-up with it: a regular runner then only
                        # found the job at its next poll, up to a second later.
                        wake += self._idle_lookahead
                    self._cond.notify(wake)
        for item in doomed:
            self._cancel_queued(item)

    def _fetch_statuses(self, worker_id: str, job_ids: list[str]):
        """store.read_statuses(job_ids), waiting again on the reads still on their way
        from a try whose wait ran out (see _read_assignments): sent again, each retry
        queued another copy of the same records behind the first, and over a slow link
        the jobs never started."""
        kept, self._unanswered = self._unanswered, None
        if kept is None or kept[0] != worker_id:
            return self.store.read_statuses(job_ids)
        _, earlier, sent = kept
        fresh = self.store.read_statuses([j for j in job_ids if j not in sent])
        return lambda job_id: (earlier if job_id in sent else fresh)(job_id)

    def _read_cancels(self) -> None:
        """Act on cancel requests for jobs this worker holds.

        Every worker watches the cancel parent: requests are rare and short-lived (the
        leader sweeps answered ones), so this cold znode is no herd.
        """
        layout = self.store.layout
        try:
            # Bounded (see _read_own_znode); ZooKeeperUnavailableError: read again later.
            with self.store.bounded():
                requested = set(self.store.children(layout.cancel, watch=self._on_cancels))
        except TRANSIENT:
            return
        self._cancels = frozenset(requested)
        with self._cond:
            mine = requested & self._known
            queued = [q for q in self._ready if q.job_id in mine]
            if queued:
                self._ready = [q for q in self._ready if q.job_id not in mine]
                heapq.heapify(self._ready)
            running = [j for j in mine if j in self._running]
        for item in queued:
            self._cancel_queued(item)
        forces = {job_id: self._cancel_force(job_id) for job_id in running}  # reads: unlocked
        with self._cond:
            # Still running: once a run's loop has let go of it (and told the runner to
            # forget it), a cancel handed to the runner would be kept for good.
            for job_id in running:
                if job_id in self._running:
                    logger.warning("cancel requested job=%s force=%s", job_id,
                                   forces[job_id])
                    self.runner.cancel(job_id, force=forces[job_id])

    def _cancel_force(self, job_id: str) -> bool:
        try:
            raw, _ = self.client.get(self.store.layout.cancel_request(job_id))
            return bool(json.loads(raw).get("force"))
        except Exception:
            return False

    def _cancel_queued(self, item: _Queued) -> None:
        from .exceptions import JobCancelled

        exc = JobCancelled(f"Job {item.job_id!r} was cancelled before it ran.")
        record = item.found.record
        final = record.evolve(state=records.FAILED, finished_at=records.now(), errors=(
            *record.errors, ErrorRecord.from_exception(exc, worker_id=item.worker_id))).fit(
            self.options.max_record_bytes)
        if self.store.finish(item.worker_id, item.job_id, final, item.found.version):
            logger.info("job cancelled job=%s (not started)", item.job_id)
        with self._cond:
            self._forget(item)

    def _read_own_znode(self) -> None:
        """Follow requests written to our worker znode (the dashboard's "drain")."""
        try:
            # Bounded, as the main loop's other calls during a stop or drain: while
            # ZooKeeper is away a read waited in kazoo's queue for its return, and the
            # stop or the drain's deadline queued behind it as long (a worker cut off
            # from ZooKeeper could not be stopped, not even by a second signal).
            with self.store.bounded():
                raw, _ = self.store.client.get(self.store.layout.worker(self.worker_id),
                                               watch=self._on_own_znode)
            data = json.loads(raw)
        except TRANSIENT:
            return  # re-read when the connection is back
        except ZooKeeperUnavailableError:
            raise  # read again (the main loop's retry_later)
        except Exception:
            logger.debug("own worker znode unreadable", exc_info=True)
            return
        if data.get("draining") and not self._draining:
            logger.warning("drain requested through ZooKeeper worker=%s", self.worker_id)
            self._events.put(("drain", None))

    def _begin_drain(self) -> None:
        """Stop taking work, tell the leader, hand back what has not started."""
        self._draining = True
        logger.info("worker draining worker=%s running=%d", self.worker_id, len(self._running))
        self._tell_draining()
        if self.leader is not None:
            self.leader.cancel()
        self._hand_back_ready()

    def _tell_draining(self) -> None:
        """Mark our worker znode draining, so that the leader assigns us nothing more
        (a read when it says so already).

        Not while disconnected: the write waited CONNECT_TIMEOUT for nothing, and the
        stop behind it (a worker told to leave during an outage took 10-17 s). It is
        written when the connection returns instead (_handle_state), if the worker is
        still draining then; a worker that leaves first needs no mark: its session's
        end tells the leader."""
        self._untold = True
        if not self.client.connected:
            logger.info("ZooKeeper unreachable: the leader learns of the drain when the "
                        "connection returns worker=%s", self.worker_id)
            return
        try:
            with self.store.bounded():  # see _read_own_znode
                self.store.update_worker(self.worker_id, mark_draining)
            self._untold = False
        except Exception:
            logger.debug("could not mark draining", exc_info=True)

    def _hand_back_ready(self) -> None:
        """Hand back the jobs held here that have not started (draining).

        Only while connected: each hand-back waited up to 2 s on a connection that was
        gone, one after another (a prefetch is 8 jobs and up by default), and a stop
        behind them. Those not handed back stay here, assigned to us, and go back when
        the connection returns (_handle_state) or when this worker leaves (its
        session's end). Runners take nothing from _ready while draining."""
        with self._cond:
            handed, self._ready = self._ready, []
            self._cond.notify_all()
        for i, item in enumerate(handed):
            if not self.client.connected:
                kept = handed[i:]
                with self._cond:
                    for held in kept:
                        heapq.heappush(self._ready, held)
                logger.info("ZooKeeper unreachable: %d job(s) not started stay with "
                            "worker=%s; handed back when the connection returns, or by "
                            "the leader once this worker is gone", len(kept), self.worker_id)
                return
            self._hand_back(item)

    def _hand_back(self, item: _Queued) -> None:
        record = item.found.record
        layout = self.store.layout

        waiting = self.store.waiting_path(record)

        def build(txn):
            txn.create(waiting, records.dumps({"id": item.job_id, "task": record.task}))
            txn.delete(layout.assignment(item.worker_id, item.job_id))

        try:
            with self.store.bounded():  # see _read_own_znode
                results = self.store.commit(build, deadline=2.0, waiting=[waiting])
            if failures(results):
                logger.info("hand back refused job=%s: %s", item.job_id, failures(results))
            else:
                logger.info("job handed back job=%s (worker draining)", item.job_id)
        except Exception:
            logger.warning("hand back failed job=%s; the leader will reassign it when this "
                           "worker leaves", item.job_id, exc_info=True)
        with self._cond:
            self._forget(item)

    def _forget(self, item: _Queued) -> None:
        """The job is no longer held by the current identity (caller holds _cond). Not
        for a run of an identity lost meanwhile: the same job, handed back and assigned
        again to this process's new identity, stays known and is not listed twice."""
        if item.worker_id == self.worker_id:
            self._known.discard(item.job_id)

    # -- running -----------------------------------------------------------------------

    def _short_jobs(self) -> bool:
        average = self._run_avg
        return average is not None and average <= LOOKAHEAD_MAX_S

    def _short_task(self, item: _Queued) -> bool:
        """Whether the job's task ran short lately (unknown tasks are not)."""
        average = self._task_avg.get(item.found.record.task)
        return average is not None and average <= LOOKAHEAD_MAX_S

    def _runner_loop(self, lookahead: bool = False) -> None:
        while True:
            with self._cond:
                while not self._stopping.is_set() and not self._take_overdue() and (
                    not self._ready or self._paused or self._draining
                    or (lookahead and not (self._short_jobs()
                                           and self._short_task(self._ready[0])))
                ):
                    if self._draining and not self._ready:
                        break
                    self._idle_runners += 1
                    self._idle_lookahead += lookahead
                    arrivals = self._arrivals
                    timeout = self._patience_left()
                    try:
                        woken = self._cond.wait(timeout)
                    finally:
                        self._idle_runners -= 1
                        self._idle_lookahead -= lookahead
                    if not woken and timeout >= 1.0 and not lookahead \
                            and self._arrivals != arrivals and self._ready and not self._paused:
                        self.missed_wakeups += 1  # a job came, and nobody woke us for it
                if self._stopping.is_set():
                    return
                moved = self._moved.popleft() if self._moved else None
                if moved is None and self._draining:
                    return
                if moved is None:
                    items = self._take_ready()
            if moved is not None:
                self._run_moved(*moved)
                continue
            handed_over: set[str] = set()
            gone: set[str] = set()  # taken back from the batch: another runner has them
            try:
                # Every start first (the committer writes a batch's together), then each
                # job in turn once its own start is recorded; a failure stays its job's.
                begun = [(item, self._guarded(item, self._begin, item)) for item in items]
                if len(items) > 1 and getattr(self.runner, "batch_max", None):
                    handed_over |= self._execute_batch(begun, gone)
                elif len(items) > 1:
                    handed_over |= self._execute_in_turn(begun, gone)
                else:
                    for item, started in begun:
                        if self._stopping.is_set():
                            # A forced stop: the rest stay assigned, RUNNING; the leader
                            # hands them back once our session ends (at-least-once).
                            break
                        if started is not None and self._guarded(item, self._execute, item,
                                                                  started, held=True):
                            handed_over.add(item.job_id)
            finally:
                self._let_go([item for item in items if item.job_id not in gone],
                             handed_over)

    def _take_overdue(self) -> bool:
        """Whether there are jobs taken back from a held-up batch to run (caller holds
        _cond); takes those of the thread pool's batches whose current job has run past
        BATCH_PATIENCE_S (the process pool's are taken back by ProcessRunner.run_many)."""
        if self._held:
            now = time.monotonic()
            for held in self._held:
                if held.rest and now - held.since >= executor.BATCH_PATIENCE_S:
                    moved = list(held.rest)
                    held.rest.clear()
                    self._move(moved, held.gone)
                    logger.info("a job has run for %.1fs with %d job(s) of its batch waiting "
                                "behind it; they run on other threads", now - held.since,
                                len(moved))
        return bool(self._moved)

    def _move(self, moved: list[tuple[_Queued, _Run]], gone: set[str]) -> None:
        """Queue jobs taken back from a held-up batch for any runner (caller holds
        _cond); their ids go in the batch's `gone`, so its runner no longer lets go of
        them."""
        gone.update(item.job_id for item, _ in moved)
        self._moved.extend(moved)
        self.moved_runs += len(moved)
        self._cond.notify_all()  # every idle runner, to run them side by side

    def _patience_left(self) -> float:
        """How long an idle runner may wait before a held-up batch is due to be taken
        (caller holds _cond): 1 s at most, as before."""
        wait = 1.0
        if self._held:
            now = time.monotonic()
            for held in self._held:
                if held.rest:
                    wait = min(wait, max(0.01, held.since + executor.BATCH_PATIENCE_S - now))
        return wait

    def _take_ready(self) -> list[_Queued]:
        """The next job, and the short ones a batch takes with it (caller holds _cond)."""
        items = [heapq.heappop(self._ready)]
        extra = min(len(self._ready) - self._idle_runners, self._batch_size() - 1)
        if not self._short_task(items[0]):
            extra = 0  # the batch would wait behind it
        for _ in range(extra):
            if not self._short_task(self._ready[0]):
                break  # it would show RUNNING while the batch ahead of it runs
            items.append(heapq.heappop(self._ready))
        if len(items) > 1:
            self.batched_starts += len(items)
        for item in items:
            self._running[item.job_id] = item.worker_id
        return items

    def _let_go(self, items: list[_Queued], handed_over: set[str]) -> None:
        """A runner is done with these jobs; `handed_over`: those whose outcome went to
        the committer."""
        with self._cond:
            for item in items:
                if self._running.get(item.job_id) == item.worker_id:
                    del self._running[item.job_id]
                if item.job_id not in handed_over:
                    # Otherwise it stays known until its outcome is recorded (or
                    # refused): its assignment is still there until then.
                    self._forget(item)
                # A cancel read while it was in _running but not on the runner
                # (its run settling, a start refused) stayed there for good: one
                # entry per such job ever cancelled (a resource-growth audit). Not
                # while a rerun of it runs here (under our new identity): the
                # runner keeps cancels by job id, and that one is the rerun's.
                # Under _cond, as _read_cancels hands cancels on, so a rerun
                # cannot start and be cancelled between the check and this.
                if item.job_id not in self._running:
                    self.runner.forget(item.job_id)
        for item in items:
            self._wake_if_draining(item.job_id)

    def _batch_size(self) -> int:
        average = self._run_avg
        if average is None or average > BATCH_SPAN_S:
            return 1
        return min(MAX_STARTS, int(BATCH_SPAN_S / max(average, 1e-6)))

    def _guarded(self, item: _Queued, step, *args, held: bool = False, **kwargs):
        """Run one step of one job and return its result, or None if it failed (logged;
        no other job is touched). `held`: a step after the job's start was recorded; on
        an unexpected error it returns True, so that the job stays known here, as the
        log line says. Forgotten, the next whole listing of our assignments (every 30 s)
        found it again and started it again, attempt after attempt."""
        try:
            return step(*args, **kwargs)
        except (ZooKeeperUnavailableError, KazooException) as exc:
            # Typically our session expired mid-job: the leader hands the job back.
            logger.warning("could not record job=%s error=%r; the leader hands it back "
                           "once this identity's session is gone", item.job_id, exc)
        except Exception:
            logger.exception("unexpected error running job=%s; it stays assigned and "
                             "will be handed back when this worker leaves", item.job_id)
            return True if held else None
        return None

    def _begin(self, item: _Queued):
        """Hand a job's RUNNING record to the committer (not waiting for it); return what
        _execute needs, or None if the job is not to run."""
        job_id, worker_id = item.job_id, item.worker_id
        record, version = item.found.record, item.found.version
        if record.is_finished:
            self.store.drop_assignment(worker_id, job_id)  # cancelled or already done
            return None
        try:
            blob = envelope.open_envelope(record.payload, job_id=job_id,
                                          kind=envelope.PAYLOAD,
                                          keys=self.options.verify_keys)
        except PayloadVerificationError as exc:
            # Failed as before, and noted in the dead letters (in the same multi) so that
            # an operator can re-queue it once SIGNING_KEY is right. The entry keeps what
            # room the failed record leaves in that multi (the record, payload and all,
            # stays in status/, where a re-queue reads it).
            logger.error("payload refused job=%s: %s", job_id, exc)
            reason = str(exc)

            def note(beside: int) -> tuple[str, bytes]:
                return deadletter.entry(
                    self.store, self.store.layout.status(job_id), record.to_bytes(),
                    kind="foreign_signature", reason=reason, by=worker_id,
                    job_id=job_id, beside=beside)

            self._finish(item, record, version, Outcome(
                ok=False, error=ErrorRecord.from_exception(exc, worker_id=worker_id)),
                dead_letter=note)
            return None
        now = records.now()
        running = record.evolve(
            state=records.RUNNING, attempts=record.attempts + 1,
            worker_ids=record.worker_ids + (worker_id,),
            started_at=record.started_at or now, last_attempted_at=now,
            retry_at=None,  # its backoff is over; a job handed back later is due at once
        ).fit(self.options.max_record_bytes)  # its errors and workers grow each attempt
        running_bytes = running.to_bytes()  # kept from fit(): encoded once
        if self._unrecorded_start(item):
            # Not written: its outcome records the attempt (committer.begin_unrecorded).
            self.unrecorded_starts += 1
            return blob, running, running_bytes, self.committer.begin_unrecorded(
                worker_id, job_id, running_bytes, version)
        # Recorded (fenced by our assignment) before the job runs, in a multi shared with
        # other jobs' writes (committer.py).
        commit = self.committer.begin(worker_id, job_id, running_bytes, version)
        return blob, running, running_bytes, commit

    def _unrecorded_start(self, item: _Queued) -> bool:
        """Whether a job may run without its RUNNING write (see UNRECORDED_START_MAX_S).

        The start write does three things, and here each holds without it:

        * It counts the attempt, should the worker die mid-run. The leader counts one
          for the oldest assignment of a vanished worker that shows no start
          (Store.requeue's `held_alone`). A job runs unrecorded only when it is our one
          assignment in ZooKeeper as last seen: any assignment made since is newer, so
          the job stays the oldest for as long as it runs, and it is counted.
        * It fences the run by our assignment. Ours until our session ends (the leader
          takes back only a vanished worker's jobs; a cancel reaches us by its own
          watch), and the session is alive while kazoo is connected: kazoo gives up on a
          silent server after two thirds of the session timeout, the server on us after
          all of it. A session that ended meanwhile is seen as _session_ended (kazoo
          reports LOST before anything of the next session).
        * It keeps jobs from starting while ZooKeeper is out of reach: so does the
          `connected` check.

        The price, said in the README: a worker that dies holding one job it had not
        begun yet has that job's attempt counted all the same.
        """
        average = self._task_avg.get(item.found.record.task)
        if average is None or average > UNRECORDED_START_MAX_S:
            return False  # a long job shows RUNNING while it runs
        if item.worker_id != self.worker_id or self._session_ended \
                or not self.client.connected:
            return False
        with self._cond:
            return (self._listed == {item.job_id} and self._running.keys() == {item.job_id}
                    and not self._moved and not self._held and not self._paused)

    def _execute(self, item: _Queued, begun) -> bool:
        """Run a job whose start was handed to the committer; True if its outcome was."""
        run = self._ready_to_run(item, begun)
        if run is None:
            return False
        return self._execute_run(item, run)

    def _execute_run(self, item: _Queued, run: _Run) -> bool:
        """Run a job whose start is recorded; True if its outcome went to the committer."""
        with self._slots:  # a lookahead runner waits here for a free slot
            # Again once a slot is ours: the wait can be long (all slots on long jobs),
            # and nothing else stops a job that is on no slot yet when the session ends.
            if self._identity_lost(item):
                return False
            began = time.monotonic()
            outcome = self.runner.run(run.execution)
            took = time.monotonic() - began
        return self._settle(item, run, outcome, took)

    def _ready_runs(self, begun: list) -> list[tuple[_Queued, _Run]]:
        """The jobs of a batch whose starts are recorded, each once its own is."""
        runs = []
        for item, started in begun:
            run = None if started is None else self._guarded(item, self._ready_to_run, item,
                                                             started)
            if run is not None:
                runs.append((item, run))
        return runs

    def _execute_in_turn(self, begun: list, gone: set[str]) -> set[str]:
        """Thread pool: run a batch of short jobs (started together) in turn on this
        runner's thread; return the ids whose outcomes were handed on. One that runs past
        BATCH_PATIENCE_S leaves the rest to other runners (_take_overdue), whose ids go
        in `gone`."""
        runs = self._ready_runs(begun)
        handed_over: set[str] = set()
        held = _Held(collections.deque(runs), time.monotonic(), gone)
        if self.concurrency > 1:  # else no other slot to run them on
            with self._cond:
                self._held.append(held)
        try:
            while not self._stopping.is_set():  # a forced stop: the rest stay assigned
                with self._cond:
                    if not held.rest:
                        break
                    item, run = held.rest.popleft()
                    held.since = time.monotonic()
                if self._guarded(item, self._execute_run, item, run, held=True):
                    handed_over.add(item.job_id)
        finally:
            with self._cond:
                if held in self._held:
                    self._held.remove(held)
        return handed_over

    def _execute_batch(self, begun: list, gone: set[str]) -> set[str]:
        """Run a batch of short jobs (started together) through one task process in one
        hand-off (ProcessRunner.run_many); return the ids whose outcomes were handed on.

        Each job is settled as soon as its outcome comes, while the task process runs
        the next; a step that fails touches only its own job. Jobs held up behind a long
        one are taken back and queued for any runner (_moved); their ids go in `gone`,
        and another runner lets go of them.
        """
        runs = self._ready_runs(begun)
        handed_over: set[str] = set()
        if not runs or self._stopping.is_set():
            return handed_over  # a forced stop: they stay assigned, as in _runner_loop
        by_id = {run.execution.job_id: (item, run) for item, run in runs}
        mine: list[tuple[_Queued, _Run]] = []

        def taken_back(executions) -> None:
            moved = [by_id[execution.job_id] for execution in executions]
            with self._cond:
                mine.extend(moved)
                self._move(moved, gone)

        with self._slots:
            outcomes = self.runner.run_many([run.execution for _, run in runs],
                                            on_taken_back=taken_back)
            try:
                began = time.monotonic()
                for (item, run), outcome in zip(runs, outcomes, strict=True):
                    took, began = time.monotonic() - began, time.monotonic()
                    if outcome is TAKEN_BACK:
                        continue
                    if self._guarded(item, self._settle, item, run, outcome, took,
                                     more=item is not runs[-1][0], held=True):
                        handed_over.add(item.job_id)
                    if self._stopping.is_set():
                        # A forced stop: the rest stay assigned, RUNNING; the leader
                        # hands them back once our session ends (at-least-once).
                        break
            finally:
                outcomes.close()
        # Those no other runner has taken up yet (all were busy, or stopped by a drain)
        # run here, as they would have without the take-back.
        while True:
            with self._cond:
                # By identity: _Queued compares by its sort key alone.
                index = next((i for i, m in enumerate(self._moved)
                              if any(m is own for own in mine)), None)
                if index is None:
                    break
                left = self._moved[index]
                del self._moved[index]
            self._run_moved(*left)
        return handed_over

    def _identity_lost(self, item: _Queued) -> bool:
        """Whether the session of the identity that started a job waiting to run has
        ended: then it does not run here, and the leader hands it back (rule 3)."""
        if self._session_ended or item.worker_id != self.worker_id:
            logger.warning("job not run: worker=%s lost its session while the job waited "
                           "job=%s; it will be handed back", item.worker_id, item.job_id)
            return True
        return False

    def _run_moved(self, item: _Queued, run: _Run) -> None:
        """Run a job taken back from a held-up batch: its start is recorded, and it is
        still in _running and known, under the identity that started it."""
        handed_over: set[str] = set()
        try:
            if self._stopping.is_set():
                return  # a forced stop: it stays assigned, RUNNING (at-least-once)
            # _execute_run runs it only if its identity's session has not ended.
            if self._guarded(item, self._execute_run, item, run, held=True):
                handed_over.add(item.job_id)
        finally:
            self._let_go([item], handed_over)

    def _ready_to_run(self, item: _Queued, begun) -> _Run | None:
        """Wait for the job's start to be recorded; None if it was refused (not ours)."""
        job_id, worker_id = item.job_id, item.worker_id
        blob, running, running_bytes, commit = begun
        with self._cond:
            backlog = bool(self._ready)
        # At low load this runner writes its start itself (committer.py); under a backlog
        # the committer thread batches it with other runners' starts.
        self.committer.wait_started(commit, write=not backlog)
        if commit.refused:
            return None  # taken back (cancelled, or we were presumed dead): not ours
        if self._session_ended or worker_id != self.worker_id:
            # Recorded, but on a session after the one that holds this identity (a
            # start cut off by the expiry and sent again on reconnection): the job had
            # not begun, and the leader hands it back now that the identity is gone.
            # Run here, it would run alongside that rerun (rule 3: start nothing new).
            logger.warning("job not started: worker=%s lost its session as its start "
                           "was recorded job=%s; it will be handed back", worker_id, job_id)
            return None
        # start=unwritten: held alone and short, it runs without its RUNNING write
        # (_unrecorded_start); its outcome records the attempt.
        logger.info("job started job=%s task=%s attempt=%d worker=%s%s", job_id, running.task,
                    running.attempts, worker_id, " start=unwritten" if commit.unrecorded else "")
        call = None
        if self._wants(task_started) or self._wants(task_finished):
            call = self._signal_call(blob, running)
        self._send(task_started, running, call)
        return _Run(blob, running, commit, call, Execution(
            job_id=job_id, blob=blob, record_json=running_bytes, timeout=running.timeout,
            attempt=running.attempts, takes_context=running.takes_context,
        ))

    def _settle(self, item: _Queued, run: _Run, outcome: Outcome, took: float, *,
                more: bool = False) -> bool:
        """Hand a job's outcome to the committer; True if it was (not left assigned).
        `more`: another job of the runner's batch comes next (the write may wait for
        company)."""
        job_id, worker_id = item.job_id, item.worker_id
        running, call = run.running, run.call
        average = self._run_avg  # runners race here: an approximate average is enough
        self._run_avg = average = took if average is None else 0.8 * average + 0.2 * took
        task_avg = self._task_avg
        before = task_avg.get(running.task)
        if before is None and len(task_avg) >= TASK_AVERAGES_MAX:
            task_avg.clear()  # many distinct tasks (by-value lambdas): start over
        task_avg[running.task] = took if before is None else 0.8 * before + 0.2 * took
        if (not self._prefetch_posted
                and self._prefetch.wanted(average, time.monotonic()) is not None):
            self._prefetch_posted = True
            self._events.put(("prefetch", None))
        if not outcome.ok and outcome.retry_delay is None and outcome.error.exception_class_path \
                in ("zktasks.exceptions.TaskTimeout", "zktasks.exceptions.TaskProcessDied"):
            # The task process could not decide (killed or gone): decide here, from the
            # policy alone (never the arguments: one may be what killed it).
            outcome = self._parent_side_retry(outcome, self._policy(run.blob, job_id),
                                              running.attempts)
        if self._stopping.is_set() and not outcome.ok:
            # Killed by a forced stop, not by its own doing: leave the assignment, so the
            # leader hands the job back once our session ends (at-least-once).
            logger.warning("job interrupted by stop job=%s; it will run again elsewhere",
                           job_id)
            return False
        if not outcome.ok and (self._lost or worker_id != self.worker_id):
            # Run under an identity whose session is gone, and asked to stop for that
            # (abandon_running): its failure says nothing about the job, which the leader
            # hands back. Recording it could still win the race against the hand-back
            # and fail a job nobody cancelled. A success is recorded: the work is done.
            logger.warning("outcome dropped job=%s worker=%s: the worker's session expired "
                           "during the run; the job runs again", job_id, worker_id)
            return False
        final, requeue = self._final_record(running, outcome, worker_id)
        with self._cond:  # a next job to start: let this outcome share its multi
            linger = more or (bool(self._ready) and not self._paused and not self._draining)
        with self._changes_lock:
            self._finishing.add(job_id)
        self.committer.finish(run.commit, final, requeue=requeue, linger=linger,
                              on_done=lambda ok: self._recorded(item, final, requeue, ok, call))
        return True

    def _wants(self, signal) -> bool:
        """Whether a receiver other than django.tasks' own log line listens.

        Django connects a logger to task_started/task_finished in every project; our own
        log lines ("job started", "job succeeded") say the same, so for that receiver
        alone a job is not loaded a second time in this process to build its result.
        """
        try:
            sync, asynchronous = signal._live_receivers(type(self.backend))
        except Exception:  # a private API of Django's: if it changes, send signals
            return signal.has_listeners(type(self.backend))
        return any(getattr(r, "__module__", None) != "django.tasks.signals"
                   for r in (*sync, *asynchronous))

    def _recorded(self, item: _Queued, final: StatusRecord, requeue: bool, ok: bool,
                  call) -> None:
        """The committer settled a job's outcome (on its thread): log, signal, forget."""
        with self._cond:
            # Forgotten first: an assignment of it made again from here on is read as
            # new. _changes_lock inside _cond here only (nowhere the other way round).
            self._forget(item)
            with self._changes_lock:
                self._finishing.discard(item.job_id)
                reassigned = item.job_id in self._reassigned
                self._reassigned.discard(item.job_id)
            if ok and not reassigned and item.worker_id == self.worker_id:
                # Our multi deleted the assignment, and the watch does not report our
                # own deletions; an event of its assignment made again comes after this
                # (under _cond). Made again already, it stays until the whole list.
                self._listed.discard(item.job_id)
        if reassigned:
            self._relist = True  # now that it is forgotten, the list shows it as new
            self._events.put(("assignments", None))
        # No wake-up here: the committer is still busy with this batch, so a draining main
        # loop would find it pending; its on_idle wakes the loop once all is written.
        if ok:
            self._report(item, final, requeue, call)

    def _wake_if_draining(self, job_id: str | None) -> None:
        """Let a draining main loop see at once that a job is done, or that the committer
        has written everything (job_id None), so that it can exit.

        Not otherwise: the main loop has nothing to do for a finished job, and waking it
        twice per job cost a few percent of a busy worker's CPU. A drain that begins just
        after this check is seen by the main loop's own poll (every 0.2 s while draining).
        """
        if self._draining or self._stopping.is_set():
            self._events.put(("finished", job_id))

    def _finish(self, item: _Queued, running: StatusRecord, version: int, outcome: Outcome,
                *, call=None, dead_letter=None) -> None:
        """Record an outcome; `dead_letter(bytes of the record)` makes an entry written
        in the same multi."""
        worker_id, job_id = item.worker_id, item.job_id
        final, requeue = self._final_record(running, outcome, worker_id)
        if dead_letter is not None:
            dead_letter = dead_letter(len(final.to_bytes()))
        recorded = self.store.finish(worker_id, job_id, final, version, requeue=requeue,
                                     dead_letter=dead_letter)
        if recorded:
            self._report(item, final, requeue, call)

    def _report(self, item: _Queued, final: StatusRecord, requeue: bool, call) -> None:
        worker_id, job_id = item.worker_id, item.job_id
        self.completed += 1
        if requeue:
            logger.warning("job failed, will retry job=%s attempt=%d/%d error=%s", job_id,
                           final.attempts, final.max_attempts,
                           final.errors[-1].exception_class_path)
            return
        if final.state == records.SUCCESSFUL:
            logger.info("job succeeded job=%s task=%s worker=%s", job_id, final.task, worker_id)
        else:
            error = final.errors[-1] if final.errors else None
            logger.error("job failed job=%s task=%s worker=%s error=%s: %s%s", job_id,
                         final.task, worker_id, error and error.exception_class_path,
                         error and records.printable(error.message, one_line=True),
                         _traceback_block(error))
        self._send(task_finished, final, call)

    def _final_record(self, running: StatusRecord, outcome: Outcome, worker_id: str):
        """Return (record to write, whether the job goes back to pending for a retry)."""
        now = records.now()
        key = self.options.signing_key
        if outcome.ok:
            # In base64 (4/3) in the record: a value too large already is refused before
            # the envelope's and the JSON's copies, each as large again, in this process.
            size = len(outcome.value_blob) * 4 // 3
            if size <= self.options.max_record_bytes:
                final = running.evolve(
                    state=records.SUCCESSFUL, finished_at=now,
                    result=envelope.seal(outcome.value_blob, job_id=running.id,
                                         kind=envelope.RESULT, key=key),
                    result_repr=(None if outcome.value_repr is None
                                 else records.encodable(outcome.value_repr)),
                )
                size = len(final.to_bytes())
                if size <= self.options.max_record_bytes:
                    return final, False
            outcome = Outcome(ok=False, error=ErrorRecord.from_exception(PayloadTooLarge(
                f"The return value of job {running.id!r} makes its record {size:,} bytes "
                f"or more, over the {self.options.max_record_bytes:,} a znode may hold "
                "here; return a reference (a primary key, a file path) instead."
            )))
        error = outcome.error
        error = ErrorRecord(
            exception_class_path=error.exception_class_path, message=error.message,
            traceback=error.traceback, attempt=running.attempts, worker_id=worker_id,
        )
        errors = running.errors + (error,)
        limit = self.options.max_record_bytes
        if outcome.retry_delay is not None and running.attempts < running.max_attempts:
            due = now + timedelta(seconds=outcome.retry_delay)
            # retry_at, not run_after: that is the task's own, which TaskResult.task shows.
            return running.evolve(state=records.READY, errors=errors, retry_at=due).fit(
                limit), True
        return running.evolve(state=records.FAILED, finished_at=now, errors=errors).fit(
            limit), False

    def _parent_side_retry(self, outcome: Outcome, policy, attempt: int) -> Outcome:
        from . import exceptions
        from .executor import retry_delay

        if policy is None:
            return outcome
        kind = getattr(exceptions, outcome.error.exception_class_path.rsplit(".", 1)[1])
        delay = retry_delay(policy, attempt, kind(outcome.error.message))
        return Outcome(ok=False, error=outcome.error, retry_delay=delay)

    def _fail_corrupt(self, worker_id: str, job_id: str, exc: Exception) -> None:
        """Keep a corrupt status record's bytes in the dead letters and fail the job.

        FAILED, not removed: whoever waits on the job (result.wait(), the dashboard) gets
        an answer that says why instead of "no such job", and the placeholder expires
        with RESULT_TTL like any result. One multi: the placeholder over the corrupt
        bytes (at the version read), the index entry, our assignment deleted, the entry.
        """
        path = self.store.layout.status(job_id)
        try:
            raw, stat = self.store.retry(self.client.get, path)
        except NoNodeError:
            self._set_aside_orphan(worker_id, job_id)
            return
        record = StatusRecord(
            id=job_id, task="(unknown)", backend=self.backend.alias, queue="(unknown)",
            priority=0, state=records.FAILED, finished_at=records.now(),
            errors=(ErrorRecord.from_exception(exc, worker_id=worker_id),),
        )
        note = deadletter.entry(self.store, path, raw, kind="corrupt_status", reason=str(exc),
                                by=worker_id, job_id=job_id)
        if self.store.finish(worker_id, job_id, record, stat.version, dead_letter=note):
            logger.error("corrupt status record job=%s: %s; job failed, its bytes moved "
                         "aside to %s", job_id, exc, note[0])
        else:
            logger.info("corrupt status record changed meanwhile job=%s; read again later",
                        job_id)

    def _set_aside_orphan(self, worker_id: str, job_id: str) -> None:
        """Move an assignment whose job has no status record to the dead letters."""
        path = self.store.layout.assignment(worker_id, job_id)
        try:
            raw, stat = self.store.retry(self.client.get, path)
        except NoNodeError:
            return
        entry, failed = deadletter.move_aside(
            self.store, path, raw, stat.version, kind="no_status", job_id=job_id,
            by=worker_id, reason=f"Job {job_id} was assigned to {worker_id} but has no "
                                 "status record (never submitted through zktasks, or deleted).")
        if failed:
            logger.info("assignment without status not moved job=%s: %s", job_id, failed)
        else:
            logger.error("assignment without status record job=%s worker=%s; moved aside "
                         "to %s", job_id, worker_id, entry)

    @property
    def _isolated(self) -> bool:
        """Whether jobs run in task processes: then this process unpickles none of
        their arguments or values (_signal_call)."""
        return isinstance(self.runner, ProcessRunner)

    def _signal_call(self, blob: bytes, record: StatusRecord):
        """The call for the results that signals carry; None if it cannot be loaded here
        (its code is importable only in task processes, say): the job still runs there,
        and Django's log line still goes.

        With task processes, this process never unpickles a job's arguments
        (serialization.peek_call): one whose unpickling crashes or hangs (an extension
        built for another ABI, a __setstate__ that waits) must cost its task process, not
        the worker and every job it holds. In the thread pool the job runs here anyway.
        """
        try:
            if self._isolated:
                return serialization.peek_call(blob, record.task)
            return serialization.load_call(blob)
        except Exception:
            logger.warning("call not loadable in the worker process job=%s; signals skipped",
                           record.id, exc_info=True)
            return None

    def _policy(self, blob: bytes, job_id: str):
        """The job's retry policy, read apart from its arguments; None (no retry) if it
        cannot be loaded here."""
        try:
            policy = serialization.load_policy(blob)
            if policy is None:  # bytes from before the policy travelled apart
                policy = serialization.load_call(blob).policy
            return policy
        except Exception:
            logger.warning("retry policy not loadable in the worker process job=%s; not "
                           "retried", job_id, exc_info=True)
            return None

    def _leader_failed(self, record: StatusRecord) -> None:
        """task_finished for a job this worker's leader failed itself, its workers having
        kept vanishing (Store.requeue): no worker records that outcome, so none sent it.
        On a thread of its own, so that loading the call and the receivers never hold up
        the leader's assignments."""
        def send():
            call = None
            if self._wants(task_finished):
                try:
                    blob = envelope.open_envelope(record.payload, job_id=record.id,
                                                  kind=envelope.PAYLOAD,
                                                  keys=self.options.verify_keys)
                except PayloadVerificationError:
                    blob = None  # never loaded unverified; Django's log line still goes
                if blob is not None:
                    call = self._signal_call(blob, record)
            self._send(task_finished, record, call)

        threading.Thread(target=send, name="zktasks-failed-job-signal", daemon=True).start()

    def _send(self, signal, record: StatusRecord, call) -> None:
        """Send a django.tasks signal after the state it reports was recorded."""
        if call is None:
            _log_as_django(signal, record)
            return
        try:
            task = self.backend._task_for(record, call.func, call.policy)
            # A return value is read as the arguments are (_signal_call), with task
            # processes: one that crashes as it loads must not take the worker with it.
            result = self.backend.build_result(record, task=task, args=list(call.args),
                                               kwargs=dict(call.kwargs),
                                               peek=self._isolated)
            signal.send(type(self.backend), task_result=result)
        except Exception:
            # A receiver's error must not change a recorded outcome.
            logger.exception("signal receiver failed job=%s", record.id)


_django_logger = logging.getLogger("django.tasks")
TRACEBACK_LOG_MAX = 8000  # characters of a failure's traceback in its log record (the end)


def _traceback_block(error) -> str:
    """The recorded traceback, for the failure's log record: what Celery and RQ log, and
    what a log aggregator (Sentry's logging integration) shows. Each line is indented
    behind "| ", so a message that holds newlines cannot pass for log lines of its own."""
    text = (error.traceback if error is not None else "") or ""
    text = text.rstrip()
    if not text:
        return ""
    if len(text) > TRACEBACK_LOG_MAX:
        text = "…" + text[-TRACEBACK_LOG_MAX:]
    return "".join(f"\n  | {records.printable(line)}" for line in text.splitlines())


def _log_as_django(signal, record: StatusRecord) -> None:
    """Django's own receivers' line ("Task id=... path=... state=..."), from the record.

    With no other receiver the signal is not sent (_wants), but a project may watch the
    django.tasks logger (a failure is logged at ERROR there): it gets the line all the
    same, unless the logger would drop it, which most projects' INFO lines are.
    """
    failed = signal is task_finished and record.state == records.FAILED
    level = logging.ERROR if failed else logging.INFO
    if _django_logger.isEnabledFor(level):
        _django_logger.log(level, "Task id=%s path=%s state=%s", record.id, record.task,
                           TaskResultStatus(record.state))


__all__ = ["Worker"]
