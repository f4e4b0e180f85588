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

Jobs submitted while the previous multi is still unanswered share the next one (as
Nagle's algorithm does for TCP segments): a loop of fast submits sends a multi per round
trip with every job submitted meanwhile, up to BATCH_JOBS and BATCH_BYTES, so ZooKeeper
and this process handle one request for many jobs. A job waits at most for the reply to
the multi before it, never for a timer; a slow loop sends each job at once. A multi
creates whole jobs (status record + waiting node), as `submit_many` does.

The requests go through kazoo's async calls (`transaction().commit_async()`); kazoo has
no pipelining API of its own. The jobs of a multi that failed or whose outcome is unknown
(connection loss, timeout) are written again one by one with the synchronous
`Store.submit`, which is idempotent (the job id is fresh: NodeExists on its status node
means the earlier attempt landed).
"""

import logging
from collections import deque
from contextlib import contextmanager
from contextvars import ContextVar

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from django.tasks.signals import task_enqueued

from .exceptions import ZkTasksError, ZooKeeperUnavailableError
from .store import failures

logger = logging.getLogger(__name__)

WINDOW = 256               # jobs in flight; past it, the oldest multi is waited for
WINDOW_BYTES = 8_000_000   # ... and past this many bytes of records in flight (big payloads)
BATCH_JOBS = 64            # jobs per multi at most (a miss resends them one by one)
BATCH_BYTES = 256_000      # bytes of records per multi at most (jute.maxbuffer is 1 MB)
SHARDS_KEPT = 512  # parent paths remembered as made, per pipeline

# The open pipelines of this context, by backend alias. A context, not a thread: every
# coroutine of an event loop runs on one thread, and a threading.local let a pipelined()
# block in one ASGI request take the plain submit()s of the others (their jobs reported
# submitted, yet written only when that block ended, or never if the process died).
# asyncio gives each task its own copy of the context; a thread starts with an empty one.
_pipelines: ContextVar[dict | None] = ContextVar("zktasks_pipelines", default=None)


class SubmitPipeline:
    """The open pipeline of one context (a thread, or a coroutine) on one backend."""

    def __init__(self, backend):
        self.backend = backend
        self.store = backend.store
        self.in_flight: deque = deque()  # (jobs, async result, bytes) per multi sent
        self.in_flight_jobs = 0
        self.in_flight_bytes = 0
        self.buffer: list = []           # jobs waiting for the multi before them
        self.buffer_bytes = 0
        self.shards: set[str] = set()
        self.unconfirmed: list = []      # (record, result) a caught error named
        self.closed = False              # its block ended: submits write directly
        self.sent = 0                    # jobs submitted through the pipeline
        self.multis = 0
        self.resent = 0

    def send(self, record, result):
        """Send the job (alone or with the next ones) without waiting; return its result."""
        store = self.store
        if record.unique_key:
            # The answer (this job, or the key's holder) is needed now: wait for it. The
            # jobs submitted before it go first.
            self._send_buffer()
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
        job_data = store.job_data(record)
        size = len(status_data) + len(job_data)
        if self.buffer and self.buffer_bytes + size > BATCH_BYTES:
            # Sent first, not with this job: the checks after the append let a buffer
            # just under BATCH_BYTES take a job of up to a megabyte, and a multi over
            # jute.maxbuffer makes the server drop this process's connection.
            self._send_buffer()
        # Wait for room before queueing this job, not after: if the wait raises, this job
        # was neither buffered nor sent, so submitting it again makes no second job.
        self._make_room(record, size)
        self.buffer.append((record, result, status_path, status_data, job_path, job_data))
        self.buffer_bytes += size
        self.sent += 1
        if (not self.in_flight or self.in_flight[-1][1].ready()
                or len(self.buffer) >= BATCH_JOBS
                or self.buffer_bytes >= min(BATCH_BYTES, WINDOW_BYTES)):
            self._send_buffer()
        return result

    def _make_room(self, record, size: int) -> None:
        """Wait for the oldest multis until `record` fits in the window (jobs and bytes
        returned but not confirmed); raise, saying it was not submitted, if they fail."""
        lost: list[tuple] = []
        receiver_error = None
        while self.in_flight and (
                self.in_flight_jobs + len(self.buffer) + 1 > WINDOW
                or self.in_flight_bytes + self.buffer_bytes + size > WINDOW_BYTES):
            try:
                lost += self._collect(*self.in_flight.popleft())
            except Exception as exc:  # a task_enqueued receiver raised; its jobs are written
                receiver_error = receiver_error or exc
        not_sent = f"This job ({record.id}) was not submitted: submit it again."
        if lost:
            # A caller may catch this and go on: flush() tries these jobs again, so the
            # block's end still answers for every job it returned.
            self.unconfirmed += [(job, result) for job, result, _ in lost]
            raise self._error(lost, not_sent)
        if receiver_error is not None:
            receiver_error.add_note(f"zktasks.pipelined(): {not_sent}")
            raise receiver_error

    def release(self, job_id: str) -> None:
        """Send the buffer now if it holds `job_id`. A job asked about (read, waited
        for, cancelled) must be on its way: buffered, it was not found (JobNotFound),
        yet written when the block ended, a job the caller failed to cancel then ran.
        The read goes after the multi on the same session, so it sees it once landed."""
        if any(job[0].id == job_id for job in self.buffer):
            self._send_buffer()

    def _send_buffer(self) -> None:
        """Send the jobs waiting in one multi, without waiting for it."""
        if not self.buffer:
            return
        jobs, size = self.buffer, self.buffer_bytes
        self.buffer, self.buffer_bytes = [], 0
        txn = self.store.raw_client.transaction()
        for _, _, status_path, status_data, job_path, job_data in jobs:
            txn.create(status_path, status_data)
            txn.create(job_path, job_data)
        self.in_flight.append(([(job[0], job[1]) for job in jobs], txn.commit_async(), size))
        self.in_flight_jobs += len(jobs)
        self.in_flight_bytes += size
        self.multis += 1

    def _collect(self, jobs, pending, size: int) -> list[tuple]:
        """Wait for one multi; write its jobs again one by one unless it surely landed.

        Return (record, result, error) for the jobs that may not be written.
        """
        self.in_flight_jobs -= len(jobs)
        self.in_flight_bytes -= size
        try:
            ok = not failures(pending.get(timeout=self.store.options.connect_timeout))
        except Exception as exc:  # connection loss, session expiry, timeout: unknown
            logger.debug("pipelined submit of %d job(s): %r; writing them again",
                         len(jobs), exc)
            ok = False
        if ok:
            raised = None
            for _, result in jobs:
                try:
                    task_enqueued.send(type(self.backend), task_result=result)
                except Exception as exc:  # a receiver's: the others still hear of theirs
                    raised = raised or exc
            if raised is not None:
                raise raised
            return []
        return self._write_each(jobs)

    def _write_each(self, jobs) -> list[tuple]:
        """Write (record, result) jobs one by one, idempotently; return those that may
        not be written, as (record, result, error)."""
        lost: list[tuple] = []
        for record, result in jobs:
            if lost and isinstance(lost[0][2], ZooKeeperUnavailableError):
                # Out of reach for the one before: do not wait CONNECT_TIMEOUT per job.
                lost.append((record, result, lost[0][2]))
                continue
            self.resent += 1
            try:
                self.backend.write(record, result)  # idempotent; sends task_enqueued itself
            except Exception as exc:
                lost.append((record, result, exc))
        return lost

    def flush(self) -> None:
        """Wait until every job sent is written; raise if some may not be."""
        self._send_buffer()
        lost: list[tuple] = []
        receiver_error = None
        while self.in_flight:
            try:
                lost += self._collect(*self.in_flight.popleft())
            except Exception as exc:  # a task_enqueued receiver raised; its jobs are written
                receiver_error = receiver_error or exc
        unconfirmed, self.unconfirmed = self.unconfirmed, []
        if unconfirmed:
            # Named by an error the block caught and went on from; a job that landed
            # meanwhile is recognised by its status node (NodeExists), not written twice.
            lost += self._write_each(unconfirmed)
        if lost:
            raise self._error(lost)
        if receiver_error is not None:
            raise receiver_error  # once every job is written
        if self.resent:
            logger.info("pipelined(): %d of %d jobs were written again one by one",
                        self.resent, self.sent)

    def _error(self, lost: list[tuple], more_text: str = "") -> ZkTasksError:
        ids = ", ".join(record.id for record, _, _ in lost[:10])
        more = f" and {len(lost) - 10} more" if len(lost) > 10 else ""
        first = lost[0][2]
        error = (ZooKeeperUnavailableError if isinstance(first, ZooKeeperUnavailableError)
                 else ZkTasksError)  # e.g. NoAuth: the cause is chained below
        message = (
            f"{len(lost)} of the {self.sent} jobs submitted in a pipelined() block may not "
            f"have been written ({ids}{more}): {first} Call get_result(id) for each once "
            f"ZooKeeper answers, rather than submitting again. {more_text}"
        ).rstrip()
        exc = error(message)
        exc.__cause__ = first
        return exc


def current(backend) -> SubmitPipeline | None:
    """The pipeline this context has open on `backend`, if any. A task started inside a
    block inherits its context and may outlive it: once the block ended, it has none."""
    pipeline = (_pipelines.get() or {}).get(backend.alias)
    return None if pipeline is None or pipeline.closed else pipeline


@contextmanager
def pipelined(backend: str = DEFAULT_TASK_BACKEND_ALIAS):
    """Inside the block, submit() on `backend` (an alias of a ZooKeeperBackend) sends and
    returns; on leaving it, every job is written (see the module's docstring). The block
    covers this context: this thread, or this coroutine and the tasks it starts.

    Nested blocks share the outermost one. If the block raises, the jobs already
    submitted are still written before the exception propagates; a note on it names
    those that may not have been.
    """
    chosen = task_backends[backend]
    if not hasattr(chosen, "store"):
        # Immediate/Dummy backends in a user's tests: submits are immediate anyway.
        yield None
        return
    outer = current(chosen)
    if outer is not None:
        yield outer
        return
    from .backend import refuse_sync_signal_in_a_loop  # backend imports this module

    refuse_sync_signal_in_a_loop(chosen, "zktasks.pipelined()")
    pipeline = SubmitPipeline(chosen)
    token = _pipelines.set({**(_pipelines.get() or {}), backend: pipeline})
    try:
        try:
            yield pipeline
        except BaseException as exc:
            try:
                pipeline.flush()
            except Exception as flush_error:
                logger.exception("pipelined(): writing the jobs submitted before an error")
                # The block's error propagates, not flush's: carry the jobs flush could
                # not confirm on it, or the caller never learns which may be missing.
                exc.add_note(f"zktasks.pipelined(), writing the jobs submitted before this "
                             f"error: {flush_error}")
            raise
        pipeline.flush()
    finally:
        pipeline.closed = True
        _pipelines.reset(token)
