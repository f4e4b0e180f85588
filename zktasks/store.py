"""Read and write jobs, assignments and status records; every transition is one multi.

Rule 1 of the contract: submit, assign, start, complete and reassign are each a single
transaction, so a crash at any instant leaves a job in exactly one place. kazoo's
`commit()` does not raise on a failed op: every result list is inspected here.
After a connection loss a multi's outcome is unknown (rule 4); callers pass `landed` to
tell, from a fresh read, whether it already took effect before it is tried again.
"""

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)

from . import records
from .conf import Options
from .exceptions import PayloadTooLarge, ZooKeeperUnavailableError
from .records import StatusRecord
from .tree import (
    BUCKET_MS,
    Layout,
    delayed_node_name,
    finished_bucket,
    finished_entry,
    job_node_name,
    parse_finished_entry,
)

logger = logging.getLogger(__name__)

TRANSIENT = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)
WORKER_LOST = "zktasks.exceptions.WorkerLost"
MAX_WORKER_LOSSES = 3  # a job whose workers vanished this often is failed, not re-run
LANDED = object()
SHARD_ROUNDS = 8  # resends of a multi whose shard the leader deleted meanwhile
# A submit_many multi stays well under jute.maxbuffer (1 MB by default, the whole
# request): bytes of data and paths, and a bound on ops per multi.
BULK_BYTES = 512_000
BULK_JOBS = 500


def failures(results) -> list[tuple[int, Exception]]:
    """Return (index, error) of the ops that failed in a multi, ignoring roll-backs."""
    if results is LANDED:
        return []
    return [
        (i, r) for i, r in enumerate(results)
        if isinstance(r, Exception) and not isinstance(r, RolledBackError)
    ]


@dataclass(frozen=True, slots=True)
class Versioned:
    record: StatusRecord
    version: int


