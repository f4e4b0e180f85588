"""Read and write jobs, assignments and status records; every transition is one multi.

Rule 1 of the contract: submit, assign, start, complete and reassign are each a single
transaction, so a crash at any instant leaves a job in exactly one place. kazoo's
`commit()` does not raise on a failed op: every result list is inspected here.
After a connection loss a multi's outcome is unknown (rule 4); callers pass `landed` to
tell, from a fresh read, whether it already took effect before it is tried again.
"""

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
    UnimplementedError,
)

from . import records
from .conf import Options
from .connection import add_persistent_watch, remove_persistent_watch
from .exceptions import CorruptRecord, PayloadTooLarge, ZooKeeperUnavailableError
from .multiread import get_many_async
from .records import WORKER_LOST, StatusRecord
from .tree import (
    BUCKET_MS,
    Layout,
    bucket_expiry_ms,
    bucket_start,
    delayed_node_name,
    finished_bucket,
    finished_entry,
    finished_leaf,
    finished_leaves,
    is_job_id,
    job_node_name,
    parse_bucket,
    parse_finished_entry,
)

logger = logging.getLogger(__name__)

TRANSIENT = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)
MULTI_READ_BATCH = 16  # status records per multiRead (a record may be up to ~1 MB)
MAX_WORKER_LOSSES = 3  # a job whose workers vanished this often is failed, not re-run
LANDED = object()
SHARD_ROUNDS = 8  # resends of a multi whose shard the leader deleted meanwhile
# A submit_many multi stays well under jute.maxbuffer (1 MB by default, the whole
# request): bytes of data and paths, and a bound on ops per multi.
BULK_BYTES = 512_000
BULK_JOBS = 500


# Bytes a multi's create costs beyond its path and data, generously: op header, lengths,
# flags, and the ACL (a digest ACL's id with AUTH set).
MULTI_OP_BYTES = 128


