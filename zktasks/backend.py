"""ZooKeeperBackend: Django's task backend API over the zktasks tree."""

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from datetime import UTC, datetime, timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.core.exceptions import SynchronousOnlyOperation
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    Task,
    TaskError,
    TaskResultStatus,
)
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.inspect import get_func_args
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from . import envelope, records, schedule_state, serialization, statuswatch
from .client import get_client
from .conf import ENTRY_KEYS, OPTION_KEYS, Options
from .exceptions import (
    ConfigurationError,
    CorruptRecord,
    DeadLetterRefused,
    InvalidTaskError,
    JobCancelled,
    JobNotFound,
    PayloadVerificationError,
    RetryRefused,
    ScheduleNotFound,
    ZooKeeperUnavailableError,
)
from .pipeline import current as pipeline_of
from .records import StatusRecord
from .store import Store, failures, mark_draining
from .task import UnloadableValue, ZkTask, ZkTaskResult
from .tree import (
    BUCKET_MS,
    DUE_MS_LIMIT,
    QUEUE_RE,
    delayed_node_name,
    is_job_id,
    is_znode_name,
    job_node_name,
    parse_job_node,
    parse_shard,
)

logger = logging.getLogger(__name__)

# cancel_pending() fails up to BULK_CANCEL jobs in one multi, and at most about
# BULK_CANCEL_BYTES of status records: a request over ZooKeeper's jute.maxbuffer (1 MB by
# default) is not refused but drops the connection, so it must never be sent.
BULK_CANCEL = 50
BULK_CANCEL_BYTES = 400_000


