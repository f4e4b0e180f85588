"""Group commit of a worker's writes: the starts and outcomes of many jobs in one multi.

Recording RUNNING and then the outcome as two transactions per job, each waited for by
the runner thread, cost a worker four round trips per job. Here runner threads hand
their writes to one committer thread:

* A start is written at once, and the runner waits for it: a job never runs before its
  attempt is recorded (so `attempts` counts every run, and nothing starts while
  ZooKeeper is out of reach). The exception is a short job the worker holds alone
  (`begin_unrecorded`, worker.UNRECORDED_START_MAX_S): its outcome records the attempt,
  and should the worker die, the leader counts it.
* An outcome is not waited for: the runner takes its next job while it is written. When
  the runner has a next job, the outcome lingers until that job's start comes, so one
  multi records the end of one job and the start of the next; under a backlog the writes
  of all runner threads share a multi (group commit, as databases do it).

Each job's ops keep the fences of Store.start/finish: its assignment znode must still be
there and the status version must be the one this worker read (or wrote). A multi is all
or nothing, so when one op of a batch fails the batch is committed again job by job, and
only the stale job's write is refused. Batches go one at a time, in order. kazoo has no
recipe for this; it is the store's own `transaction()`, batched.

Who writes a batch: the committer thread, or, when it has nothing in hand, the runner
that waits for a start (`wait_started`) writes what is waiting itself, on its own
thread. At low load that saves two thread hand-offs per job (waking the committer, and
its waking the runner back), and the batch is the same one the thread would have taken.
A start queued while someone else writes is taken by the committer thread afterwards.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from . import records
from .exceptions import ZooKeeperUnavailableError
from .latch import Latch
from .records import StatusRecord
from .store import LANDED, Store, failures

logger = logging.getLogger(__name__)

LINGER = 0.005             # seconds an outcome may wait for the next start to share a multi
# A job begun without its RUNNING write (begin_unrecorded) that is still running this
# long after has it written then: a task that ran short so far and now runs long shows
# RUNNING after a tenth of a second, not READY to its end.
LATE_START = 0.1
MAX_BATCH_BYTES = 512_000  # well under jute.maxbuffer (1 MB) for the whole request
MAX_BATCH_JOBS = 200
# begin() queues a start without waking the committer thread (its runner writes it in
# wait_started); the thread still looks this often, so a start is never left unwritten.
TICK = 0.1


@dataclass(slots=True, eq=False)
class Commit:
    """One job's writes, as the committer tracks them."""

    worker_id: str
    job_id: str
    version: int                       # the status version the next write must match
    start: bytes | None = None         # RUNNING record not written yet
    due: float = 0.0                   # when it must be written at the latest
    started: Latch = field(default_factory=Latch)  # an Event, cheaper (latch.py)
    refused: bool = False              # its start was refused: the job is not ours
    final: StatusRecord | None = None
    finished: bool = False             # its outcome is settled (written or dropped)
    requeue: bool = False
    unrecorded: bool = False           # runs without its RUNNING write (begin_unrecorded)
    late_start: bytes | None = None    # ... the RUNNING record, written if it runs long
    on_done: Callable[[bool], None] | None = None
    _final_ops: tuple | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class _Op:
    commit: Commit
    kind: str          # "start" or "finish"
    data: bytes
    version: int
    creates: tuple[str, ...] = ()
    deletes: tuple[str, ...] = ()


