"""Pipelined submission: submit() calls that do not wait, one wait when the block ends.

A plain `submit()` returns once ZooKeeper has written the job to its log (a quorum's
fsync): one round trip per job, about 1 ms on an idle server and 2 ms on a busy one, so
a loop of submits from one thread tops out at 500-1,300 jobs/s. Inside

    with zktasks.pipelined():
        for user in users:
            send_welcome.submit(user)

each submit sends its multi and returns at once; ZooKeeper commits the requests in
flight together (one log write for many). When the block ends every job has been
written, or an error says which ones may not have been. The trade: inside the block a
returned result may name a job that is not durable yet, and a crash of this process
before the block ends can lose the jobs still in flight. That is the only difference
from submit() (same records, same tree), which is why it is opt-in.

The requests go through kazoo's async calls (`transaction().commit_async()`); kazoo has
no pipelining API of its own. A multi that failed or whose outcome is unknown (connection
loss, timeout) is written again with the synchronous `Store.submit`, which is idempotent
(the job id is fresh: NodeExists on its status node means the earlier attempt landed).
"""

import logging
import threading
from collections import deque
from contextlib import contextmanager

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from django.tasks.signals import task_enqueued

from .exceptions import ZkTasksError, ZooKeeperUnavailableError
from .store import failures

logger = logging.getLogger(__name__)

WINDOW = 256               # multis in flight; past it, the oldest is waited for
WINDOW_BYTES = 8_000_000   # ... and past this many bytes of records in flight (big payloads)
SHARDS_KEPT = 512  # parent paths remembered as made, per pipeline

_local = threading.local()


class SubmitPipeline:
    """The open pipeline of one thread on one backend."""

    def __init__(self, backend):
        self.backend = backend
        self.store = backend.store
        self.in_flight: deque = deque()
        self.in_flight_bytes = 0
        self.shards: set[str] = set()
        self.sent = 0
        self.resent = 0

    def send(self, record, result):
        """Send the job's multi without waiting; return its result."""
        store = self.store
        if record.unique_key:
            # The answer (this job, or the key's holder) is needed now: wait for it.
            return self.backend.write(record, result)
        status_path = store.layout.status(record.id)
        job_path = store.waiting_path(record)
        parent = job_path.rsplit("/", 1)[0]  # a queue's shard, or delayed/
        if parent not in self.shards:
            # Parents are made synchronously, once per queue and second (and once for
            # delayed/): not a NoNode, and a resend, for every job in flight when a new
            # second starts or the tree is fresh.
            self.backend._bounded(
                store, lambda: (store.ensure_queue(record.queue), store.make_shards([job_path])),
                f"Job {record.id!r} ({record.task}) was not submitted:", "Nothing was written.")
            if len(self.shards) >= SHARDS_KEPT:
                self.shards.clear()
            self.shards.add(parent)
        status_data = record.to_bytes()
        txn = store.raw_client.transaction()
        txn.create(status_path, status_data)
        txn.create(job_path, store.job_data(record))
        self.in_flight.append((record, result, txn.commit_async(), len(status_data)))
        self.in_flight_bytes += len(status_data)
        self.sent += 1
        while len(self.in_flight) > WINDOW or (self.in_flight_bytes > WINDOW_BYTES
                                               and len(self.in_flight) > 1):
            self._collect(*self.in_flight.popleft())
        return result

    def _collect(self, record, result, pending, size: int) -> None:
        """Wait for one multi; write the job again synchronously unless it surely landed."""
        self.in_flight_bytes -= size
        try:
            ok = not failures(pending.get(timeout=self.store.options.connect_timeout))
        except Exception as exc:  # connection loss, session expiry, timeout: unknown
            logger.debug("pipelined submit of %s: %r; writing it again", record.id, exc)
            ok = False
        if ok:
            task_enqueued.send(type(self.backend), task_result=result)
        else:
            self.resent += 1
            self.backend.write(record, result)  # idempotent; sends task_enqueued itself

    def flush(self) -> None:
        """Wait until every job sent is written; raise if some may not be."""
        lost: list[tuple[str, Exception]] = []
        while self.in_flight:
            item = self.in_flight.popleft()
            record = item[0]
            try:
                self._collect(*item)
            except Exception as exc:
                lost.append((record.id, exc))
        if lost:
            ids = ", ".join(job_id for job_id, _ in lost[:10])
            more = f" and {len(lost) - 10} more" if len(lost) > 10 else ""
            first = lost[0][1]
            error = (ZooKeeperUnavailableError if isinstance(first, ZooKeeperUnavailableError)
                     else ZkTasksError)  # e.g. NoAuth: the cause is chained below
            raise error(
                f"{len(lost)} of the {self.sent} jobs submitted in a pipelined() block may not "
                f"have been written ({ids}{more}): {first} Call get_result(id) for each once "
                "ZooKeeper answers, rather than submitting again."
            ) from first
        if self.resent:
            logger.info("pipelined(): %d of %d jobs were written again one by one",
                        self.resent, self.sent)


def current(backend) -> SubmitPipeline | None:
    """The pipeline this thread has open on `backend`, if any."""
    return getattr(_local, "pipelines", {}).get(backend.alias)


@contextmanager
def pipelined(backend: str = DEFAULT_TASK_BACKEND_ALIAS):
    """Inside the block, submit() on `backend` (an alias of a ZooKeeperBackend) sends and
    returns; on leaving it, every job is written (see the module's docstring).

    Nested blocks share the outermost one. If the block raises, the jobs already
    submitted are still written before the exception propagates.
    """
    chosen = task_backends[backend]
    if not hasattr(chosen, "store"):
        # Immediate/Dummy backends in a user's tests: submits are immediate anyway.
        yield None
        return
    pipelines = _local.__dict__.setdefault("pipelines", {})
    if backend in pipelines:
        yield pipelines[backend]
        return
    pipeline = pipelines[backend] = SubmitPipeline(chosen)
    try:
        try:
            yield pipeline
        except BaseException:
            try:
                pipeline.flush()
            except Exception:
                logger.exception("pipelined(): writing the jobs submitted before an error")
            raise
        pipeline.flush()
    finally:
        del pipelines[backend]