class ZooKeeperBackend(BaseTaskBackend):
    """Store jobs in ZooKeeper for `manage.py runworker` processes to run."""

    task_class = ZkTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        queues = params.get("QUEUES")
        if queues is not None and (isinstance(queues, str)
                                   or not isinstance(queues, list | tuple | set | frozenset)):
            # Django would make a set of its characters: fail clearly instead.
            raise ConfigurationError(
                f"TASKS[{alias!r}]['QUEUES'] is {queues!r}; give a list of queue names, "
                "e.g. ['default', 'emails'] ([] accepts any name)."
            )
        super().__init__(alias, params)
        self._params = params
        self._conf: Options | None = None
        self._store: Store | None = None

    # -- configuration ---------------------------------------------------------------

    @property
    def conf(self) -> Options:
        """The parsed OPTIONS (Django keeps the raw dict in `self.conf`)."""
        if self._conf is None:
            self._conf = Options.from_params(self.alias, self._params)
        return self._conf

    @property
    def store(self) -> Store:
        """A Store on this process's shared client (the registry owns the session).

        Kept while the client is the same, so the Store's memo of the parents it has
        made survives between calls: without it every submit re-checked them (the bench
        measured 11 requests per submit instead of 1).
        """
        client = get_client(self.conf)
        store = self._store
        if store is None or store.raw_client is not client:
            store = self._store = Store(client, self.conf)
        return store

    def check(self, **kwargs):
        # All at once: one round trip to fix both keys beside OPTIONS and inside it.
        return self._misplaced_keys() + self._option_errors()

    def _option_errors(self) -> list:
        try:
            self.conf  # noqa: B018 - parsing is the check
        except ConfigurationError as exc:
            return [checks.Error(str(exc), id="zktasks.E001",
                                 hint="See the TASKS example in zktasks' README.")]
        bad = sorted((q for q in self.queues if not isinstance(q, str) or not QUEUE_RE.match(q)),
                     key=repr)
        if bad:
            return [checks.Error(
                f"TASKS[{self.alias!r}]['QUEUES'] has names that cannot be znode names: "
                f"{bad!r}.", id="zktasks.E002",
                hint="Use letters, digits, '_', '-' and '.' (not first).",
            )]
        return self._schedule_errors()

    def _misplaced_keys(self) -> list:
        """Keys beside BACKEND, QUEUES and OPTIONS, which Django ignores: an option put
        there (HOSTS, as CACHES' LOCATION habit has it) silently meant the default
        (127.0.0.1:2181), and a typo (QUEUE) accepted every queue name."""
        unknown = sorted((key for key in self._params if key not in ENTRY_KEYS), key=str)
        if not unknown:
            return []
        where = f"TASKS[{self.alias!r}]"
        options = [key for key in unknown if key in OPTION_KEYS]
        others = [key for key in unknown if key not in OPTION_KEYS]
        errors = []
        if options:
            errors.append(checks.Error(
                f"{where} has {options!r} beside OPTIONS, where nothing reads them.",
                id="zktasks.E001",
                hint=f"Move them into {where}['OPTIONS'], e.g. "
                     f"{{'OPTIONS': {{{options[0]!r}: ...}}}}."))
        if others:
            errors.append(checks.Error(
                f"{where} has unknown keys {others!r}; the known ones are "
                f"{sorted(ENTRY_KEYS)!r}.", id="zktasks.E001",
                hint="zktasks' own settings go in OPTIONS; see the TASKS example in "
                     "zktasks' README."))
        return errors

    def _schedule_errors(self) -> list:
        """A schedule's task must import and take its args: otherwise the leader only
        logs the failure once, at the first tick, and no job is ever submitted."""
        from types import SimpleNamespace

        from django.utils.module_loading import import_string

        errors = []
        for schedule in self.conf.schedules:
            where = (f"TASKS[{self.alias!r}]['OPTIONS']['SCHEDULES'][{schedule.name!r}]"
                     f"['task'] = {schedule.task!r}")
            try:
                target = import_string(schedule.task)
            except Exception as exc:  # its module may fail in any way: say so, not crash
                errors.append(checks.Error(
                    f"{where} cannot be imported: {type(exc).__name__}: {exc}.",
                    id="zktasks.E003",
                    hint="Give the dotted path of a task: 'myapp.tasks.cleanup'."))
                continue
            if not isinstance(target, Task):
                if not callable(target):
                    errors.append(checks.Error(f"{where} is not a task or a function.",
                                               id="zktasks.E003"))
                    continue
                target = SimpleNamespace(func=target, module_path=schedule.task,
                                         takes_context=False)
            try:
                _check_arguments(target, schedule.args, schedule.kwargs)
            except TypeError as exc:
                errors.append(checks.Error(
                    f"{where}: its 'args' and 'kwargs' do not fit: {exc}", id="zktasks.E004"))
        return errors

    # -- validation --------------------------------------------------------------------

    def validate_task(self, task):
        """Accept what Django's backends accept, plus functions that travel by value.

        Each refusal that Django's BaseTaskBackend also makes begins with Django's own
        message for it, so code and tests written against Django's backends that check
        the message still match; the detail zktasks adds comes after. (A queue name that
        cannot be a znode name is zktasks' own refusal, checked first.)
        """
        if task.takes_context:
            args = get_func_args(task.func)
            if not args or args[0] != "context":
                raise InvalidTaskError(
                    "Task takes context but does not have a first argument of 'context'. "
                    f"Name the first argument of {task.module_path!r} 'context'."
                )
        priority = task.priority
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int | float)
            or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY
            or int(priority) != priority  # 3.0 is whole, as Django's check accepts it
        ):
            raise InvalidTaskError(
                f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
                f"{TASK_MAX_PRIORITY}. Priority {priority!r} of task {task.module_path!r} "
                "is not."
            )
        if task.run_after is not None:
            if not isinstance(task.run_after, datetime):
                raise InvalidTaskError(
                    f"run_after is {task.run_after!r}; give a datetime (an aware one)."
                )
            if settings.USE_TZ and timezone.is_naive(task.run_after):
                raise InvalidTaskError(
                    f"run_after must be an aware datetime. {task.run_after!r} is naive; "
                    "use e.g. django.utils.timezone.now() + timedelta(minutes=5)."
                )
            if _aware(task.run_after).timestamp() * 1000 >= DUE_MS_LIMIT:
                raise InvalidTaskError(
                    f"run_after {task.run_after!r} is too far ahead: it must be before "
                    f"{datetime.fromtimestamp(DUE_MS_LIMIT / 1000, UTC):%Y-%m-%d %H:%M} UTC "
                    "(delayed jobs are named by their due time in milliseconds).")
        queue = task.queue_name
        if not isinstance(queue, str) or not QUEUE_RE.match(queue):
            raise InvalidTaskError(
                f"Queue name {queue!r} is invalid; use letters, digits, '_', '-' and '.'."
            )
        if self.queues and queue not in self.queues:
            raise InvalidTaskError(
                f"Queue '{queue}' is not valid for backend. It is not one of the queues of "
                f"backend {self.alias!r} ({sorted(self.queues)!r}); add it to "
                f"TASKS[{self.alias!r}]['QUEUES'] or submit to one of those."
            )

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(self, task, args, kwargs):
        record, result = self.prepare(task, args, kwargs)
        pipeline = pipeline_of(self)
        if pipeline is not None:
            return pipeline.send(record, result)  # inside `with zktasks.pipelined():`
        refuse_sync_signal_in_a_loop(self, "submit()")
        return self.write(record, result)

    async def aenqueue(self, task, args, kwargs):
        """enqueue() for async code: the loop is free while ZooKeeper answers.

        Django's default runs enqueue() through sync_to_async(thread_sensitive=True):
        one thread for every call of a context (of the process, outside a request), so
        concurrent submits queued behind each other, and during an outage the N-th waited
        N x CONNECT_TIMEOUT. The client is thread-safe and these calls touch no database,
        so they run on threads of their own; task_enqueued is sent with asend(), its sync
        receivers still thread-sensitive. A pipelined() block does not cover it: it
        writes at once.
        """
        record, result = await sync_to_async(self.prepare, thread_sensitive=False)(
            task, args, kwargs)
        written = await sync_to_async(self.write, thread_sensitive=False)(
            record, result, announce=False)
        if written is result:  # not the holder of a unique key
            await task_enqueued.asend(type(self), task_result=result)
        return written

    def enqueue_many(self, task, calls) -> list:
        """Submit one job per (args, kwargs) of `calls`, in batched multis.

        Every call is validated and serialized first: one bad call (an argument that
        cannot be pickled, a job over MAX_RECORD_BYTES) raises and nothing is written.
        Then the jobs are written in multis of up to a few hundred jobs (under
        ZooKeeper's request limit); each multi is whole jobs, so after a failure part
        way some batches are submitted and the rest are not, never half a job.
        A task with a unique key is refused: a key held by one job would refuse the
        whole multi around it; submit those one at a time.
        """
        if getattr(task, "unique_key", None):
            raise InvalidTaskError(
                f"Task {task.module_path!r} has a unique key; submit_many() does not take "
                "unique keys (one held key would refuse its whole batch): use submit()."
            )
        prepared = []
        for number, call in enumerate(calls):
            if not (isinstance(call, tuple | list) and len(call) == 2
                    and isinstance(call[0], tuple | list) and isinstance(call[1], dict)):
                raise InvalidTaskError(
                    f"submit_many() item {number} is {call!r}; give (args, kwargs) pairs, "
                    "e.g. [((1, 2), {}), ((3,), {'b': 4})]."
                )
            try:
                prepared.append(self.prepare(task, call[0], call[1]))
            except Exception as exc:  # the same errors as submit(), saying which call
                exc.add_note(f"submit_many() item {number}; nothing was written.")
                raise
        refuse_sync_signal_in_a_loop(self, "submit_many()")
        store = self.store
        done = 0

        def written(count):
            nonlocal done
            done += count

        try:
            # Each multi bounded by CONNECT_TIMEOUT, as submit() is: in an outage the
            # call fails instead of waiting in kazoo's queue for ZooKeeper to return.
            store.submit_many((record for record, _ in prepared),
                              around_chunk=store.bounded, written=written)
        except ZooKeeperUnavailableError as exc:
            raise self._submitted_in_part(prepared, done, exc) from exc
        for _, result in prepared:
            task_enqueued.send(type(self), task_result=result)
        return [result for _, result in prepared]

    def _submitted_in_part(self, prepared, done: int, exc) -> ZooKeeperUnavailableError:
        """The error of a submit_many() that stopped after `done` jobs were written: it
        says which were written (announced, on the error as `submitted`) and which are
        unknown (`not_known`), so that a caller submits again only what is missing."""
        landed = [result for _, result in prepared[:done]]
        for result in landed:
            task_enqueued.send(type(self), task_result=result)
        error = ZooKeeperUnavailableError(
            f"submit_many() stopped after writing {done:,} of {len(prepared):,} jobs: {exc} "
            "The first ones are written (the error's `submitted` results). The next batch "
            "may or may not have been written, the rest were not (the error's `not_known` "
            "results): check those with get_result(id) before submitting them again, or "
            "that batch would run twice.")
        error.submitted = landed
        error.not_known = [result for _, result in prepared[done:]]
        return error

    def prepare(self, task, args, kwargs, *, job_id: str | None = None):
        """Validate and serialize a submission; raise on bad input; write nothing."""
        try:
            self.validate_task(task)
        except InvalidTask as exc:
            if isinstance(exc, InvalidTaskError):
                raise
            raise InvalidTaskError(str(exc)) from exc
        _check_arguments(task, args, kwargs)
        from .tree import new_job_id

        job_id = job_id or new_job_id()
        blob = serialization.dump_call(
            task.func, args, kwargs, task_path=task.module_path,
            by_value=getattr(task, "by_value", None),
            policy=serialization.RetryPolicy(getattr(task, "backoff", None),
                                             getattr(task, "retry_on", None)),
        )
        # The payload is the pickle in base64 (4/3 of it) in the record: a pickle too
        # large already is refused now, before the envelope's and the JSON's copies,
        # each as large again (a 200 MB argument took 1 GB before it was refused).
        self.store.check_job_size(task.module_path, len(blob) * 4 // 3, at_least=True)
        conf = self.conf
        record = StatusRecord(
            id=job_id,
            task=task.module_path,
            backend=self.alias,
            queue=task.queue_name,
            priority=int(task.priority),  # 3.0 from Django code: names need an int
            enqueued_at=records.now(),
            max_attempts=getattr(task, "max_attempts", 1),
            timeout=getattr(task, "timeout", None),
            takes_context=task.takes_context,
            run_after=_aware(task.run_after),
            unique_key=getattr(task, "unique_key", None),
            result_ttl=getattr(task, "result_ttl", None),
            args_repr=serialization.short_repr(args, kwargs),
            payload=envelope.seal(blob, job_id=job_id, kind=envelope.PAYLOAD,
                                  key=conf.signing_key),
        )
        self.store.check_size(record, len(record.to_bytes()))
        result = self.build_result(record, task=task, args=list(args), kwargs=dict(kwargs))
        return record, result

    def write(self, record: StatusRecord, result, *, announce: bool = True):
        """Write a prepared submission; return its result (or the unique key's holder).
        `announce`: send task_enqueued (aenqueue sends it itself, with asend)."""
        store = self.store
        holder = self._bounded(
            store, lambda: store.submit(record),
            f"Job {record.id!r} ({record.task}) may or may not have been submitted:",
            "It may still be created when ZooKeeper is back: call "
            f"get_result({record.id!r}) later to find out, rather than submitting again "
            "(that would make a second job).")
        if holder is not None:
            logger.info("unique key held key=%r job=%s", record.unique_key, holder)
            return self.get_result(holder)
        if announce:
            task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue_on_commit(self, task, args, kwargs, *, using=None):
        """Prepare now (bad input raises here); write when the transaction commits."""
        from django.db import transaction

        record, result = self.prepare(task, args, kwargs)
        transaction.on_commit(lambda: self.write(record, result), using=using)
        return result

    # -- results -----------------------------------------------------------------------

    async def aget_result(self, result_id):
        """get_result() on a thread of its own (see aenqueue), not Django's one
        thread-sensitive thread."""
        return await sync_to_async(self.get_result, thread_sensitive=False)(result_id)

    def get_result(self, result_id):
        return self.build_result(self.status_record(result_id))

    def status_record(self, job_id: str) -> StatusRecord:
        """The job's status record as stored, nothing unpickled (get_result loads its
        arguments and value); raises JobNotFound, or ZooKeeperUnavailableError once a
        web-facing bound passes."""
        _known_shape(job_id)
        self._release(job_id)
        store = self.store
        found = self._bounded(
            store, lambda: store.read_status(job_id),
            f"The state of job {job_id!r} cannot be read now:",
            "Try again once the ensemble answers; the job itself is not affected.")
        if found is None:
            raise JobNotFound(
                f"No job has the id {job_id!r} (never submitted, or expired after "
                "RESULT_TTL)."
            )
        return found.record

    def build_result(self, record: StatusRecord, *, task=None, args=None, kwargs=None,
                     peek: bool = False):
        """Turn a status record into a ZkTaskResult, loading only verified pickles;
        `peek`: its return value as serialization.peek_value reads it (a worker process,
        for its signals)."""
        if task is None or args is None:
            func, args, kwargs, policy = self._load_call(record)
            task = self._task_for(record, func, policy)
        return_value = self.return_value_of(record, peek=peek)
        result = ZkTaskResult(
            task=task,
            id=record.id,
            status=TaskResultStatus(record.state),
            enqueued_at=_local(record.enqueued_at),
            started_at=_local(record.started_at),
            finished_at=_local(record.finished_at),
            last_attempted_at=_local(record.last_attempted_at),
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[TaskError(exception_class_path=e.exception_class_path,
                              traceback=e.traceback) for e in record.errors],
            worker_ids=list(record.worker_ids),
            queue_name=record.queue,
            extra={"attempts": record.attempts, "task_path": record.task},
        )
        object.__setattr__(result, "_return_value", return_value)
        return result

    def return_value_of(self, record: StatusRecord, *, peek: bool = False):
        """The verified return value of a SUCCESSFUL record (else None), or an
        UnloadableValue that says why it cannot be had here."""
        if record.state != records.SUCCESSFUL or record.result is None:
            return None
        try:
            if peek:
                return serialization.peek_value(envelope.open_envelope(
                    record.result, job_id=record.id, kind=envelope.RESULT,
                    keys=self.conf.verify_keys))
            return envelope.load(record.result, job_id=record.id, kind=envelope.RESULT,
                                 keys=self.conf.verify_keys)
        except Exception as exc:
            # The status stays readable; only return_value raises (ZkTaskResult).
            logger.warning("result not loadable job=%s: %r", record.id, exc)
            return UnloadableValue(record.id, exc)

    def _load_call(self, record: StatusRecord):
        """Return (function, args, kwargs) of a record, from its verified payload.

        A record whose payload is missing or refused still gives a result (its errors
        say why): the function is looked up by path when possible, the arguments are
        left empty, and nothing unverified is unpickled.
        """
        if record.payload is not None:
            try:
                blob = envelope.open_envelope(record.payload, job_id=record.id,
                                              kind=envelope.PAYLOAD,
                                              keys=self.conf.verify_keys)
                call = serialization.load_call(blob)
                return call.func, call.args, call.kwargs, call.policy
            except PayloadVerificationError as exc:
                logger.warning("payload not loaded job=%s: %s", record.id, exc)
            except Exception as exc:  # verified, but its code is not importable here
                logger.warning("payload not loadable job=%s: %r", record.id, exc)
        module, _, qualname = record.task.rpartition(".")
        func = serialization.find_local(module, qualname) or _payload_unavailable
        return func, (), {}, None

    def _task_for(self, record: StatusRecord, func, policy=None):
        """The task as the job was submitted: its options come from the record, and its
        retry policy from the payload when that was loaded."""
        fields = dict(
            func=func, backend=self.alias, queue_name=record.queue, priority=record.priority,
            takes_context=record.takes_context, max_attempts=record.max_attempts,
            timeout=record.timeout, result_ttl=record.result_ttl,
            run_after=_local(record.run_after), unique_key=record.unique_key,
        )
        if policy is not None:
            if policy.backoff is not None:
                fields["backoff"] = policy.backoff
            fields["retry_on"] = policy.retry_on
        try:
            return self.task_class(**fields)
        except InvalidTask:
            # The settings changed since (queue removed from QUEUES): the record still
            # stands, so describe it as it was submitted, without validating again.
            return serialization.unvalidated_task(self.task_class, {
                item.name: fields.get(item.name, item.default)
                for item in dataclasses.fields(self.task_class)})

    def wait(self, job_id: str, timeout: float | None = None):
        """Block on the job's own status znode (rule 7: no herd) until it finishes."""
        _known_shape(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._release(job_id)
        changed = threading.Event()
        wake = changed.set  # runs on kazoo's connection thread (handler.py): only signal
        with self._status_watch(job_id, wake) as on_change:
            first = True
            while True:
                changed.clear()
                finished, pause = self._wait_step(job_id, deadline, timeout, on_change,
                                                  first=first)
                if finished is not None:
                    return finished
                first = False
                changed.wait(pause)

    async def await_result(self, job_id: str, timeout: float | None = None):
        """wait() for async code: the same watch resolves an asyncio event, and each read
        runs on a thread of its own, so the loop is never blocked."""
        _known_shape(job_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._release(job_id)  # a commit_async: nothing here waits on ZooKeeper
        changed = asyncio.Event()

        def wake():
            # kazoo's connection thread; the watch can outlive this coroutine and its loop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(changed.set)

        step = sync_to_async(self._wait_step, thread_sensitive=False)
        # This process's client, connected off the loop: the first use connects, waiting
        # up to CONNECT_TIMEOUT (an unpickled result in a fresh ASGI worker stalled the
        # loop that long); _status_watch below then finds it made.
        await sync_to_async(lambda: self.store, thread_sensitive=False)()
        with self._status_watch(job_id, wake) as on_change:
            first = True
            while True:
                changed.clear()
                finished, pause = await step(job_id, deadline, timeout, on_change,
                                             first=first)
                if finished is not None:
                    return finished
                first = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), pause)

    @contextlib.contextmanager
    def _status_watch(self, job_id: str, wake):
        """The watch function a waiter reads the job's status with (statuswatch.py: one
        per znode, shared), `wake` registered on it while the block runs."""
        client, path = self.store.raw_client, self.store.layout.status(job_id)
        on_change = statuswatch.watches.join(client, path, wake)
        settled = False
        try:
            yield on_change
            settled = True
        except JobNotFound:
            settled = True  # no change will come for a job that is not there
            raise
        finally:
            statuswatch.watches.leave(client, path, wake, finished=settled)

    def _wait_step(self, job_id: str, deadline: float | None, timeout: float | None,
                   on_change, *, first: bool = False):
        """One read of a wait: (the finished result, None), or (None, seconds to wait for
        `on_change` before reading again). Raise JobNotFound, or TimeoutError once
        `deadline` has passed.

        A wait's `first` read that finds the job FAILED reads again once caught up
        (Store.catch_up): from a member that trails, it may be the attempt before a
        retry (or a dead letter's re-queue) just made by another process, and the wait
        returned that old failure at once. Only FAILED: nothing makes a successful job
        run again, so waits on finished jobs (the usual case) cost no round trip."""
        store = self.store
        remaining = None if deadline is None else deadline - time.monotonic()
        bound = self.conf.connect_timeout
        if remaining is not None:
            # A read gets at least WAIT_READ_FLOOR even when little or no time is
            # left, so wait(timeout=0) answers for a finished job: a healthy
            # ensemble replies in milliseconds, an unreachable one costs that long.
            bound = min(bound, max(remaining, WAIT_READ_FLOOR))
        try:
            with store.bounded(bound):
                found = store.read_status(job_id, watch=on_change)
                if first and found is not None and found.record.state == records.FAILED:
                    store.catch_up()
                    found = store.read_status(job_id, watch=on_change)
        except ZooKeeperUnavailableError:
            found = _UNKNOWN
        if found is None:
            raise JobNotFound(f"No job has the id {job_id!r}.")
        if found is not _UNKNOWN and found.record.is_finished:
            return self.build_result(found.record), None
        _warn_if_in_task(job_id)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            state = ("unknown: ZooKeeper did not answer" if found is _UNKNOWN
                     else found.record.state)
            raise TimeoutError(
                f"Job {job_id!r} did not finish within {timeout:g}s (state {state})."
            )
        # No watch is set while ZooKeeper does not answer: read again soon.
        longest = 1.0 if found is _UNKNOWN else 60.0
        return None, min(remaining, longest) if remaining is not None else longest

    def _release(self, job_id: str) -> None:
        """Inside `pipelined()`, send the job if it still waits in the buffer."""
        pipeline = pipeline_of(self)
        if pipeline is not None:
            pipeline.release(job_id)

    def cancel(self, job_id: str, *, force: bool = False) -> bool:
        """Cancel a job. Return True if it is cancelled now and will never run.

        A job no worker holds is failed at once (JobCancelled). A job a worker holds is
        asked to stop, and False is returned: the task sees `zktasks.cancel_requested()`
        turn True (or, with force=True and the process pool, its task process is
        terminated); a job not started yet on that worker never starts. A finished job:
        True if it was cancelled before, False otherwise.
        """
        _known_shape(job_id)
        self._release(job_id)
        store = self.store
        return self._bounded(
            store, lambda: self._cancel(store, job_id, force),
            f"Cancelling job {job_id!r} has an unknown outcome:",
            f"Once the ensemble answers, call get_result({job_id!r}) to see where the job "
            "is, and cancel it again if it has not finished.")

    def _cancel(self, store: Store, job_id: str, force: bool) -> bool:
        store.catch_up()  # decide on the job as it is now (a retry just made elsewhere)
        found = store.read_status(job_id)
        if found is None:
            raise JobNotFound(f"No job has the id {job_id!r}.")
        record = found.record
        if record.is_finished:
            return record.state == records.FAILED and any(
                e.exception_class_path.endswith("JobCancelled") for e in record.errors)
        if record.state != records.READY:
            self._request_cancel(store, job_id, force)
            return False
        final = _cancelled(record, f"Job {job_id!r} was cancelled before it ran.",
                           store.options.max_record_bytes)
        if self._fail_cancelled(store, found, final,
                                [(path, -1) for path in _waiting_places(store, record)]):
            return True
        # A worker holds it (assigned, maybe not started): ask that worker.
        self._request_cancel(store, job_id, force)
        return False

    def cancel_pending(self, queue: str, *, progress=None) -> int:
        """Cancel every job waiting in `queue` (Celery's `purge`, RQ's `empty`): each is
        recorded FAILED with JobCancelled, as by cancel(), and never runs. Returns how
        many were cancelled; `progress(count)` is called after each shard.

        Left alone: delayed jobs (a run_after or a retry's backoff not due yet), jobs a
        worker holds already, and jobs submitted while it runs into shards it has passed.
        One multiRead of the statuses per shard, then one multi per BULK_CANCEL jobs
        doing what a single cancel does for each. A job the leader assigns meanwhile
        makes its multi fail as a whole (its pending node is gone), and those jobs are
        then cancelled one multi each: nothing is both assigned and cancelled.
        """
        if not is_znode_name(queue):
            raise InvalidTask(f"{queue!r} is not a queue name.")
        store = self.store
        layout = store.layout
        cancelled = 0

        def cancel_all(names, place) -> None:
            nonlocal cancelled
            nodes = [(n, parse_job_node(n)) for n in names]
            nodes = [(n, parsed[1]) for n, parsed in nodes if parsed]
            status_of = store.read_statuses(job_id for _, job_id in nodes)
            ready = []
            for name, job_id in nodes:
                try:
                    found = status_of(job_id)
                except CorruptRecord:
                    continue  # the leader moves it aside to the dead letters
                if found is None or found.record.state != records.READY:
                    continue
                ready.append((found, _cancelled(
                    found.record, f"Job {job_id!r} was cancelled with the rest of queue "
                                  f"{queue!r} before it ran.",
                    store.options.max_record_bytes), place(name)))
            for chunk in _bulk_chunks(ready):
                if len(chunk) > 1 and self._fail_all_cancelled(store, chunk):
                    cancelled += len(chunk)
                    continue
                # One of them was assigned (or changed) meanwhile: one multi each.
                for found, final, where in chunk:
                    if self._fail_cancelled(store, found, final, [(where, -1)]):
                        cancelled += 1
            if progress is not None:
                progress(cancelled)

        def run() -> int:
            store.catch_up()  # with the jobs other processes have just submitted
            try:
                names = store.children(layout.queue(queue))
            except NoNodeError:
                return 0
            cancel_all(sorted(n for n in names if parse_job_node(n)),
                       lambda n: layout.unsharded_job(queue, n))
            for shard in sorted(n for n in names if parse_shard(n)):
                try:
                    jobs = store.children(layout.shard(queue, shard))
                except NoNodeError:
                    continue  # emptied and deleted meanwhile
                cancel_all(jobs, lambda n, shard=shard: layout.shard_child(queue, shard, n))
            return cancelled

        return self._bounded(
            store, run, f"Cancelling the jobs of queue {queue!r} stopped partway:",
            "The jobs cancelled so far stay cancelled; run it again once the ensemble "
            "answers to cancel the rest.")

    @staticmethod
    def _fail_all_cancelled(store: Store, chunk) -> bool:
        """_fail_cancelled for many READY jobs, each (found, final, its pending node), in
        one multi; False if it was refused (nothing applied)."""
        writes = []
        for found, final, where in chunk:
            writes.append((where, store.layout.status(final.id), final.to_bytes(),
                           found.version, store.index_path(final),
                           store.cleanup_paths(final)))

        def build(txn):
            for where, status_path, data, version, index, cleanup in writes:
                txn.delete(where)
                txn.set_data(status_path, data, version=version)
                txn.create(index, b"")
                for path in cleanup:
                    txn.delete(path)

        first = writes[0]
        failed = failures(store.commit(build, landed=lambda: store._written(first[1],
                                                                             first[2])))
        if failed:
            store.forget_bucket_if_gone(first[4], failed)  # purged meanwhile: remade
        return not failed

    @staticmethod
    def _fail_cancelled(store: Store, found, final: StatusRecord,
                        places: list[tuple[str, int]]) -> bool:
        """Record `final` (a READY job failed as cancelled) over the status `found` and
        delete the place the job waits, in one multi, trying each (path, version) of
        `places` in turn; False if every one was refused (the job or its place changed
        meanwhile)."""
        status_path = store.layout.status(final.id)
        data = final.to_bytes()
        index = store.index_path(final)
        cleanup = store.cleanup_paths(final)

        def build_for(where, version, index):
            def build(txn):
                txn.delete(where, version=version)
                txn.set_data(status_path, data, version=found.version)
                txn.create(index, b"")
                for path in cleanup:
                    txn.delete(path)
            return build

        def landed():
            return store._written(status_path, data)

        for where, version in places:
            failed = failures(store.commit(build_for(where, version, index), landed=landed))
            if failed and store.forget_bucket_if_gone(index, failed):
                index = store.index_path(final)  # purged meanwhile: make it again
                failed = failures(store.commit(build_for(where, version, index),
                                               landed=landed))
            if not failed:
                return True
        return False

    def _bounded(self, store: Store, call, what: str, advice: str):
        """Run `call()` with every ZooKeeper request bounded by CONNECT_TIMEOUT, so a web
        request fails with a clear error instead of hanging while ZooKeeper has no
        quorum; the error says what is unknown (`what`) and what to do (`advice`)."""
        try:
            with store.bounded():
                return call()
        except ZooKeeperUnavailableError as exc:
            raise ZooKeeperUnavailableError(f"{what} {exc} {advice}") from exc

    def _request_cancel(self, store: Store, job_id: str, force: bool) -> None:
        path = store.layout.cancel_request(job_id)
        data = records.dumps({"force": force, "requested_at": records.now().isoformat()})
        store.ensure_skeleton()
        try:
            store.retry(store.client.create, path, data)
        except NodeExistsError:
            if force:
                # Made again, not set: workers follow the cancel parent's children, not
                # each request's data, so a set() escalating a polite request to force
                # went unseen and the task ran on (cancel(), then cancel(force=True)).
                def build(txn):
                    txn.delete(path)
                    txn.create(path, data)

                if failures(store.commit(build, landed=lambda: store._written(path, data))):
                    # Swept meanwhile (the job finished), or made again by another caller.
                    with contextlib.suppress(NodeExistsError):
                        store.retry(store.client.create, path, data)

    def retry(self, job_id: str) -> bool:
        """Send a FAILED job back to pending for one more attempt; False if not FAILED."""
        _known_shape(job_id)
        store = self.store
        return self._bounded(
            store, lambda: self._retry(store, job_id),
            f"Retrying job {job_id!r} has an unknown outcome:",
            f"Once the ensemble answers, call get_result({job_id!r}) to see whether it is "
            "pending again before retrying once more.")

    def _retry(self, store: Store, job_id: str) -> bool:
        store.catch_up()  # see _cancel
        found = store.read_status(job_id)
        if found is None:
            raise JobNotFound(f"No job has the id {job_id!r}.")
        record = found.record
        if record.state != records.FAILED or record.finished_at is None:
            return False
        if record.payload is None:
            raise RetryRefused(
                f"Job {job_id} holds no payload (its record was corrupt and replaced): "
                "nothing to run; submit the job again.")
        return self._send_back(store, found, note={"at": records.now().isoformat(),
                                                   "kind": "retry"})

    def _send_back(self, store: Store, found, *, also=None, note: dict | None = None) -> bool:
        """Make a job READY and waiting again in one multi (fenced by its status version).

        A FAILED job gets one more attempt (retry); a READY or RUNNING one that nobody
        holds (re-queued from the dead letters) keeps its attempts. `also(txn)` adds ops to
        the multi, `note` is appended to the record's extra["requeued"].
        """
        record = found.record
        failed = record.state == records.FAILED and record.finished_at is not None
        # run_after stays: it is the task's own (result.task), and a job re-queued before
        # it is due waits for it again; a failed job's is past anyway.
        changes = {"state": records.READY, "finished_at": None, "retry_at": None}
        if failed:
            changes["max_attempts"] = record.attempts + 1
        if note is not None:
            note = {**note, "attempts": record.attempts}
            changes["extra"] = {**record.extra,
                                "requeued": [*record.extra.get("requeued", []), note]}
        again = record.evolve(**changes)
        # A cancel request still standing from an earlier run is answered: the job is
        # wanted again, and a worker fails a job handed to it that has one. Deleted
        # before the multi, and NoNode is fine: after a crash in between, the job is
        # only where it was, without a request it no longer needs.
        try:
            store.retry(store.client.delete, store.layout.cancel_request(record.id))
        except NoNodeError:
            pass
        index = store.find_index_entry(record) if failed else None
        store.ensure_queue(record.queue)
        waiting = store.waiting_path(again)
        status_path = store.layout.status(record.id)
        data = again.to_bytes()
        # Its finish freed the unique key: an unfinished job holds it again, or two
        # unfinished jobs would share it (the next submit with the key made another).
        unique = store.layout.unique_key(record.unique_key) if failed and \
            record.unique_key else None

        def build(txn):
            txn.set_data(status_path, data, version=found.version)
            if index:
                txn.delete(index)
            txn.create(waiting, records.dumps({"id": record.id, "task": record.task}))
            if unique:
                txn.create(unique, records.dumps({"job_id": record.id,
                                                  "key": record.unique_key}))
            if also:
                also(txn)

        results = store.commit(build, landed=lambda: store._written(status_path, data),
                               waiting=[waiting])
        failed_ops = failures(results)
        unique_op = 3 if index else 2  # set_data, [delete index], create waiting, unique
        if unique and failed_ops and failed_ops[0][0] == unique_op \
                and isinstance(failed_ops[0][1], NodeExistsError):
            holder = store.unique_holder(record.unique_key)
            if holder != record.id:
                raise RetryRefused(
                    f"Job {record.id} was not sent back: its unique key "
                    f"{record.unique_key!r} is held by job {holder}, which has not "
                    "finished. Wait for it (or cancel it), then retry.")
        if failed_ops and failed_ops[0][0] == 0 \
                and isinstance(failed_ops[0][1], BadVersionError) \
                and store.retry(store._written, status_path, data):
            # Our earlier attempt landed (its answer lost with the connection) while
            # landed() asked a server that had not applied it yet: the resend met our
            # own version. This reply came after it, so the read is fresh now.
            return True
        return not failed_ops

    # -- dead letters --------------------------------------------------------------------

    def dead_letters(self, limit: int = 50, *, after: str | None = None) -> list:
        """Entries of the dead-letter place (deadletter.DeadLetter), newest first."""
        from . import deadletter

        return deadletter.listing(self.store, limit, after=after)

    def discard_dead_letter(self, name: str) -> "Discarded":
        """Forget a dead-letter entry; false (a Discarded) if it was gone already.

        An entry that is the only place its job waits (see `stranded_job`) takes the job
        with it: the job is failed as cancelled (JobCancelled, never retried) in the
        multi that deletes the entry, so nobody waits on it forever; the answer's
        `failed_job` names it. Re-queue the entry instead to run the job.
        """
        store = self.store
        return self._bounded(
            store, lambda: self._discard_dead_letter(store, name),
            f"Discarding dead-letter entry {name!r} has an unknown outcome:",
            "Look at the dead letters again once the ensemble answers.")

    def _discard_dead_letter(self, store: Store, name: str) -> "Discarded":
        from . import deadletter

        store.catch_up()  # see _cancel
        letter = deadletter.read(store, name)
        if letter is None:
            return Discarded(False)
        found = self.stranded_job(letter)
        if found is None:
            return Discarded(deadletter.discard(store, name, letter.version))
        job_id = found.record.id
        final = _cancelled(found.record, f"Job {job_id!r} was discarded with dead-letter "
                                         f"entry {name}, the only place it waited; it "
                                         "will not run.", store.options.max_record_bytes)
        if not self._fail_cancelled(store, found, final,
                                    [(store.layout.dead_letter(name), letter.version)]):
            raise DeadLetterRefused(f"Job {job_id} or entry {name} changed meanwhile "
                                    "(re-queued or handled by somebody else); look again.")
        logger.warning("job failed as cancelled: discarded from the dead letters job=%s "
                       "entry=%s", job_id, name)
        return Discarded(True, failed_job=job_id)

    def stranded_job(self, letter):
        """The status (store.Found) of the unfinished job a dead-letter entry is the only
        place of, which discarding the entry fails; None when discarding it touches no job.

        That is an entry of deadletter.HOLD_KINDS (an assignment that did not decode)
        whose job is still READY or RUNNING while no worker holds it and it waits in no
        queue (a rare action: it reads every worker's assignments parent).
        """
        from . import deadletter

        store = self.store
        if letter.kind not in deadletter.HOLD_KINDS or not letter.job_id \
                or not is_job_id(letter.job_id):
            return None
        return self._bounded(
            store, lambda: self._stranded_job(store, letter),
            f"Whether dead-letter entry {letter.name!r} holds a job cannot be read now:",
            "Try again once the ensemble answers.")

    def _stranded_job(self, store: Store, letter):
        try:
            found = store.read_status(letter.job_id)
        except CorruptRecord:
            return None
        if found is None or found.record.is_finished \
                or self._holder(store, letter.job_id) \
                or any(store.retry(store.client.exists, path) is not None
                       for path in _waiting_places(store, found.record)):
            return None
        return found

    def requeue_dead_letter(self, name: str) -> str:
        """Send the job a dead-letter entry refers to back to its queue; return its id.

        One multi: its status back to READY (noted in extra["requeued"]), its waiting
        node created, the entry deleted. Raise DeadLetterRefused saying why when there is
        nothing sensible to run: no job, no readable status record, no payload, a payload
        this process's SIGNING_KEY does not verify, a job that succeeded, or one a worker
        holds or that is waiting already.
        """
        store = self.store
        return self._bounded(
            store, lambda: self._requeue_dead_letter(store, name),
            f"Re-queueing dead-letter entry {name!r} has an unknown outcome:",
            "Look at the dead letters and the job again once the ensemble answers.")

    def _requeue_dead_letter(self, store: Store, name: str) -> str:
        from . import deadletter

        store.catch_up()  # see _cancel
        letter = deadletter.read(store, name)
        if letter is None:
            raise DeadLetterRefused(f"No dead-letter entry {name!r} (re-queued or discarded "
                                    "already).")
        job_id = letter.job_id
        if not job_id or not is_job_id(job_id):
            what = letter.meaning or "an unreadable entry"
            raise DeadLetterRefused(f"Entry {name!r} refers to no job ({what}): there is "
                                    "nothing to re-queue; discard it.")
        try:
            found = store.read_status(job_id)
        except CorruptRecord as exc:
            raise DeadLetterRefused(f"{exc} Nothing can be re-queued from it; discard the "
                                    "entry and submit the job again.") from exc
        if found is None:
            raise DeadLetterRefused(f"Job {job_id} has no status record (expired, purged, or "
                                    "never submitted): nothing to re-queue; discard the entry.")
        record = found.record
        if record.payload is None:
            raise DeadLetterRefused(f"Job {job_id} holds no payload (its record was corrupt "
                                    "and replaced): nothing to run; discard the entry and "
                                    "submit the job again.")
        try:
            envelope.open_envelope(record.payload, job_id=job_id, kind=envelope.PAYLOAD,
                                   keys=self.conf.verify_keys)
        except PayloadVerificationError as exc:
            raise DeadLetterRefused(f"{exc} Set the same SIGNING_KEY on web processes and "
                                    "workers (or list the key it was signed with in "
                                    "SIGNING_KEY_FALLBACKS), then re-queue it.") from exc
        if record.state == records.SUCCESSFUL:
            raise DeadLetterRefused(f"Job {job_id} succeeded already; discard the entry.")
        if record.state != records.FAILED:
            holder = self._holder(store, job_id)
            if holder:
                raise DeadLetterRefused(f"Job {job_id} is assigned to worker {holder!r} "
                                        "already; discard the entry.")
        entry_path = store.layout.dead_letter(name)
        note = {"at": records.now().isoformat(), "entry": name, "kind": letter.kind,
                "reason": letter.reason}
        if not self._send_back(store, found, note=note,
                               also=lambda txn: txn.delete(entry_path, version=letter.version)):
            raise DeadLetterRefused(f"Job {job_id} changed meanwhile, is waiting already, or "
                                    "the entry was handled by somebody else; look again.")
        logger.warning("job re-queued from the dead letters job=%s entry=%s", job_id, name)
        return job_id

    @staticmethod
    def _holder(store: Store, job_id: str) -> str | None:
        """The worker holding an assignment of the job, if any (rare action: reads each
        worker's assignments parent)."""
        for owner in store.children(store.layout.assignments):
            if store.client.exists(store.layout.assignment(owner, job_id)) is not None:
                return owner
        return None

    def purge(self, *, states=("SUCCESSFUL", "FAILED"), older_than=None) -> int:
        """Delete finished records (by state, finished longer ago than `older_than`)."""
        codes = tuple({"SUCCESSFUL": "S", "FAILED": "F"}[s] for s in states)
        return self.store.delete_finished(before_ms=purge_before_ms(older_than),
                                          states=codes)

    # -- schedules -----------------------------------------------------------------------

    def schedule(self, name: str):
        """The schedule `name` of OPTIONS['SCHEDULES'], or ScheduleNotFound."""
        for schedule in self.conf.schedules:
            if schedule.name == name:
                return schedule
        names = ", ".join(repr(s.name) for s in self.conf.schedules) or "none"
        raise ScheduleNotFound(f"No schedule is named {name!r} in TASKS[{self.alias!r}]"
                               f"['OPTIONS']['SCHEDULES'] (its schedules: {names}).")

    def schedule_job(self, schedule, *, job_id: str | None = None, **extra):
        """Prepare (write nothing) a job of the schedule's task with its arguments;
        `extra` goes into the record (the leader puts the tick there)."""
        from django.utils.module_loading import import_string

        target = import_string(schedule.task)
        if not isinstance(target, Task):
            target = self.task_class(func=target, backend=self.alias)
        record, result = self.prepare(target, schedule.args, schedule.kwargs, job_id=job_id)
        return record.evolve(extra={"schedule": schedule.name, **extra}), result

    def pause_schedule(self, name: str) -> bool:
        """Stop a schedule's ticks until resume_schedule(); False if already paused."""
        schedule, store = self.schedule(name), self.store
        return self._bounded(
            store, lambda: schedule_state.pause(store, schedule.name),
            f"Pausing schedule {name!r} has an unknown outcome:",
            "Pause it again once the ensemble answers (pausing twice is harmless).")

    def resume_schedule(self, name: str) -> bool:
        """Let a paused schedule tick again from its next tick (the ticks it skipped
        while paused are not run); False if it was not paused."""
        schedule, store = self.schedule(name), self.store
        return self._bounded(
            store, lambda: schedule_state.resume(store, schedule),
            f"Resuming schedule {name!r} has an unknown outcome:",
            "Resume it again once the ensemble answers (resuming twice is harmless).")

    def run_schedule_now(self, name: str):
        """Submit one job of the schedule's task and arguments now, outside its ticks
        (paused or not); return its result. The schedule itself does not change."""
        record, result = self.schedule_job(self.schedule(name), manual=True)
        return self.write(record, result)

    def drain_worker(self, worker_id: str) -> bool:
        """Ask a worker to drain: it takes nothing new, finishes, hands back, exits."""
        store = self.store
        return self._bounded(
            store, lambda: self._drain_worker(store, worker_id),
            f"Asking worker {worker_id!r} to drain has an unknown outcome:",
            "Ask again once the ensemble answers (asking twice is harmless).")

    def _drain_worker(self, store: Store, worker_id: str) -> bool:
        if not is_znode_name(worker_id):  # "..", "a/b": no worker can have that id
            return False
        store.catch_up()  # a worker another process lists: it may have just registered
        data = store.update_worker(worker_id, mark_draining)
        return bool(data and data.get("draining"))


@dataclasses.dataclass(frozen=True)
class Discarded:
    """What discard_dead_letter() did: true if it deleted the entry; `failed_job`, the
    job it failed as cancelled with it (the entry was the only place it waited)."""

    found: bool
    failed_job: str | None = None

    def __bool__(self) -> bool:
        return self.found


def refuse_sync_signal_in_a_loop(backend, what: str) -> None:
    """Raise SynchronousOnlyOperation, before anything is written, where a sync submit
    could not announce its job: in a thread running an event loop, with async
    task_enqueued receivers connected. Django's Signal.send() runs those through
    async_to_sync(), which raises there, after the job was written: a caller retrying
    on that error made a second job."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # no loop in this thread: send() runs async receivers itself
    # Private, but Django has no public way to tell the async receivers apart.
    if task_enqueued._live_receivers(type(backend))[1]:  # (sync, async) receivers
        raise SynchronousOnlyOperation(
            f"{what} in async code, with async task_enqueued receivers connected, could "
            "not announce the job: nothing was written. Use `await task.aenqueue(...)` "
            "(aenqueue for submit; a loop of them for submit_many and pipelined()).")


def _waiting_places(store: Store, record: StatusRecord) -> list[str]:
    """Where a READY job can wait: its pending shard, or, in a tree from before sharding
    the leader has not migrated yet, the queue itself; with a run_after, its delayed
    shard or delayed/ itself as well."""
    node = job_node_name(record.priority, record.id)
    places = [store.layout.job(record.queue, node),
              store.layout.unsharded_job(record.queue, node)]
    if record.due_at is not None:
        due_ms = int(record.due_at.timestamp() * 1000)
        name = delayed_node_name(due_ms, record.priority, record.id, record.queue)
        places += [store.layout.delayed_job(name), store.layout.unsharded_delayed_job(name)]
    return places


def _check_arguments(task, args, kwargs) -> None:
    """Raise TypeError, as the call would on the worker, when the arguments do not fit
    the function's signature (Celery checks at delay() too). Otherwise the job was
    written, and failed remotely, after every attempt its max_attempts allowed."""
    signature = _signature(task.func)
    if signature is None:
        return
    try:
        if getattr(task, "takes_context", False):
            signature.bind(None, *args, **kwargs)
        else:
            signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{task.module_path}{signature}: {exc}. Nothing was written (the "
                        "job would fail on the worker).") from None


# Weak keys: a bound method, partial or callable object is wrapped afresh per submit, and
# a strong key would keep the wrapper, its object and everything that holds alive.
_signatures: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _signature(func):
    """inspect.signature(func), kept per function; None when it has none to tell (some
    builtins)."""
    try:
        return _signatures[func]
    except KeyError:
        pass
    except TypeError:  # not weakly referable, or unhashable
        return _read_signature(func)
    signature = _read_signature(func)
    with contextlib.suppress(TypeError):
        _signatures[func] = signature
    return signature


def _read_signature(func):
    """The signature of what a worker calls: a decorator's wrapper, not the function it
    wraps (follow_wrapped=False), since a wrapper may supply arguments itself."""
    import inspect

    try:
        return inspect.signature(func, follow_wrapped=False)
    except (TypeError, ValueError):
        return None


def _bulk_chunks(ready):
    """Split (found, final, where) triples into multis of at most BULK_CANCEL jobs and
    about BULK_CANCEL_BYTES of records (a larger record goes alone)."""
    chunk, size = [], 0
    for item in ready:
        length = len(item[1].to_bytes())
        if chunk and (len(chunk) == BULK_CANCEL or size + length > BULK_CANCEL_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += length
    if chunk:
        yield chunk


def _cancelled(record: StatusRecord, message: str, limit: int) -> StatusRecord:
    """`record` failed with JobCancelled(message), finished now, fitted in `limit` bytes."""
    return record.evolve(
        state=records.FAILED, finished_at=records.now(),
        errors=record.errors + (records.ErrorRecord(
            exception_class_path=f"{JobCancelled.__module__}.{JobCancelled.__qualname__}",
            message=message, traceback=message + "\n"),),
    ).fit(limit)


def purge_before_ms(older_than: timedelta | None) -> int:
    """Where purge(older_than=...) cuts, in epoch ms: buckets ending before it go. Whole
    10-second buckets go, so with no age the bucket being filled now is included. The
    dashboard's and the shell's estimates count against the same cut."""
    cutoff = records.now() - older_than if older_than else records.now() + timedelta(
        milliseconds=BUCKET_MS)
    return int(cutoff.timestamp() * 1000)


def _aware(value: datetime | None) -> datetime | None:
    """A naive run_after (valid with USE_TZ = False) in TIME_ZONE, as Django reads it;
    records hold aware times only (they are compared with UTC clocks)."""
    if value is None or timezone.is_aware(value):
        return value
    return timezone.make_aware(value, timezone.get_default_timezone())


def _local(value: datetime | None) -> datetime | None:
    """A record's time as Django's own backends give it: naive in TIME_ZONE when
    USE_TZ = False (timezone.now() is naive then), aware otherwise."""
    if value is None or settings.USE_TZ:
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


_UNKNOWN = object()
WAIT_READ_FLOOR = 1.0  # seconds a wait()'s read of the status may take, however short
_warned_in_task = threading.Event()


def _known_shape(job_id) -> None:
    """Raise JobNotFound for what cannot be a job id ("../x", "", None), before it goes
    into a path: kazoo raised ValueError ("relative paths not allowed") from wait(),
    cancel() and retry(), where get_result() said there is no such job."""
    if not isinstance(job_id, str) or not is_job_id(job_id):
        raise JobNotFound(f"No job has the id {job_id!r}.")


def _warn_if_in_task(job_id: str) -> None:
    """Celery refuses result.get() inside a task; we warn, once per process: waiting
    holds a runner, and once every runner waits, the jobs they wait for never start."""
    from .context import current_job_id

    waiting = current_job_id()
    if waiting is None or _warned_in_task.is_set():
        return
    _warned_in_task.set()
    logger.warning(
        "job %s waits inside its task for job %s: its runner runs nothing meanwhile, and "
        "if every runner waits, the jobs they wait for never start (a deadlock until the "
        "wait's timeout). Submit a follow-up task from the task instead. (Logged once "
        "per process.)", waiting, job_id)


def _payload_unavailable(*args, **kwargs):
    raise PayloadVerificationError("This job's payload is no longer stored.")