class Store:
    """The zktasks tree below one ROOT, seen through one client."""

    def __init__(self, client, options: Options):
        self.client = client
        self.options = options
        self.layout = Layout(options.root)
        self._queues_made: set[str] = set()
        self._buckets_made: set[str] = set()
        self._skeleton_made = False

    # -- plumbing ------------------------------------------------------------------

    def retry(self, func: Callable, *args, deadline: float | None = None, **kwargs):
        """Call func, retrying transient errors until `deadline` seconds have passed."""
        limit = time.monotonic() + (deadline if deadline is not None
                                    else self.options.session_timeout)
        delay = 0.02
        tries = 0
        while True:
            try:
                return func(*args, **kwargs)
            except TRANSIENT as exc:
                tries += 1
                # At least a few tries, however late: a process frozen (SIGSTOP, a long
                # pause) past the deadline must not give up on its first error.
                if tries >= 4 and time.monotonic() + delay > limit:
                    raise ZooKeeperUnavailableError(
                        f"ZooKeeper at {self.options.hosts!r} did not answer within "
                        f"{self.options.session_timeout:g}s ({type(exc).__name__}); check "
                        "that the ensemble is up and reachable."
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def commit(self, build: Callable, *, landed: Callable[[], bool] | None = None,
               deadline: float | None = None, waiting: Iterable[str] = ()):
        """Commit the multi `build(txn)` fills; return its results, or LANDED.

        On connection loss the outcome is unknown: once reconnected, `landed()` reads the
        tree to tell whether the earlier attempt took effect, and only if not is the
        multi sent again. `waiting` names the pending-job paths the multi creates: when
        their shard is missing it is made and the multi sent again (see `with_shards`).
        """
        return self.with_shards(lambda: self._commit_once(build, landed, deadline), waiting)

    def with_shards(self, send: Callable, waiting: Iterable[str] = ()):
        """Send a multi that creates pending jobs; make their missing shards and resend.

        Shards are made lazily (a submitter does not pay an exists() per job) and deleted
        by the leader once empty, so a job create can meet NoNode: the multi then wrote
        nothing, the shards are created (NodeExists is fine) and the multi is sent again.
        If the leader deletes a shard again in between, we go round again; only when no
        shard was missing is the NoNode someone else's (the caller's) to explain.
        """
        waiting = list(waiting)
        for _ in range(SHARD_ROUNDS):
            results = send()
            failed = failures(results)
            if not (waiting and failed and isinstance(failed[0][1], NoNodeError)
                    and self.make_shards(waiting)):
                return results
        return results

    def make_shards(self, paths: Iterable[str]) -> bool:
        """Create the shards (and queues) of pending-job paths; True if one was missing."""
        made = False
        prefix = self.layout.jobs + "/"
        for shard in sorted({p.rsplit("/", 1)[0] for p in paths if p.startswith(prefix)}):
            if shard.count("/") - self.layout.jobs.count("/") != 2:
                continue  # an unsharded path (a queue's own child): nothing to make
            try:
                self.retry(self.client.create, shard, b"", makepath=True)
                made = True
            except NodeExistsError:
                pass
        return made

    def _commit_once(self, build, landed, deadline):
        uncertain = False

        def attempt():
            nonlocal uncertain
            if uncertain and landed is not None and landed():
                return LANDED
            txn = self.client.transaction()
            build(txn)
            uncertain = True
            results = txn.commit()
            uncertain = False
            return results

        return self.retry(attempt, deadline=deadline)

    def ensure_skeleton(self) -> None:
        if self._skeleton_made:
            return
        for path in self.layout.skeleton():
            self.retry(self.client.ensure_path, path)
        self._skeleton_made = True

    def ensure_queue(self, queue: str) -> None:
        if queue not in self._queues_made:
            self.ensure_skeleton()
            self.retry(self.client.ensure_path, self.layout.queue(queue))
            self._queues_made.add(queue)

    # -- submit --------------------------------------------------------------------

    def waiting_path(self, record: StatusRecord) -> str:
        """Where a READY job waits: jobs/{queue} when due, delayed/ until its run_after."""
        if record.run_after is not None and record.run_after > records.now():
            due_ms = int(record.run_after.timestamp() * 1000)
            return self.layout.delayed_job(
                delayed_node_name(due_ms, record.priority, record.id, record.queue))
        return self.layout.job(record.queue, job_node_name(record.priority, record.id))

    def submit(self, record: StatusRecord) -> str | None:
        """Create the status record and the waiting job in one multi (idempotent).

        With a unique key the same multi creates the key's znode: if another job holds
        the key, nothing is written and that job's id is returned (ZooKeeper's NodeExists
        decides the race between web processes). Otherwise return None.
        """
        status_path = self.layout.status(record.id)
        job_path = self.waiting_path(record)
        status_data = record.to_bytes()
        job_data = self.job_data(record)
        unique_path = self.layout.unique_key(record.unique_key) if record.unique_key else None
        self.check_size(record, len(status_data) + len(job_data))
        self.ensure_queue(record.queue)

        def build(txn):
            txn.create(status_path, status_data)
            txn.create(job_path, job_data)
            if unique_path:
                txn.create(unique_path, records.dumps({"job_id": record.id,
                                                       "key": record.unique_key}))

        def landed():
            # The id is fresh and random: a status node with it can only be ours.
            return self.client.exists(status_path) is not None

        for _ in range(5):
            results = self.commit(build, landed=landed, waiting=[job_path])
            failed = failures(results)
            if not failed:
                return None
            index, error = failed[0]
            if index == 0 and isinstance(error, NodeExistsError):
                return None  # an earlier attempt, cut off by connection loss, landed
            if index == 1 and isinstance(error, NoNodeError):
                # A parent vanished (an operator deleted delayed/ or the queue): make it.
                self._skeleton_made = False
                self._queues_made.discard(record.queue)
                self.ensure_queue(record.queue)
                continue
            if index == 2 and isinstance(error, NodeExistsError):
                try:
                    raw, _ = self.retry(self.client.get, unique_path)
                    return records.loads(raw, path=unique_path)["job_id"]
                except NoNodeError:
                    continue  # the holder finished meanwhile: try again
            raise error
        raise ZooKeeperUnavailableError(f"Could not create job {record.id!r}; try again.")

    @staticmethod
    def job_data(record: StatusRecord) -> bytes:
        return records.dumps({
            "id": record.id,
            "task": record.task,
            "enqueued_at": record.enqueued_at.isoformat() if record.enqueued_at else None,
        })

    def submit_many(self, batch: Iterable[StatusRecord]) -> int:
        """Create many jobs in batched multis; return how many multis were sent.

        Each multi creates whole jobs (status record + waiting node), so a crash between
        multis leaves some jobs submitted and the others not, never half a job. Multis
        stay under BULK_BYTES and BULK_JOBS. Unique keys are refused by the caller (a
        held key would fail the whole multi). Idempotent per multi on connection loss:
        the ids are fresh and random, so finding the first status record of a batch
        means the batch landed.
        """
        chunks: list[list[tuple[str, bytes, str, bytes]]] = [[]]
        size = 0
        for record in batch:
            if record.unique_key:
                raise ValueError("submit_many() does not take jobs with a unique key")
            status_data = record.to_bytes()
            job_data = self.job_data(record)
            self.check_size(record, len(status_data) + len(job_data))
            item = (self.layout.status(record.id), status_data, self.waiting_path(record),
                    job_data)
            cost = sum(len(part) for part in item) + 64  # paths, data, per-op framing
            if chunks[-1] and (size + cost > BULK_BYTES or len(chunks[-1]) >= BULK_JOBS):
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += cost
        chunks = [c for c in chunks if c]
        if not chunks:
            return 0
        self.ensure_skeleton()
        for chunk in chunks:
            self._submit_chunk(chunk)
        return len(chunks)

    def _submit_chunk(self, chunk) -> None:
        def build(txn):
            for status_path, status_data, job_path, job_data in chunk:
                txn.create(status_path, status_data)
                txn.create(job_path, job_data)

        def landed():
            return self.client.exists(chunk[0][0]) is not None

        waiting = [job_path for _, _, job_path, _ in chunk]
        for _ in range(5):
            results = self.commit(build, landed=landed, waiting=waiting)
            failed = failures(results)
            if not failed:
                return
            index, error = failed[0]
            if index % 2 == 1 and isinstance(error, NoNodeError):
                self._skeleton_made = False  # delayed/ or jobs/ vanished: make them again
                self.ensure_skeleton()
                continue
            raise error
        raise ZooKeeperUnavailableError(
            f"Could not create a batch of {len(chunk)} jobs; try again.")

    def check_size(self, record: StatusRecord, size: int) -> None:
        limit = self.options.max_record_bytes
        if size > limit:
            raise PayloadTooLarge(
                f"Task {record.task!r} cannot be submitted: its job is {size:,} bytes once "
                f"encoded, over the {limit:,} bytes a znode may hold here (ZooKeeper's "
                "jute.maxbuffer); pass a reference (a primary key, a file path) instead."
            )

    # -- reads ---------------------------------------------------------------------

    def read_status(self, job_id: str, watch=None) -> Versioned | None:
        path = self.layout.status(job_id)
        try:
            data, stat = self.retry(self.client.get, path, watch=watch)
        except NoNodeError:
            return None
        return Versioned(StatusRecord.from_bytes(data, path=path), stat.version)

    def children(self, path: str, watch=None) -> list[str]:
        try:
            return self.retry(self.client.get_children, path, watch=watch)
        except NoNodeError:
            return []

    # -- worker transitions ----------------------------------------------------------

    def start(self, worker_id: str, job_id: str, running: StatusRecord,
              version: int) -> int | None:
        """Record RUNNING if the assignment is still ours; return the new status version.

        The check on our assignment znode fences the write: a job taken back (worker
        presumed dead, job cancelled) is not started.
        """
        assignment = self.layout.assignment(worker_id, job_id)
        status_path = self.layout.status(job_id)
        data = running.to_bytes()

        def build(txn):
            txn.check(assignment, -1)
            txn.set_data(status_path, data, version=version)

        def landed():
            return self._written(status_path, data)

        results = self.commit(build, landed=landed)
        if results is LANDED:
            return version + 1
        if failures(results):
            logger.info("start refused job=%s worker=%s errors=%s", job_id, worker_id,
                        failures(results))
            return None
        return results[1].version

    def finish(self, worker_id: str, job_id: str, final: StatusRecord, version: int,
               *, requeue: bool = False) -> bool:
        """Record the outcome and delete our assignment in one multi.

        Fenced by the assignment znode (ours) and the status version (no newer attempt
        wrote since we started). With `requeue`, the job also goes back to wait (pending,
        or delayed until its run_after) in the same multi.
        Return False when the write was refused: the result is stale and dropped.
        """
        requeue_path = self.waiting_path(final) if requeue else None
        index_path = self.index_path(final) if final.is_finished else None
        assignment = self.layout.assignment(worker_id, job_id)
        status_path = self.layout.status(job_id)
        data = final.to_bytes()
        cleanup = self.cleanup_paths(final) if final.is_finished else []

        def build(txn):
            txn.delete(assignment)
            txn.set_data(status_path, data, version=version)
            if requeue_path:
                txn.create(requeue_path, records.dumps({"id": final.id, "task": final.task}))
            if index_path:
                txn.create(index_path, b"")
            for path in cleanup:
                txn.delete(path)

        def landed():
            return self._written(status_path, data)

        results = self.commit(build, landed=landed,
                              waiting=[requeue_path] if requeue_path else ())
        failed = failures(results)
        if failed:
            logger.warning("outcome dropped job=%s worker=%s reason=%s", job_id, worker_id,
                           failed)
            return False
        return True

    def cleanup_paths(self, record: StatusRecord) -> list[str]:
        """The unique-key znode of a finishing job, if it still holds this job.

        Deleted in the finishing multi, so the key is free exactly when the job is done.
        (Cancel requests are swept by the leader: checking for one here would cost every
        job a read.)
        """
        if not record.unique_key:
            return []
        path = self.layout.unique_key(record.unique_key)
        try:
            raw, _ = self.retry(self.client.get, path)
        except NoNodeError:
            return []
        holder = records.loads(raw, path=path).get("job_id")
        return [path] if holder == record.id else []

    # -- the finished index -----------------------------------------------------------

    def index_path(self, record: StatusRecord) -> str:
        """Return the finished-index entry of a finished record, making its bucket."""
        finished_ms = int(record.finished_at.timestamp() * 1000)
        bucket = finished_bucket(finished_ms)
        if bucket not in self._buckets_made:
            self.retry(self.client.ensure_path, self.layout.finished_bucket(bucket))
            self._buckets_made.add(bucket)
            if len(self._buckets_made) > 64:  # keep the cache small: buckets only grow
                self._buckets_made = {bucket}
        return self.layout.finished_entry(
            bucket, finished_entry(record.id, record.state, record.queue))

    def buckets(self) -> list[str]:
        """The finished index's buckets, oldest first."""
        return sorted(b for b in self.children(self.layout.finished) if b.isdigit())

    def recent_finished(self, limit: int, before: str | None = None) -> list[str]:
        """Return ids of finished jobs, newest first, after the job id `before` if given."""
        cutoff = None
        if before is not None:
            found = self.read_status(before)
            if found is None or found.record.finished_at is None:
                return []
            cutoff = (finished_bucket(int(found.record.finished_at.timestamp() * 1000)),
                      before)
        ids: list[str] = []
        for bucket in reversed(self.buckets()):
            if cutoff and bucket > cutoff[0]:
                continue
            names = sorted(self.children(self.layout.finished_bucket(bucket)), reverse=True)
            for name in names:
                parsed = parse_finished_entry(name)
                if parsed is None:
                    continue
                job_id = parsed[0]
                if cutoff and bucket == cutoff[0] and job_id >= cutoff[1]:
                    continue
                ids.append(job_id)
                if len(ids) >= limit:
                    return ids
        return ids

    def delete_finished(self, *, fence: str | None = None, before_ms: int,
                        states: tuple[str, ...] = ("S", "F")) -> int:
        """Delete finished records whose bucket ended before `before_ms`; return the count.

        Each batch is one multi (status record + index entry); the leader passes its
        fence. An entry already gone (someone else purged it) is skipped, not fatal.
        """
        deleted = 0
        for bucket in self.buckets():
            if int(bucket) + BUCKET_MS > before_ms:
                break
            parent = self.layout.finished_bucket(bucket)
            entries = [n for n in self.children(parent)
                       if (parsed := parse_finished_entry(n)) and parsed[1] in states]
            for start in range(0, len(entries), 50):
                deleted += self._delete_entries(fence, bucket, entries[start:start + 50])
            try:
                self.client.delete(parent)  # fails while entries of other states remain
            except (NoNodeError, NotEmptyError):
                pass
        return deleted

    def _delete_entries(self, fence, bucket, entries) -> int:
        def build(txn, entries=entries):
            if fence:
                txn.check(fence, -1)
            for name in entries:
                txn.delete(self.layout.status(parse_finished_entry(name)[0]))
                txn.delete(self.layout.finished_entry(bucket, name))

        results = self._commit_raw(build)
        failed = failures(results)
        if not failed:
            return len(entries)
        if fence and failed[0][0] == 0:
            raise NoNodeError(f"fence {fence} is gone")
        if len(entries) == 1:
            return 0
        return sum(self._delete_entries(fence, bucket, [e]) for e in entries)

    def drop_assignment(self, worker_id: str, job_id: str) -> None:
        try:
            self.retry(self.client.delete, self.layout.assignment(worker_id, job_id))
        except NoNodeError:
            pass

    def _written(self, path: str, data: bytes) -> bool:
        try:
            current, _ = self.client.get(path)
        except NoNodeError:
            return False
        return current == data

    # -- leader transitions ----------------------------------------------------------

    def assign(self, fence: str, items: Iterable[tuple[str, str, str]]) -> list:
        """Move pending jobs to workers: items are (queue, job_node, worker_id).

        One multi for the batch, fenced by the leader's own sequential election znode,
        whose name can never come back once its session is gone.
        """
        items = list(items)
        now = records.now().isoformat()

        def build(txn):
            txn.check(fence, -1)
            for queue, node, worker_id in items:
                job_id = node.split("-", 1)[1]
                txn.create(
                    self.layout.assignment(worker_id, job_id),
                    records.dumps({"queue": queue, "node": node, "assigned_at": now}),
                )
                txn.delete(self.layout.job(queue, node))

        return self._commit_raw(build)

    def submit_tick(self, fence: str, record: StatusRecord, schedule_path: str,
                    state: bytes, version: int | None) -> list:
        """Create a schedule tick's job and advance the schedule, in one fenced multi.

        The job id is derived from the tick, so a tick already submitted (by an earlier
        leader) fails with NodeExists instead of running twice.
        """
        self.ensure_queue(record.queue)
        status_data = record.to_bytes()
        self.check_size(record, len(status_data))

        waiting = self.waiting_path(record)

        def build(txn):
            txn.check(fence, -1)
            txn.create(self.layout.status(record.id), status_data)
            txn.create(waiting, records.dumps({"id": record.id, "task": record.task}))
            if version is None:
                txn.create(schedule_path, state)
            else:
                txn.set_data(schedule_path, state, version=version)

        return self.with_shards(lambda: self._commit_raw(build), [waiting])

    def promote(self, fence: str, names: Iterable[tuple[str, str, str]]) -> list:
        """Move due delayed jobs to their queue: names are (delayed_name, queue, job_node)."""

        names = list(names)

        def build(txn):
            txn.check(fence, -1)
            for delayed_name, queue, node in names:
                txn.create(self.layout.job(queue, node), b"")
                txn.delete(self.layout.delayed_job(delayed_name))

        waiting = [self.layout.job(queue, node) for _, queue, node in names]
        return self.with_shards(lambda: self._commit_raw(build), waiting)

    def requeue(self, fence: str, worker_id: str, job_id: str, queue: str, node: str,
                status: Versioned | None) -> list:
        """Hand a dead worker's job back to pending, noting the lost attempt.

        A job that was running when its worker vanished gets a WorkerLost error. After
        MAX_WORKER_LOSSES of those it is failed instead of handed back: a job that kills
        whole workers (not just its task process) must not take the cluster down in a
        loop. `retry()` (or the dashboard) can send it back on purpose.
        """
        lost_record = None
        if status is not None and status.record.state == records.RUNNING:
            from .exceptions import WorkerLost

            record = status.record
            losses = 1 + sum(e.exception_class_path == WORKER_LOST for e in record.errors)
            final = losses >= MAX_WORKER_LOSSES
            lost = WorkerLost(
                f"Worker {worker_id!r} vanished while running attempt {record.attempts}; "
                + (f"that is {losses} lost workers, so the job is failed, not run again "
                   "(retry it once the cause is fixed)." if final else
                   "the job was handed back to be run again.")
            )
            error = records.ErrorRecord(
                exception_class_path=WORKER_LOST, message=str(lost),
                traceback=str(lost) + "\n", attempt=record.attempts, worker_id=worker_id,
            )
            if final:
                lost_record = record.evolve(state=records.FAILED, finished_at=records.now(),
                                            errors=record.errors + (error,))
            else:
                lost_record = record.evolve(state=records.READY,
                                            errors=record.errors + (error,))
        index = self.index_path(lost_record) if lost_record and lost_record.is_finished else None
        cleanup = self.cleanup_paths(lost_record) if index else []

        waiting = [self.layout.job(queue, node)] if index is None else []

        def build(txn):
            txn.check(fence, -1)
            if index is None:
                txn.create(self.layout.job(queue, node), records.dumps({"id": job_id}))
            txn.delete(self.layout.assignment(worker_id, job_id))
            if lost_record is not None:
                txn.set_data(self.layout.status(job_id), lost_record.to_bytes(),
                             version=status.version)
            if index is not None:
                txn.create(index, b"")
                for path in cleanup:
                    txn.delete(path)

        return self.with_shards(lambda: self._commit_raw(build), waiting)

    def delete_shard(self, fence: str, queue: str, shard: str) -> list:
        """Delete an empty shard (fenced); return the failures (NotEmpty, NoNode) if any.

        A submitter racing with this either lands its job first (NotEmpty here) or
        meets NoNode and makes the shard again: no job is lost either way.
        """
        def build(txn):
            txn.check(fence, -1)
            txn.delete(self.layout.shard(queue, shard))

        return failures(self._commit_raw(build))

    def move_unsharded(self, fence: str, queue: str, nodes: list[str]) -> list:
        """Move pending jobs written before sharding (jobs/{queue}/{node}) into their
        shards, in one fenced multi: each job is in exactly one of the two places."""
        def build(txn):
            txn.check(fence, -1)
            for node in nodes:
                txn.create(self.layout.job(queue, node),
                           records.dumps({"id": node.split("-", 1)[1]}))
                txn.delete(self.layout.unsharded_job(queue, node))

        waiting = [self.layout.job(queue, node) for node in nodes]
        return self.with_shards(lambda: self._commit_raw(build), waiting)

    def _commit_raw(self, build):
        txn = self.client.transaction()
        build(txn)
        return txn.commit()