def request_bytes(creates) -> int:
    """About how many bytes a multi of these (path, data) creates sends: what must stay
    under jute.maxbuffer, which the server enforces on the whole request."""
    return sum(len(path) + len(data) + MULTI_OP_BYTES for path, data in creates)


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
        self.raw_client = client
        self._local = threading.local()
        self.options = options
        self.layout = Layout(options.root)
        self._queues_made: set[str] = set()
        self._buckets_made: set[str] = set()
        # Shards (pending or delayed) seen to exist: a multi into one of them goes as it
        # is; one into any other first asks exists() (a read) and creates it in the
        # same multi when missing (with_shards).
        self._shards_seen: set[str] = set()
        self._skeleton_made = False
        self._multi_read: bool | None = None  # whether the server answers multiRead
        self._multi_read_probe = None  # the multiRead asking it, until answered
        self._probe_lock = threading.Lock()
        self._persistent_ok = True  # until a server or client could not

    # -- plumbing ------------------------------------------------------------------

    @property
    def client(self):
        """The KazooClient; inside `bounded()`, a view of it whose calls give up at the
        deadline (for this thread only)."""
        bound = getattr(self._local, "bound", None)
        return self.raw_client if bound is None else _BoundedClient(self.raw_client, bound)

    @contextmanager
    def bounded(self, seconds: float | None = None):
        """Make every ZooKeeper call of this thread in the block end by a deadline.

        kazoo queues a request made while it is disconnected and its synchronous calls
        wait for the answer without limit: during a loss of quorum a web request would
        hang until ZooKeeper is back. Inside this block calls are made with kazoo's
        async variants and waited for until the deadline (CONNECT_TIMEOUT by default),
        then ZooKeeperUnavailableError is raised. A request that timed out is still
        queued in kazoo and may be carried out once it reconnects: callers must treat
        the outcome as unknown. Workers and the leader never use this: they wait for
        ZooKeeper on purpose.
        """
        seconds = self.options.connect_timeout if seconds is None else seconds
        outer = getattr(self._local, "bound", None)
        limit = time.monotonic() + seconds
        if outer is not None and outer.limit <= limit:
            yield
            return
        self._local.bound = _Bound(limit=limit, seconds=seconds, hosts=self.options.hosts)
        try:
            yield
        finally:
            self._local.bound = outer

    def retry(self, func: Callable, *args, deadline: float | None = None, **kwargs):
        """Call func, retrying transient errors until `deadline` seconds have passed
        (and, inside `bounded()`, never past its deadline)."""
        limit = time.monotonic() + (deadline if deadline is not None
                                    else self.options.session_timeout)
        bound = getattr(self._local, "bound", None)
        if bound is not None:
            limit = min(limit, bound.limit)
        delay = 0.02
        tries = 0
        while True:
            try:
                return func(*args, **kwargs)
            except TRANSIENT as exc:
                tries += 1
                # At least a few tries, however late: a process frozen (SIGSTOP, a long
                # pause) past the deadline must not give up on its first error. A bounded
                # caller (a web request) gives up at its deadline all the same.
                if (tries >= 4 or bound is not None) and time.monotonic() + delay > limit:
                    raise ZooKeeperUnavailableError(
                        f"ZooKeeper at {self.options.hosts!r} did not answer in time "
                        f"({type(exc).__name__}); check that the ensemble is up and "
                        "reachable."
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
        return self.with_shards(build, waiting,
                                send=lambda b: self._commit_once(b, landed, deadline))

    def with_shards(self, build: Callable, waiting: Iterable[str] = (), *,
                    send: Callable | None = None):
        """Send the multi `build(txn)` fills, making the shards of the pending or delayed
        jobs it creates (`waiting`) when they are missing; return its results.

        A shard is a second (a minute for delayed jobs): at low load nearly every job
        goes to a new one. So a shard this store has not seen is first asked for with
        exists(), a read, and created in the same multi when missing: one transaction.
        Sent blind into a missing shard, the multi failed (a transaction too), then the
        shard was created and the multi sent again: three, and three round trips
        (measured with one job a second: 7.1 write transactions per job, against 3 for
        the job's own three steps).

        Shards are deleted by the leader once empty, so a job create can still meet
        NoNode (a shard seen before, deleted since; a queue that is new): the multi then
        wrote nothing, the shards are made (NodeExists is fine: another submitter made
        it meanwhile) and the multi is sent again. If the leader deletes a shard again in
        between, we go round again. The op that failed decides: a NoNode on any other
        path (an assignment taken back, a record purged) is the caller's to explain, and
        is returned at once. `send(build)` commits (default: one plain multi).
        """
        send = send or self._commit_raw
        waiting = set(waiting)
        paths: list[str] = []
        making = self._missing_shards(waiting) if waiting else []

        def recording(txn):
            for shard in making:
                txn.create(shard, b"")
            build(txn)
            paths[:] = [op.path for op in txn.operations]

        for _ in range(SHARD_ROUNDS):
            results = send(recording)
            made, making = len(making), []  # made in the first multi only
            if made and results is not LANDED:
                failed = failures(results)
                if failed and failed[0][0] < made:
                    # The multi wrote nothing. Made meanwhile by someone else
                    # (NodeExists): send it again as it is. A new queue's parent
                    # missing (NoNode): make the shards apart first.
                    if isinstance(failed[0][1], NoNodeError):
                        self.make_shards(waiting)
                    continue
                results = results[made:]  # the caller's ops' results, as it indexes them
            if results is LANDED or not failures(results):
                self._seen_shards(self._shards_of(waiting))
                return results
            failed = failures(results)
            if not (waiting and isinstance(failed[0][1], NoNodeError)
                    and paths[failed[0][0] + made] in waiting
                    and self.make_shards(waiting)):
                return results
        return results

    def _shards_of(self, paths: Iterable[str]) -> set[str]:
        """The shards of pending-job and delayed-job paths (base/{queue|minute}/{shard}/
        {job}); other paths have none."""
        wanted = set()
        for base in (self.layout.jobs, self.layout.delayed):
            depth = base.count("/") + 3
            wanted |= {p.rsplit("/", 1)[0] for p in paths
                       if p.startswith(base + "/") and p.count("/") == depth}
        return wanted

    def _missing_shards(self, waiting: set[str]) -> list[str]:
        """Of the shards of `waiting` not seen yet, those that do not exist (a read each;
        one a second per submitting process, at most)."""
        missing = []
        for shard in sorted(self._shards_of(waiting) - self._shards_seen):
            if self.retry(self.client.exists, shard) is None:
                missing.append(shard)
            else:
                self._seen_shards([shard])
        return missing

    def _seen_shards(self, shards: Iterable[str]) -> None:
        self._shards_seen.update(shards)
        if len(self._shards_seen) > 64:  # shards only move on: keep the cache small
            self._shards_seen = set(shards)

    def make_shards(self, paths: Iterable[str]) -> bool:
        """Make the shards of pending-job and delayed-job paths (with their queue or due
        minute); True if the paths have shards and each is there now (made by us or by
        someone else)."""
        wanted = self._shards_of(paths)
        for shard in sorted(wanted):
            for _ in range(SHARD_ROUNDS):
                try:
                    self.retry(self.client.create, shard, b"", makepath=True)
                except NodeExistsError:
                    pass
                except NoNodeError:
                    continue  # the leader swept the new parent meanwhile: again
                break
            else:
                return False
        return bool(wanted)

    def _commit_once(self, build, landed, deadline):
        uncertain = False

        def attempt():
            nonlocal uncertain
            if uncertain and landed is not None:
                # The member we reconnected to need only be as current as the last
                # answer we got, which is older than the multi whose answer was lost:
                # read from it as it is, a landed multi looked unwritten and was sent
                # again (a start refused, a finish reported as dropped). sync() makes it
                # catch up with the leader first. Only on this rare path.
                self.client.sync(self.layout.root)
                if landed():
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

    def open_to_anyone(self) -> list[str]:
        """With AUTH set: ROOT and the skeleton's paths whose ACL still lets anyone in.

        kazoo's default_acl applies to znodes created from then on, so a ROOT that
        existed before AUTH was set keeps ZooKeeper's open ACL (world:anyone): anyone
        can read its payloads, and delete or add under it."""
        if not self.options.auth:
            return []
        open_paths = []
        for path in (self.layout.root, *self.layout.skeleton()):
            try:
                acls, _ = self.retry(self.client.get_acls, path)
            except NoNodeError:
                continue
            if any(acl.id.scheme == "world" for acl in acls):
                open_paths.append(path)
        return open_paths

    def ensure_queue(self, queue: str) -> None:
        if queue not in self._queues_made:
            self.ensure_skeleton()
            self.retry(self.client.ensure_path, self.layout.queue(queue))
            self._queues_made.add(queue)

    # -- submit --------------------------------------------------------------------

    def waiting_path(self, record: StatusRecord) -> str:
        """Where a READY job waits: jobs/{queue} when due, delayed/ until its run_after
        (or its retry's backoff) has passed."""
        due = record.due_at
        if due is not None and due > records.now():
            due_ms = int(due.timestamp() * 1000)
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
        unique_data = records.dumps({"job_id": record.id, "key": record.unique_key}) \
            if unique_path else b""
        # The whole request counts against jute.maxbuffer, not the records alone: the
        # key is in it twice, and a request over it drops the connection, retried until
        # CONNECT_TIMEOUT instead of a PayloadTooLarge now.
        self.check_size(record, request_bytes(
            [(status_path, status_data), (job_path, job_data)]
            + ([(unique_path, unique_data)] if unique_path else [])))
        self.ensure_queue(record.queue)

        def build(txn):
            txn.create(status_path, status_data)
            txn.create(job_path, job_data)
            if unique_path:
                txn.create(unique_path, unique_data)

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
                holder = self._live_holder(unique_path)
                if holder is None:
                    continue  # the holder finished meanwhile, or its key was stale
                return holder
            raise error
        raise ZooKeeperUnavailableError(f"Could not create job {record.id!r}; try again.")

    def unique_holder(self, key: str) -> str | None:
        """The id of the job holding unique key `key`, or None."""
        path = self.layout.unique_key(key)
        try:
            raw, _ = self.retry(self.client.get, path)
        except NoNodeError:
            return None
        return records.loads(raw, path=path).get("job_id")

    def _live_holder(self, unique_path: str) -> str | None:
        """The job holding a unique key; None if the key is free to take again.

        A job's finish, cancel and last hand-back free its key in the same multi, so a
        key outlives its job only when the job's record was lost: replaced as corrupt
        (the placeholder does not carry the key), or deleted by hand. Such a stale key
        answered every later submit with a job that is gone; it is deleted here. A
        holder that finished, key and all, is a race with that finish: look again.
        """
        try:
            raw, stat = self.retry(self.client.get, unique_path)
        except NoNodeError:
            return None
        try:
            holder = records.loads(raw, path=unique_path).get("job_id")
        except CorruptRecord:
            holder = None
        found = None
        if isinstance(holder, str) and is_job_id(holder):
            try:
                found = self.read_status(holder)
            except CorruptRecord:
                found = None
        if found is not None and found.record.unique_key is not None:
            return None if found.record.is_finished else holder
        logger.warning("unique key freed: its job %s has no record that holds it (path=%s)",
                       holder, unique_path)
        try:
            # The same znode, not one made since by a submit that freed it first: a
            # delete checks the version only, and every key starts at version 0. (Between
            # this read and the delete a window of one round trip remains, in which two
            # submitters would both have to free the same stale key.)
            _, again = self.retry(self.client.get, unique_path)
            if again.czxid == stat.czxid:
                self.retry(self.client.delete, unique_path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass  # freed or taken meanwhile: the next attempt sees which
        return None

    @staticmethod
    def job_data(record: StatusRecord) -> bytes:
        return records.dumps({
            "id": record.id,
            "task": record.task,
            "enqueued_at": record.enqueued_at.isoformat() if record.enqueued_at else None,
        })

    def submit_many(self, batch: Iterable[StatusRecord], *, around_chunk=None,
                    written=None) -> int:
        """Create many jobs in batched multis; return how many multis were sent.

        `around_chunk()`, if given, is a context manager entered around each multi (the
        web's bound: Store.bounded; one for the whole call would cut a million-job call
        short), and `written(n)` is called after each multi of n jobs landed.

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
            item = (self.layout.status(record.id), status_data, self.waiting_path(record),
                    job_data)
            cost = request_bytes([item[:2], item[2:]])
            self.check_size(record, cost)
            if chunks[-1] and (size + cost > BULK_BYTES or len(chunks[-1]) >= BULK_JOBS):
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += cost
        chunks = [c for c in chunks if c]
        if not chunks:
            return 0
        around = around_chunk or nullcontext
        with around():
            self.ensure_skeleton()
        for chunk in chunks:
            with around():
                self._submit_chunk(chunk)
            if written is not None:
                written(len(chunk))
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
            if index == 0 and isinstance(error, NodeExistsError):
                # The ids are fresh and the chunk one multi: an earlier attempt, cut off
                # by connection loss, landed, though landed() asked a server that had
                # not applied it yet (another member of the ensemble, after a
                # reconnection). Raising here told the caller nothing was written, and
                # a caller that submitted again ran every job twice.
                return
            if index % 2 == 1 and isinstance(error, NoNodeError):
                self._skeleton_made = False  # delayed/ or jobs/ vanished: make them again
                self.ensure_skeleton()
                continue
            raise error
        raise ZooKeeperUnavailableError(
            f"Could not create a batch of {len(chunk)} jobs; try again.")

    def check_size(self, record: StatusRecord, size: int) -> None:
        self.check_job_size(record.task, size)

    def check_job_size(self, task: str, size: int, *, at_least: bool = False) -> None:
        limit = self.options.max_record_bytes
        if size > limit:
            raise PayloadTooLarge(
                f"Task {task!r} cannot be submitted: its job is {'at least ' * at_least}"
                f"{size:,} bytes once encoded, over the {limit:,} bytes a znode may hold "
                "here (ZooKeeper's jute.maxbuffer); pass a reference (a primary key, a "
                "file path) instead."
            )

    # -- reads ---------------------------------------------------------------------

    def catch_up(self) -> None:
        """Have this process's ZooKeeper member apply every write committed before now
        (sync), so that the reads after it see what other processes wrote.

        ZooKeeper promises a session its own writes, not those of other sessions: a
        member may trail the ensemble's leader (by up to syncLimit × tickTime). Read
        from one that trails, a job another web process had just submitted was "no
        such job" (get_result, wait, cancel; the job then ran), and an operator's
        action right after another's was decided on the state before it (a cancel
        after a retry did nothing; a schedule resumed, then paused, kept ticking). For
        reads that found nothing and for operator actions: one round trip, never on a
        job's way through the cluster.
        """
        self.retry(self.client.sync, self.layout.root)

    def read_status(self, job_id: str, watch=None) -> Versioned | None:
        """The job's status record, or None if it has none, once caught up (catch_up):
        a job id comes from another process, which may have written it to a member
        ahead of ours."""
        path = self.layout.status(job_id)
        try:
            data, stat = self.retry(self.client.get, path, watch=watch)
        except NoNodeError:
            self.catch_up()
            try:
                data, stat = self.retry(self.client.get, path, watch=watch)
            except NoNodeError:
                return None
        return Versioned(StatusRecord.from_bytes(data, path=path), stat.version)

    def read_statuses(self, job_ids: Iterable[str]) -> Callable[[str], Versioned | None]:
        """Send the reads of many status records at once; return a getter for each.

        One round trip for a batch of new assignments instead of one per job, and one
        request per MULTI_READ_BATCH records (ZooKeeper's multiRead, multiread.py). The
        getter behaves like read_status: None for a missing record, CorruptRecord for
        garbage; a read cut off by the connection is tried again on its own, with
        retries. Called inside `bounded()`, a getter gives up by its deadline.
        """
        ids = list(job_ids)
        if (len(ids) < 2 or getattr(self._local, "bound", None)
                or not self._multi_read_works(self.layout.status(ids[0]))):
            return self._read_each(ids)
        paths = {job_id: self.layout.status(job_id) for job_id in ids}
        slots: dict[str, tuple] = {}
        for start in range(0, len(ids), MULTI_READ_BATCH):
            chunk = ids[start:start + MULTI_READ_BATCH]
            pending = get_many_async(self.raw_client, [paths[job_id] for job_id in chunk])
            for index, job_id in enumerate(chunk):
                slots[job_id] = (pending, index)

        def result(job_id: str) -> Versioned | None:
            pending, index = slots[job_id]
            try:
                answer = pending.get(timeout=self._answer_wait())[index]
            except (*TRANSIENT, self.raw_client.handler.timeout_exception):
                return self.read_status(job_id)
            except (UnimplementedError, ValueError, struct.error) as exc:
                self._no_multi_read(exc)
                return self.read_status(job_id)
            if isinstance(answer, NoNodeError):
                return None
            if isinstance(answer, Exception):
                raise answer  # as get() would (NoAuth, ...)
            data, stat = answer
            return Versioned(StatusRecord.from_bytes(data, path=paths[job_id]), stat.version)

        return result

    def _answer_wait(self) -> float:
        """How long a getter of read_statuses waits for its answer before reading again:
        the session timeout, and no later than the deadline of a `bounded()` block it is
        called in (the reads were sent outside it, so that multiRead is used: see the
        worker's _read_assignments). Past it, the read again is bounded too."""
        wait = self.options.session_timeout
        bound = getattr(self._local, "bound", None)
        if bound is not None:
            wait = max(0.0, min(wait, bound.limit - time.monotonic()))
        return wait

    def _multi_read_works(self, path: str) -> bool:
        """Whether to send multiRead now: True once the server has answered one.

        A server before 3.6 does not know the opcode: it answers UnimplementedError, or
        drops the request unanswered and kazoo fails it at the next reply, whose xid
        does not match (RuntimeError, and the connection drops). So the first call sends
        a probe and waits a few seconds for it; only what the server does with it
        decides (_multi_read_probed). Until then, False: this call reads one by one.

        A probe sent while kazoo reconnects waits in its queue, and one sent to a frozen
        server waits unanswered, then fails with the connection: taking either for an
        answer turned multiRead and persistent watches off for the life of the process.
        """
        with self._probe_lock:
            if self._multi_read is not None:
                return self._multi_read
            if self._multi_read_probe is not None:
                return False  # asked, not answered yet: not worth another wait
            probe = self._multi_read_probe = get_many_async(self.raw_client, [path])
        probe.rawlink(self._multi_read_probed)  # decides once answered, however late
        probe.wait(min(5.0, self.options.session_timeout))
        self._multi_read_probed(probe)  # at once, not when kazoo's thread gets to it
        return self._multi_read is True

    def _multi_read_probed(self, probe) -> None:
        """Settle the question by the probe's outcome, if it has one; a probe the
        connection cut off settles nothing, and the next call asks again."""
        if not probe.ready():
            return
        failure = probe.exception
        with self._probe_lock:
            if self._multi_read_probe is not probe:
                return  # settled already
            self._multi_read_probe = None
            if failure is None:
                self._multi_read = True
                return
            if isinstance(failure, (*TRANSIENT, AuthFailedError)):
                logger.info("a multiRead probe got no answer (%r): asking again later",
                            failure)
                return
        # UnimplementedError, the RuntimeError of an unanswered opcode, a reply that
        # does not parse.
        self._no_multi_read(failure)

    def watch_persistently(self, path: str, func) -> bool:
        """Arm (again) a persistent recursive watch on `path` calling `func` (an
        inline_watch function: connection.py); False where the client or server cannot,
        and the caller keeps to one-shot watches. Connection loss raises, as any read.

        Asked of a server that has answered multiRead (3.6+, as addWatch): one older
        than 3.6 would drop the request unanswered (see _multi_read_works).
        """
        if self._persistent_ok and self._multi_read_works(self.layout.assignments):
            try:
                if add_persistent_watch(self.raw_client, path, func,
                                        timeout=self.options.session_timeout):
                    return True
                reason = "this client's connection handler is kazoo's own"
            except TRANSIENT:
                raise
            except self.raw_client.handler.timeout_exception:
                # No answer, from a server that answered multiRead (3.6+, as addWatch):
                # sent while kazoo reconnects, or to a frozen server. One-shot watches
                # this time; the next call asks again.
                return False
            except Exception as exc:  # UnimplementedError
                reason = repr(exc)
            self._persistent_ok = False
            logger.warning("no persistent watches (%s): assignments are listed on every "
                           "change in this process, as with ZooKeeper before 3.6", reason)
        return False

    def unwatch_persistently(self, path: str, func) -> None:
        remove_persistent_watch(self.raw_client, path, func)

    def _no_multi_read(self, exc: BaseException) -> None:
        if self._multi_read is not False:
            self._multi_read = False
            logger.warning(
                "ZooKeeper cannot answer a multiRead (%r): status records are read one "
                "by one in this process. ZooKeeper 3.6 and newer answer it; once the "
                "ensemble is upgraded, restart the workers.", exc)

    def _read_each(self, job_ids: list[str]) -> Callable[[str], Versioned | None]:
        """read_statuses with one get_async per record (no multiRead)."""
        pending = {job_id: self.client.get_async(self.layout.status(job_id))
                   for job_id in job_ids}

        def result(job_id: str) -> Versioned | None:
            path = self.layout.status(job_id)
            try:
                data, stat = pending[job_id].get(timeout=self._answer_wait())
            except NoNodeError:
                return None
            except (*TRANSIENT, self.client.handler.timeout_exception):
                return self.read_status(job_id)
            return Versioned(StatusRecord.from_bytes(data, path=path), stat.version)

        return result

    def children(self, path: str, watch=None) -> list[str]:
        try:
            return self.retry(self.client.get_children, path, watch=watch)
        except NoNodeError:
            return []

    def children_and_ctime(self, path: str, watch=None) -> tuple[list[str], float]:
        """The children of `path` and when it was created (epoch seconds, the server's
        clock), in one read; ([], 0.0) if it does not exist."""
        try:
            names, stat = self.retry(self.client.get_children, path, watch=watch,
                                     include_data=True)
        except NoNodeError:
            return [], 0.0
        return names, stat.ctime / 1000

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
               *, requeue: bool = False, dead_letter: tuple[str, bytes] | None = None) -> bool:
        """Record the outcome and delete our assignment in one multi.

        Fenced by the assignment znode (ours) and the status version (no newer attempt
        wrote since we started). With `requeue`, the job also goes back to wait (pending,
        or delayed until its run_after) in the same multi. `dead_letter` is a
        (path, data) entry (deadletter.entry) created in the same multi too.
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
            if dead_letter:
                txn.create(*dead_letter)

        def landed():
            return self._written(status_path, data)

        results = self.commit(build, landed=landed,
                              waiting=[requeue_path] if requeue_path else ())
        failed = failures(results)
        if failed and self.forget_bucket_if_gone(index_path, failed):
            # Our bucket expired (a short result_ttl) or was purged since we made it.
            index_path = self.index_path(final)
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

    def index_path(self, record: StatusRecord, *, fresh: bool = False) -> str:
        """Return the finished-index entry of a finished record, making its bucket.

        The bucket follows the record's own result_ttl (None: the global RESULT_TTL),
        so every writer of a final state, and retry() removing it, agree on the path.
        With `fresh`, the bucket is made even if this process notes it as made: an
        outcome's retry asks so (Committer._final_ops), since index_entry notes a second
        as made before the multi that makes it has landed (it may fail, or a runner may
        note it again for a job of its own of that second).
        """
        finished_ms = int(record.finished_at.timestamp() * 1000)
        leaf = finished_leaf(finished_ms, record.result_ttl)
        if fresh or leaf not in self._buckets_made:
            # One create when the bucket exists (kazoo's ensure_path makes the parent
            # only on NoNode); a worker makes each second at most once.
            self.retry(self.client.ensure_path, self.layout.finished_bucket(leaf))
            self._note_bucket(leaf)
        return self.layout.finished_entry(
            leaf, finished_entry(record.id, record.state, record.queue))

    def index_entry(self, record: StatusRecord) -> tuple[str, list[str]]:
        """(the finished-index entry of a finished record, the buckets to create ahead
        of it in the same multi): index_path() for the worker's outcomes, without a
        transaction of its own.

        A bucket's leaf is a second: at low load nearly every outcome opens one, and
        index_path() paid it a create of its own (a failed one, NodeExists, in every
        other worker). Here a leaf this process has not seen is asked for with
        exists(), a read (and its parent too, when it is missing), and what is missing
        is created by the outcome's multi. It is noted as made at once, so this
        process's other outcomes of that second do not create it again; should that
        multi fail, their entries meet NoNode and the committer makes the bucket apart
        (Committer._bucket_gone, index_path).
        """
        finished_ms = int(record.finished_at.timestamp() * 1000)
        leaf = finished_leaf(finished_ms, record.result_ttl)
        entry = self.layout.finished_entry(
            leaf, finished_entry(record.id, record.state, record.queue))
        if leaf in self._buckets_made:
            return entry, []
        self._note_bucket(leaf)
        path = self.layout.finished_bucket(leaf)
        if self.retry(self.client.exists, path) is not None:
            return entry, []
        parent = path.rsplit("/", 1)[0]
        # The parent holds many seconds: known to be there when one of them is.
        bucket = leaf.split("/", 1)[0] + "/"
        if parent == self.layout.finished or any(
                other.startswith(bucket) for other in self._buckets_made if other != leaf):
            return entry, [path]
        if self.retry(self.client.exists, parent) is None:
            return entry, [parent, path]
        return entry, [path]

    def forget_bucket(self, index: str) -> None:
        """Forget the bucket of an index entry path, so that index_path() makes it."""
        self._buckets_made.discard(index.rsplit("/", 1)[0][len(self.layout.finished) + 1:])

    def _note_bucket(self, leaf: str) -> None:
        self._buckets_made.add(leaf)
        if len(self._buckets_made) > 64:  # keep the cache small: leaves only grow
            self._buckets_made = {leaf}

    def find_index_entry(self, record: StatusRecord) -> str | None:
        """Where a finished record's index entry is: in its bucket's second, or directly
        in the bucket (entries written before seconds), named with its queue or, as
        before the queue was in the name, without; None if none holds it.

        A retry() that missed an older entry left it behind, and the sweep that expired
        it later deleted the status record of the job running again."""
        finished_ms = int(record.finished_at.timestamp() * 1000)
        entry = finished_entry(record.id, record.state, record.queue)
        for name in (entry, ".".join(entry.split(".", 2)[:2])):
            for leaf in (finished_leaf(finished_ms, record.result_ttl),
                         finished_bucket(finished_ms, record.result_ttl)):
                path = self.layout.finished_entry(leaf, name)
                if self.retry(self.client.exists, path) is not None:
                    return path
        return None

    def forget_bucket_if_gone(self, index: str | None, failed) -> bool:
        """Tell whether a refused finishing multi failed because its index bucket was
        deleted after we made it (expired or purged meanwhile); if so, forget it so the
        next index_path() makes it again."""
        if not index or not any(isinstance(e, NoNodeError) for _, e in failed):
            return False
        parent = index.rsplit("/", 1)[0]
        if self.retry(self.client.exists, parent) is not None:
            return False
        self._buckets_made.discard(parent[len(self.layout.finished) + 1:])
        return True

    def buckets(self) -> list[str]:
        """The finished index's buckets, oldest first (by start, then TTL)."""
        found = [(parsed, b) for b in self.children(self.layout.finished)
                 if (parsed := parse_bucket(b))]
        return [b for _, b in sorted(found, key=lambda item: (item[0][0], item[0][1] or 0))]

    def recent_finished(self, limit: int, before: str | None = None) -> list[str]:
        """Return ids of finished jobs, newest first, after the job id `before` if given.

        Buckets of one start (the global TTL's and per-task TTLs') hold the same ten
        seconds, so they are merged before sorting by id.
        """
        cutoff = None
        if before is not None:
            found = self.read_status(before)
            if found is None or found.record.finished_at is None:
                return []
            cutoff = (finished_bucket(int(found.record.finished_at.timestamp() * 1000)),
                      before)
        groups: dict[str, list[str]] = {}
        for bucket in self.buckets():
            groups.setdefault(bucket_start(bucket), []).append(bucket)
        ids: list[str] = []
        for start in sorted(groups, reverse=True):
            if cutoff and start > cutoff[0]:
                continue
            leaves = self.bucket_leaves(groups[start])
            names = [n for bucket in groups[start] for found in leaves[bucket].values()
                     for n in found]
            for job_id in sorted({p[0] for n in names if (p := parse_finished_entry(n))},
                                 reverse=True):
                if cutoff and start == cutoff[0] and job_id >= cutoff[1]:
                    continue
                ids.append(job_id)
                if len(ids) >= limit:
                    return ids
        return ids

    def delete_finished(self, *, fence: str | None = None, before_ms: int,
                        states: tuple[str, ...] = ("S", "F")) -> int:
        """Delete finished records whose bucket ended before `before_ms`; return the count.

        A purge by age: buckets are judged by their start (their finish times), whatever
        their TTL.
        """
        return self.delete_buckets(
            [b for b in self.buckets() if parse_bucket(b)[0] + BUCKET_MS <= before_ms],
            fence=fence, states=states)

    def expire_finished(self, *, fence: str | None, now_ms: int, default_ttl: float,
                        watch=None, max_buckets: int | None = None,
                        max_entries: int | None = None,
                        after: str = "") -> tuple[int, int | None, str]:
        """Delete the buckets whose TTL has passed; return (count, next expiry in ms,
        cursor).

        The next expiry is that of the earliest bucket still kept (None if none), so the
        leader can sleep until then. Buckets we tried but could not remove (entries of a
        foreign name) are not counted: they must not make the leader spin.

        The leader sweeps on its only thread, so it passes caps: at most `max_buckets`
        buckets and `max_entries` entries a call (a backlog of 100k buckets took minutes
        in one go, with no assignment meanwhile). A capped call resumes at the next one:
        pass back the cursor it returned, and only expired buckets after it are taken.
        It is "" once the expired buckets are all seen; then buckets left to come make
        the next expiry now. Resuming after the cursor, not from the oldest, keeps
        buckets that cannot be emptied from taking every sweep's share.
        """
        expired, upcoming = [], []
        for bucket in self.children(self.layout.finished, watch=watch):
            expiry = bucket_expiry_ms(bucket, default_ttl)
            if expiry is None:
                continue
            if expiry <= now_ms:
                if bucket > after:
                    expired.append(bucket)
            else:
                upcoming.append(expiry)
        expired.sort()
        deleted, done, budget = 0, 0, max_entries
        for bucket in expired[:max_buckets]:
            if budget is not None and budget <= 0:
                break
            count, handled, whole = self._delete_bucket(bucket, fence, ("S", "F"), budget)
            deleted += count
            budget = None if budget is None else budget - handled
            if not whole and count:
                break  # cut short by the entry cap: the rest of it comes first next time
            done += 1
        left = expired[done:]
        upcoming += [bucket_expiry_ms(b, default_ttl) for b in left]
        cursor = (expired[done - 1] if done else after) if left else ""
        return deleted, min(upcoming) if upcoming else None, cursor

    def delete_buckets(self, buckets: Iterable[str], *, fence: str | None = None,
                       states: tuple[str, ...] = ("S", "F")) -> int:
        """Delete the records indexed in `buckets`, then each emptied bucket.

        A bucket is listed alone (one bucket is ten seconds of finishes, never the whole
        index). Each batch is one multi (status record + index entry); the leader passes
        its fence. An entry already gone (someone else purged it) is skipped, not fatal.
        """
        return sum(self._delete_bucket(bucket, fence, states)[0] for bucket in buckets)

    def _delete_bucket(self, bucket: str, fence: str | None, states: tuple[str, ...],
                       limit: int | None = None) -> tuple[int, int, bool]:
        """Delete the records of one bucket (at most `limit` entries), then its emptied
        seconds and itself; return (deleted, entries handled, whether all were)."""
        deleted = handled = 0
        whole = True
        leaves = self.bucket_leaves([bucket])[bucket]
        for leaf, names in leaves.items():
            entries = [n for n in names
                       if (parsed := parse_finished_entry(n)) and parsed[1] in states]
            if limit is not None and len(entries) > limit - handled:
                entries, whole = entries[:max(0, limit - handled)], False
            handled += len(entries)
            for start in range(0, len(entries), 50):
                deleted += self._delete_entries(fence, leaf, entries[start:start + 50])
        if not whole:
            return deleted, handled, False  # not empty yet: its deletes would only fail
        # Seconds first, then the bucket; each fails while other entries remain (a
        # purge of one state, a foreign name, a late finish): kept for next time.
        for leaf in [*(leaf for leaf in leaves if leaf != bucket), bucket]:
            try:
                self.retry(self.client.delete, self.layout.finished_bucket(leaf))
            except (NoNodeError, NotEmptyError):
                pass
        self._buckets_made = {leaf for leaf in self._buckets_made
                              if leaf.split("/", 1)[0] != bucket}
        return deleted, handled, True

    def bucket_leaves(self, buckets: list[str]) -> dict[str, dict[str, list[str]]]:
        """Each bucket's leaves and their names (tree.finished_leaves), listed here."""
        return finished_leaves(buckets, lambda relatives: {
            r: self.children(self.layout.finished_bucket(r)) for r in relatives})

    def _delete_entries(self, fence, leaf, entries) -> int:
        def build(txn, entries=entries):
            if fence:
                txn.check(fence, -1)
            for name in entries:
                txn.delete(self.layout.status(parse_finished_entry(name)[0]))
                txn.delete(self.layout.finished_entry(leaf, name))

        results = self._commit_raw(build)
        failed = failures(results)
        if not failed:
            return len(entries)
        if fence and failed[0][0] == 0:
            raise NoNodeError(f"fence {fence} is gone")
        if len(entries) == 1:
            return 0
        return sum(self._delete_entries(fence, leaf, [e]) for e in entries)

    def update_worker(self, worker_id: str, change: Callable[[dict], bool],
                      tries: int = 5) -> dict | None:
        """Read, change and write back a worker znode's JSON; return it as it now is, or
        None if the znode is gone (or kept moving for `tries` reads).

        `change(data)` edits the dict in place and returns False to leave it as it is.
        Two writers share the znode (the worker: its prefetch and its drain mark; the
        dashboard and the shell: a drain request), so the write is versioned, and a
        version that moved meanwhile means read again. A write retried after a
        connection loss that had in fact landed meets BadVersion the same way: `change`
        then finds its edit already made and returns False.
        """
        path = self.layout.worker(worker_id)
        for _ in range(tries):
            try:
                raw, stat = self.retry(self.client.get, path)
            except NoNodeError:
                return None
            data = records.loads(raw, path=path)
            if not change(data):
                return data
            try:
                self.retry(self.client.set, path, records.dumps(data), version=stat.version)
            except NoNodeError:
                return None
            except BadVersionError:
                continue
            return data
        return None

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

    def assign(self, fence: str, items: Iterable[tuple[str, str, str]],
               rate_states: dict[str, bytes] | None = None,
               sweep: Iterable[tuple[str, str]] = ()) -> list:
        """Move pending jobs to workers: items are (queue, job_node, worker_id).

        One multi for the batch, fenced by the leader's own sequential election znode,
        whose name can never come back once its session is gone. `rate_states` are the
        buckets of the rate-limited queues in the batch, as this hand-out leaves them
        (ratelimit.py): written in the same multi, after the batch's ops, so a bucket
        kept in ZooKeeper never disagrees with what was handed out. `sweep` are empty
        shards, (queue, shard), deleted last in the same multi (a job landed in one
        since fails it all: NotEmpty).
        """
        items, sweep = list(items), list(sweep)
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
            for queue, data in (rate_states or {}).items():
                txn.set_data(self.layout.rate_state(queue), data)
            for queue, shard in sweep:
                txn.delete(self.layout.shard(queue, shard))

        return self._commit_raw(build)

    def publish_rate_limits(self, fence: str, data: bytes) -> list:
        """Set the limits the leader keeps on `ratelimits` (tree.py), fenced by its
        election znode; return the multi's failures (index 0: the fence is gone)."""
        def build(txn):
            txn.check(fence, -1)
            txn.set_data(self.layout.ratelimits, data)

        failed = failures(self._commit_raw(build))
        if failed and failed[0][0] == 1 and isinstance(failed[0][1], NoNodeError):
            # ratelimits/ is made on first use, not by the skeleton.
            try:
                self.retry(self.client.ensure_path, self.layout.ratelimits)
            except NoAuthError as exc:  # an ACL on the root: a failure like the set's
                return [(1, exc)]
            failed = failures(self._commit_raw(build))
        return failed

    def rate_states(self, queues: Iterable[str]) -> dict[str, bytes | None]:
        """Read the buckets that leaders left for `queues` (None: never written), and
        make the znodes that are missing, so that an assignment multi can write them."""
        states: dict[str, bytes | None] = {}
        for queue in queues:
            path = self.layout.rate_state(queue)
            try:
                data, _ = self.retry(self.client.get, path)
            except NoNodeError:
                try:
                    self.retry(self.client.create, path, b"", makepath=True)
                except NodeExistsError:
                    pass  # made meanwhile (or by our own create, retried after a loss)
                data = None
            states[queue] = data or None
        return states

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

        return self.with_shards(build, [waiting])

    def promote(self, fence: str, names: Iterable[tuple[str, str, str]]) -> list:
        """Move due delayed jobs to their queue: names are (delayed_name, queue, job_node)."""

        names = list(names)

        def build(txn):
            txn.check(fence, -1)
            for delayed_name, queue, node in names:
                txn.create(self.layout.job(queue, node), b"")
                txn.delete(self.layout.delayed_job(delayed_name))

        waiting = [self.layout.job(queue, node) for _, queue, node in names]
        return self.with_shards(build, waiting)

    def requeue(self, fence: str, worker_id: str, job_id: str, queue: str, node: str,
                status: Versioned | None, *, held_alone: bool = False,
                ) -> tuple[list, StatusRecord | None]:
        """Hand a dead worker's job back to pending, noting the lost attempt; return the
        multi's results and, if the job was failed instead, its FAILED record.

        A job that was running when its worker vanished gets a WorkerLost error. After
        MAX_WORKER_LOSSES of those it is failed instead of handed back: a job that kills
        whole workers (not just its task process) must not take the cluster down in a
        loop. `retry()` (or the dashboard) can send it back on purpose.

        `held_alone`: the job is the oldest assignment the worker left, the one it may
        have begun without writing RUNNING (worker.UNRECORDED_START_MAX_S). A READY
        one is then counted as an attempt of that worker, lost with it.
        """
        lost_record = None
        final = False
        unrecorded = (held_alone and status is not None
                      and status.record.state == records.READY)
        if status is not None and (status.record.state == records.RUNNING or unrecorded):
            from .exceptions import WorkerLost

            record = status.record
            if unrecorded:
                now = records.now()
                record = record.evolve(attempts=record.attempts + 1,
                                       worker_ids=record.worker_ids + (worker_id,),
                                       started_at=record.started_at or now,
                                       last_attempted_at=now, retry_at=None)
            losses = 1 + sum(e.exception_class_path == WORKER_LOST for e in record.errors)
            final = losses >= MAX_WORKER_LOSSES
            lost = WorkerLost(
                (f"Worker {worker_id!r} vanished while it held this job alone, as "
                 f"attempt {record.attempts} (a short job held alone runs without a "
                 "RUNNING record, so that attempt may not have begun); "
                 if unrecorded else
                 f"Worker {worker_id!r} vanished while running attempt {record.attempts}; ")
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
            lost_record = lost_record.fit(self.options.max_record_bytes)
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

        results = self.with_shards(build, waiting)
        failed = failures(results)
        if failed and failed[0][0] != 0 and self.forget_bucket_if_gone(index, failed):
            index = self.index_path(lost_record)  # expired or purged meanwhile: remake
            results = self.with_shards(build, waiting)
        return results, lost_record if final else None

    def delete_shards(self, fence: str,
                      shards: list[tuple[str, str]]) -> set[tuple[str, str]]:
        """Delete empty shards, (queue, shard), fenced (`_delete_batched`); return those
        now gone (deleted here, or already by someone else). A gone fence raises
        NoNodeError.

        A submitter racing with this either lands its job first (NotEmpty: that shard
        stays) or meets NoNode and makes the shard again: no job is lost either way.
        """
        by_path = {self.layout.shard(queue, shard): (queue, shard) for queue, shard in shards}
        deleted, gone_before = self._delete_batched(fence, list(by_path))
        return {by_path[path] for path in deleted | gone_before}

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
        return self.with_shards(build, waiting)

    def delete_paths(self, fence: str | None, paths: list[str]) -> int:
        """Delete znodes (fenced if given, `_delete_batched`); return how many this call
        deleted. One already gone (someone else deleted it) is skipped, not fatal; a
        gone fence raises NoNodeError."""
        return len(self._delete_batched(fence, paths)[0])

    def _delete_batched(self, fence: str | None,
                        paths: list[str]) -> tuple[set[str], set[str]]:
        """Delete znodes in multis of 50 (fenced if given); return (deleted by this call,
        already gone). One that fails (NoNode, NotEmpty) fails its multi, which names
        its first failure only: that one is left out and the rest sent again. A gone
        fence raises NoNodeError."""
        deleted: set[str] = set()
        gone_before: set[str] = set()
        first = 1 if fence else 0  # the index of the first delete in a multi
        for start in range(0, len(paths), 50):
            batch = paths[start:start + 50]
            while batch:
                def build(txn, batch=batch):
                    if fence:
                        txn.check(fence, -1)
                    for path in batch:
                        txn.delete(path)

                failed = failures(self._commit_raw(build))
                if not failed:
                    deleted.update(batch)
                    break
                index, error = failed[0]
                if index < first:
                    raise NoNodeError(f"fence {fence} is gone")
                path = batch.pop(index - first)
                if isinstance(error, NoNodeError):
                    gone_before.add(path)
        return deleted, gone_before

    def delete_empty(self, fence: str, path: str) -> list:
        """Delete an empty shard, pending or delayed, or a due minute (fenced); return the
        failures (NotEmpty, NoNode, the fence) if any. A writer racing with this meets
        NoNode and makes the parents again (`make_shards`)."""
        def build(txn):
            txn.check(fence, -1)
            txn.delete(path)

        return failures(self._commit_raw(build))

    def move_unsharded_delayed(self, fence: str, names: list[str]) -> list:
        """Move delayed jobs written before sharding (delayed/{name}) into their shards,
        in one fenced multi: each job is in exactly one of the two places."""
        def build(txn):
            txn.check(fence, -1)
            for name in names:
                txn.create(self.layout.delayed_job(name), b"")
                txn.delete(self.layout.unsharded_delayed_job(name))

        waiting = [self.layout.delayed_job(name) for name in names]
        return self.with_shards(build, waiting)

    def _commit_raw(self, build):
        txn = self.client.transaction()
        build(txn)
        return txn.commit()


@dataclass(frozen=True, slots=True)
class _Bound:
    limit: float     # time.monotonic() deadline
    seconds: float   # the bound, for messages
    hosts: str


def mark_draining(data: dict) -> bool:
    """A change for Store.update_worker: the worker is draining (written once)."""
    if data.get("draining"):
        return False
    data["draining"] = True
    return True


class _BoundedClient:
    """A KazooClient whose reads, writes and multis wait for an answer until a deadline.

    Only the calls Store and the backend make are here; anything else (state, Lock,
    handler) goes to the client itself.
    """

    def __init__(self, client, bound: _Bound):
        self._client = client
        self._bound = bound

    def __getattr__(self, name):
        return getattr(self._client, name)

    def wait(self, start: Callable):
        """Send a request with `start()` (an *_async call) and wait until the deadline."""
        bound = self._bound
        remaining = bound.limit - time.monotonic()
        if remaining <= 0:  # do not queue a request nobody will wait for
            raise self._late()
        async_result = start()
        try:
            return async_result.get(timeout=remaining)
        except self._client.handler.timeout_exception as exc:
            raise self._late() from exc

    def _late(self) -> ZooKeeperUnavailableError:
        bound = self._bound
        return ZooKeeperUnavailableError(
            f"ZooKeeper at {bound.hosts!r} did not answer within {bound.seconds:g}s "
            "(CONNECT_TIMEOUT): the ensemble is unreachable or has lost its quorum."
        )

    def get(self, path, watch=None):
        return self.wait(lambda: self._client.get_async(path, watch=watch))

    def sync(self, path):
        return self.wait(lambda: self._client.sync_async(path))

    def get_children(self, path, watch=None):
        return self.wait(lambda: self._client.get_children_async(path, watch=watch))

    def exists(self, path, watch=None):
        return self.wait(lambda: self._client.exists_async(path, watch=watch))

    def create(self, path, value=b"", **kwargs):
        return self.wait(lambda: self._client.create_async(path, value, **kwargs))

    def set(self, path, value, version=-1):
        return self.wait(lambda: self._client.set_async(path, value, version=version))

    def delete(self, path, version=-1):
        return self.wait(lambda: self._client.delete_async(path, version=version))

    def ensure_path(self, path):
        return self.wait(lambda: self._client.ensure_path_async(path))

    def transaction(self):
        return _BoundedTransaction(self._client.transaction(), self)


class _BoundedTransaction:
    """A kazoo transaction whose commit waits until the deadline of its client view."""

    def __init__(self, txn, client: _BoundedClient):
        self._txn = txn
        self._client = client

    def __getattr__(self, name):
        return getattr(self._txn, name)

    def commit(self):
        return self._client.wait(self._txn.commit_async)