class Committer:
    """Batch the start and finish writes of one worker's jobs; one thread commits."""

    def __init__(self, store: Store, *, on_idle: Callable[[], None] | None = None):
        self.store = store
        # Called (on the committer's thread) when a batch is done and nothing waits: a
        # draining worker exits once its last outcome is written, not on its next poll.
        self.on_idle = on_idle
        self.layout = store.layout
        self._cond = threading.Condition()
        self._waiting: dict[int, Commit] = {}  # insertion-ordered; keyed by id(commit)
        # Jobs begun unrecorded, still running: their RUNNING is due LATE_START after.
        self._unrecorded: dict[int, Commit] = {}
        self._busy = False
        self._closing = False
        self._abandoned = False
        self._thread: threading.Thread | None = None
        self.transactions = 0

    # -- runner threads ----------------------------------------------------------------

    def begin(self, worker_id: str, job_id: str, running: bytes, version: int) -> Commit:
        """Queue the RUNNING record of a job about to run; return the job's handle.

        Wait on `handle.started` before running the job (a runner queues a batch's starts
        first, so they share a multi); then `handle.refused` means the assignment is not
        ours any more (taken back, or our session ended): do not run the job.
        """
        commit = Commit(worker_id, job_id, version, start=running, due=time.monotonic())
        with self._cond:
            self._waiting[id(commit)] = commit
            # No wake-up: the runner writes it in wait_started() if the committer is
            # idle; a writer that is busy (thread or runner) has it taken next.
        return commit

    def begin_unrecorded(self, worker_id: str, job_id: str, running: bytes,
                         version: int) -> Commit:
        """The handle of a job that runs without its RUNNING write (the worker's
        _unrecorded_start): started already; its outcome, written at `version` (the
        one read), records the attempt. Should it still run LATE_START from now, its
        RUNNING record is written then after all (fenced as any start), and the
        outcome after it."""
        commit = Commit(worker_id, job_id, version, unrecorded=True, late_start=running,
                        due=time.monotonic() + LATE_START)
        commit.started.set()
        with self._cond:
            self._unrecorded[id(commit)] = commit
            if LATE_START <= 0:
                self._cond.notify()  # due now (tests set it so); else its TICK will do
        return commit

    def wait_started(self, commit: Commit, timeout: float | None = None, *,
                     write: bool = True) -> bool:
        """Wait until `commit`'s start is settled (then see `commit.refused`); False if
        `timeout` passed first.

        With `write`, if nothing is being written, write what is waiting (this start,
        and whatever shares its multi) on the caller's thread; otherwise the writer in
        hand, or the committer thread after it, writes it. A caller with more work queued
        passes write=False: then the committer thread, woken here, gathers other
        runners' starts into the multi (measured: under a backlog, writing on the runner
        made more, smaller multis and more thread switches per job).
        """
        if not write:
            with self._cond:
                if id(commit) in self._waiting:
                    self._cond.notify()
        elif not commit.started.is_set():
            batch = None
            with self._cond:
                if not (self._busy or self._closing or self._abandoned) \
                        and id(commit) in self._waiting:
                    batch = self._take()
                    self._busy = bool(batch)
            if batch:
                self._write(batch)
        return commit.started.wait(timeout)

    def finish(self, commit: Commit, final: StatusRecord, *, requeue: bool,
               on_done: Callable[[bool], None], linger: bool = False) -> None:
        """Queue the outcome of a started job; `on_done(recorded)` is called once settled.

        With `linger`, the write waits up to LINGER seconds for company (the caller is
        about to start another job); otherwise it goes at once.
        """
        # Its paths may need ZooKeeper (the index bucket, the unique key's holder): work
        # them out here, on the runner's thread, never under the lock runners wait on.
        try:
            ops = self._final_ops(final, requeue)
        except (ZooKeeperUnavailableError, KazooException):
            ops = None  # ZooKeeper is away: the committer works them out (_prepare)
        with self._cond:
            commit._final_ops = ops
            commit.final, commit.requeue, commit.on_done = final, requeue, on_done
            commit.due = time.monotonic() + (LINGER if linger else 0.0)
            if self._unrecorded.pop(id(commit), None) is None and commit.start is not None:
                # Its late RUNNING write is queued or on its way. Queued: the outcome
                # goes instead. On its way: the outcome follows once it is settled
                # (_settle queues it), at the version that write leaves.
                if id(commit) not in self._waiting:
                    return
                commit.start = None
            self._waiting[id(commit)] = commit
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._waiting) + (1 if self._busy else 0)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="zktasks-committer",
                                        daemon=True)
        self._thread.start()

    def close(self, timeout: float) -> bool:
        """Write everything waiting, then stop; return True if nothing was left."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            self._abandoned = True  # the thread gives up at its next turn
            left = len(self._waiting)
            for commit in self._waiting.values():
                commit.refused = commit.start is not None or commit.refused
                commit.started.set()  # never leave a runner thread waiting
        if left:
            logger.warning("%d job write(s) not recorded at exit; the leader hands those "
                           "jobs back once this worker's session ends", left)
        return left == 0

    # -- the committer thread ----------------------------------------------------------

    def _loop(self) -> None:
        while not self._abandoned:
            try:
                if not self._turn():
                    return
            except Exception:
                # Runners wait on this thread's latches without a timeout: it must not
                # die. What it held is back in _waiting (_write) for the next turn.
                logger.exception("committer thread error; going on")
                time.sleep(0.5)

    def _turn(self) -> bool:
        """One pass of the committer thread; False when it is to end."""
        if not self._prepare():
            time.sleep(0.5)  # ZooKeeper is away: the retries gave up; go round again
            return True
        with self._cond:
            if self._abandoned:
                return False
            if self._busy:  # a runner writes a batch (wait_started): one at a time
                self._cond.wait()
                return True
            batch = self._take()
            if not batch:
                if self._closing and not self._waiting:
                    return False
                if not self._unprepared():
                    self._cond.wait(self._wait_time())
                return True
            self._busy = True
        if not self._write(batch):
            time.sleep(0.5)
        return True

    def _write(self, batch: list[_Op]) -> bool:
        """Flush a batch taken with _busy set, on whichever thread took it; then let the
        next writer go. False if it failed unexpectedly (its writes are queued again)."""
        ok = True
        try:
            self._flush(batch)
        except Exception:
            # Never lose a write: put back what is not settled yet (a batch retried job
            # by job may have settled some), and the committer thread tries again.
            logger.exception("committer failed; retrying")
            self._put_back([op for op in batch if not self._settled(op)])
            ok = False
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()  # the committer thread takes what came meanwhile
                idle = not self._waiting
            if idle and self.on_idle is not None:
                try:
                    self.on_idle()
                except Exception:
                    logger.exception("on_idle callback failed")
        return ok

    @staticmethod
    def _settled(op: _Op) -> bool:
        return op.commit.start is None if op.kind == "start" else op.commit.finished

    def _unprepared(self) -> list[Commit]:
        return [c for c in self._waiting.values()
                if c.start is None and c._final_ops is None]

    def _prepare(self) -> bool:
        """Work out the ops of outcomes that lack them, outside the lock (they may read
        or create znodes); False if ZooKeeper could not be reached."""
        with self._cond:
            todo = self._unprepared()
        for commit in todo:
            try:
                ops = self._final_ops(commit.final, commit.requeue)
            except (ZooKeeperUnavailableError, KazooException) as exc:
                logger.warning("could not prepare job=%s: %r; retrying", commit.job_id, exc)
                return False
            with self._cond:
                commit._final_ops = ops
        return True

    def _wait_time(self) -> float:
        dues = [c.due for c in self._waiting.values()]
        dues += [c.due for c in self._unrecorded.values()]
        if not dues:
            return TICK
        return max(0.0, min(dues) - time.monotonic())

    def _take(self) -> list[_Op]:
        """Under the lock: if anything is due, snapshot everything waiting (up to the
        batch limits): writes that are not due yet ride along for free."""
        now = time.monotonic()
        for key, commit in list(self._unrecorded.items()):
            if commit.due <= now:  # still running: its RUNNING is written after all
                del self._unrecorded[key]
                commit.start = commit.late_start
                self._waiting[key] = commit
        if not self._closing and not any(c.due <= now for c in self._waiting.values()):
            return []
        ops: list[_Op] = []
        size = 0
        for key, commit in list(self._waiting.items()):
            if commit.start is None and commit._final_ops is None:
                continue  # _prepare works it out first, outside the lock
            op = self._op(commit)
            # Checked before adding: two large records (a RUNNING record holds its
            # payload) could otherwise make one request over jute.maxbuffer, which the
            # server answers by dropping the connection, again at every retry.
            if ops and (size + len(op.data) > MAX_BATCH_BYTES or len(ops) >= MAX_BATCH_JOBS):
                break
            ops.append(op)
            size += len(op.data)
            del self._waiting[key]
        return ops

    def _op(self, commit: Commit) -> _Op:
        if commit.start is not None:
            return _Op(commit, "start", commit.start, commit.version)
        data, creates, deletes = commit._final_ops
        return _Op(commit, "finish", data, commit.version, creates, deletes)

    def _final_ops(self, final: StatusRecord, requeue: bool, *,
                   bucket_in_multi: bool = True) -> tuple:
        """(record bytes, (path, data) to create, paths to delete) of an outcome.

        The finished index's bucket for the outcome's second, when missing, is created
        by the same multi, ahead of the entry (Store.index_entry); with
        `bucket_in_multi` False it is made apart first (Store.index_path, whatever the
        cache says), as when the multi met NoNode on it (its parent bucket missing, or
        expired meanwhile) or NodeExists (made meanwhile, perhaps only its parent)."""
        creates = []
        if requeue:
            creates.append((self.store.waiting_path(final),
                            records.dumps({"id": final.id, "task": final.task})))
        deletes = []
        if final.is_finished:
            if bucket_in_multi:
                entry, buckets = self.store.index_entry(final)
                creates.extend((bucket, b"") for bucket in buckets)
            else:
                entry = self.store.index_path(final, fresh=True)
            creates.append((entry, b""))
            deletes.extend(self.store.cleanup_paths(final))
        return final.to_bytes(), tuple(creates), tuple(deletes)

    def _build(self, ops: list[_Op]):
        def build(txn):
            for op in ops:
                c = op.commit
                assignment = self.layout.assignment(c.worker_id, c.job_id)
                status = self.layout.status(c.job_id)
                if op.kind == "start":
                    txn.check(assignment, -1)
                    txn.set_data(status, op.data, version=op.version)
                    continue
                txn.delete(assignment)
                txn.set_data(status, op.data, version=op.version)
                for path, data in op.creates:
                    txn.create(path, data)
                for path in op.deletes:
                    txn.delete(path)
        return build

    def _flush(self, ops: list[_Op], *, again: bool = False) -> None:
        first = ops[0]
        first_status = self.layout.status(first.commit.job_id)
        try:
            results = self.store.commit(
                self._build(ops),
                landed=lambda: self.store._written(first_status, first.data),
                # Retried jobs go back to pending or delayed: their shard may have to be
                # made.
                waiting=[path for op in ops for path, _ in op.creates
                         if path.startswith((self.layout.jobs + "/",
                                             self.layout.delayed + "/"))],
            )
        except (ZooKeeperUnavailableError, KazooException) as exc:
            logger.warning("could not record %d job write(s): %r; retrying", len(ops), exc)
            self._resolve(ops, first_status, first.data)
            return
        self.transactions += 1
        if results is LANDED or not failures(results):
            for op in ops:
                self._settle(op, True)
            return
        if len(ops) == 1:
            op, failed = ops[0], failures(results)
            if op.kind == "finish" and not again and self._bucket_gone(op, failed):
                # Its finished-index bucket expired or was purged since we made it, or
                # its parent is missing: make it apart (index_path) and try once more.
                op.commit._final_ops = self._final_ops(op.commit.final, op.commit.requeue,
                                                       bucket_in_multi=False)
                self._flush([self._op(op.commit)], again=True)
                return
            if op.kind == "finish" and not again and self._bucket_made_meanwhile(op, failed):
                # Someone made the bucket, or only its parent, since our read (the parent
                # holds every second of a bucket: another second's outcome makes it).
                # The leaf is noted as made here but may not be: made apart (index_path,
                # one create, NodeExists if it is there), then the multi goes again.
                # Recomputed from the cache instead, the entry met NoNode on the leaf
                # and the outcome was dropped (seen under the two-process suite).
                op.commit._final_ops = self._final_ops(op.commit.final, op.commit.requeue,
                                                       bucket_in_multi=False)
                self._flush([self._op(op.commit)], again=True)
                return
            self._settle(op, False, failed)
            return
        for op in ops:  # find the stale job: one multi each
            self._flush([op])

    def _index_creates(self, op: _Op) -> list[str]:
        """The finished-index paths an outcome creates: [[parent,] bucket,] entry."""
        return [path for path, _ in op.creates if path.startswith(self.layout.finished + "/")]

    def _bucket_gone(self, op: _Op, failed) -> bool:
        """Whether an outcome that creates an index entry met NoNode: its bucket may be
        missing (expired, purged, or to be made by a multi of ours that failed or has
        not gone yet). Then it is forgotten, to be made apart (index_path) for one more
        try. Asking exists() here instead, as Store.forget_bucket_if_gone does, was
        wrong once buckets ride in multis: another worker could make it in between, and
        the outcome was dropped. A NoNode of another op (the assignment taken back)
        costs that one more try."""
        index = self._index_creates(op)
        if not index or not any(isinstance(exc, NoNodeError) for _, exc in failed):
            return False
        self.store.forget_bucket(index[-1])
        return True

    def _bucket_made_meanwhile(self, op: _Op, failed) -> bool:
        return len(self._index_creates(op)) >= 2 and any(
            isinstance(exc, NodeExistsError) for _, exc in failed)

    def _resolve(self, ops: list[_Op], first_status: str, first_data: bytes) -> None:
        """After an error the batch may or may not have landed (rule 4): read, then
        settle it or queue it again. A multi is atomic, so its first write tells."""
        while True:
            try:
                landed = self.store.retry(self.store._written, first_status, first_data)
                break
            except (ZooKeeperUnavailableError, KazooException):
                if self._closing:
                    self._put_back(ops)
                    return
                time.sleep(0.5)
        if landed:
            for op in ops:
                self._settle(op, True)
        else:
            self._put_back(ops)

    def _put_back(self, ops: list[_Op]) -> None:
        with self._cond:
            for op in ops:
                self._waiting[id(op.commit)] = op.commit

    def _settle(self, op: _Op, ok: bool, reason=None) -> None:
        c = op.commit
        if op.kind == "start":
            with self._cond:
                c.start = None
                if ok:
                    c.version = op.version + 1
                else:
                    c.refused = True
                    logger.info("start refused job=%s worker=%s errors=%s", c.job_id,
                                c.worker_id, reason)
                if c.final is not None and not c.finished:
                    # A late RUNNING write (begin_unrecorded), and the job ended while
                    # it was on its way: its outcome now, at the version it left.
                    self._waiting[id(c)] = c
                    self._cond.notify()
            c.started.set()
            return
        c.finished = True
        if not ok:
            logger.warning("outcome dropped job=%s worker=%s reason=%s", c.job_id,
                           c.worker_id, reason)
        try:
            c.on_done(ok)
        except Exception:
            logger.exception("callback failed job=%s", c.job_id)
