"""Define ZkTask (a django.tasks.Task), the @zk_task decorator, submit() and the result."""

import functools
import inspect
import math
import types
from dataclasses import dataclass, field, fields, replace
from typing import Any

from asgiref.sync import sync_to_async
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task_backends
from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskResult
from django.tasks.exceptions import TaskResultMismatch

from .exceptions import InvalidTaskError, PayloadVerificationError, SerializationError
from .records import encodable
from .tree import MAX_RESULT_TTL

_UNSET = object()


def _same_definition(copy, func) -> bool:
    """Whether `copy` is `func` unpickled by value: the same code, at the same place."""
    code, own = getattr(copy, "__code__", None), getattr(func, "__code__", None)
    return (code is not None and own is not None
            and getattr(copy, "__module__", None) == getattr(func, "__module__", None)
            and getattr(copy, "__qualname__", None) == getattr(func, "__qualname__", None)
            and (code.co_filename, code.co_firstlineno, code.co_code)
            == (own.co_filename, own.co_firstlineno, own.co_code))


@dataclass(frozen=True, slots=True, kw_only=True)
class ZkTask(Task):
    """A django.tasks Task with zktasks' controls; works on any configured backend."""

    # Keyword names follow Django's open proposals (new-features #142 and #144).
    max_attempts: int = 1
    backoff: Any = 1.0   # seconds (base of exponential backoff with jitter) or a callable
    #                      (attempt, exception) -> seconds | None (None: do not retry)
    retry_on: tuple[type[BaseException], ...] | None = None  # None: retry on any exception
    timeout: float | None = None
    unique_key: str | None = None  # a second submit while this key's job is unfinished
    #                                returns that job's result instead of a new job
    by_value: bool | None = None  # None: decide from where the function lives
    result_ttl: float | None = None  # seconds a finished result is kept; None: the
    #                                  backend's RESULT_TTL

    def __post_init__(self):
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise InvalidTaskError(
                f"max_attempts is {self.max_attempts!r}; give a whole number of at least 1."
            )
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not self.timeout > 0
            or not math.isfinite(self.timeout)
        ):
            raise InvalidTaskError(
                f"timeout is {self.timeout!r}; give a positive number of seconds or None."
            )
        if self.result_ttl is not None and (
            isinstance(self.result_ttl, bool)
            or not isinstance(self.result_ttl, int | float)
            or not 0 < self.result_ttl <= MAX_RESULT_TTL
        ):
            raise InvalidTaskError(
                f"result_ttl is {self.result_ttl!r}; give a positive number of seconds (at "
                f"most {MAX_RESULT_TTL:,}, the finished index names it in 12 digits), or "
                "None for the backend's RESULT_TTL."
            )
        if not callable(self.backoff) and (
            isinstance(self.backoff, bool)
            or not isinstance(self.backoff, int | float)
            or self.backoff < 0
            or not math.isfinite(self.backoff)
        ):
            raise InvalidTaskError(
                f"backoff is {self.backoff!r}; give seconds (>= 0) or a callable "
                "(attempt, exception) -> seconds | None."
            )
        if self.unique_key is not None and (
            not isinstance(self.unique_key, str) or not self.unique_key
            # A lone surrogate: the key names a znode, in UTF-8.
            or encodable(self.unique_key) != self.unique_key
        ):
            raise InvalidTaskError(
                f"unique_key is {self.unique_key!r}; give a non-empty string (that UTF-8 "
                "can encode) or None."
            )
        if self.retry_on is not None:
            if isinstance(self.retry_on, type):
                object.__setattr__(self, "retry_on", (self.retry_on,))
            if not all(isinstance(c, type) and issubclass(c, BaseException)
                       for c in self.retry_on):
                raise InvalidTaskError(
                    f"retry_on is {self.retry_on!r}; give a tuple of exception classes."
                )
            object.__setattr__(self, "retry_on", tuple(self.retry_on))
        Task.__post_init__(self)

    def using(self, *, priority=None, queue_name=None, run_after=None, backend=None,
              max_attempts=None, backoff=None, retry_on=_UNSET, timeout=_UNSET,
              unique_key=_UNSET, result_ttl=_UNSET):
        """Return a copy with other defaults (Django's options plus zktasks' own)."""
        changed = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after,
            backend=backend,
        )
        extra = {}
        if max_attempts is not None:
            extra["max_attempts"] = max_attempts
        if backoff is not None:
            extra["backoff"] = backoff
        if retry_on is not _UNSET:
            extra["retry_on"] = retry_on
        if timeout is not _UNSET:
            extra["timeout"] = timeout
        if unique_key is not _UNSET:
            extra["unique_key"] = unique_key
        if result_ttl is not _UNSET:
            extra["result_ttl"] = result_ttl
        return replace(changed, **extra) if extra else changed

    # On Django's own backends (Immediate, Dummy: a user's unit tests) the results are
    # made ZkTaskResults too, so code written for zktasks (r.wait(), r.cancel()) runs
    # there unchanged.
    def enqueue(self, *args, **kwargs):
        return _zk_result(Task.enqueue(self, *args, **kwargs))

    async def aenqueue(self, *args, **kwargs):
        return _zk_result(await Task.aenqueue(self, *args, **kwargs))

    # Task.get_result() compares functions by identity. A function that travelled by
    # value (a closure, a task defined in a script's __main__) comes back from the
    # payload as a copy, so the task's own results were refused (TaskResultMismatch);
    # the same definition is the same task here.
    def get_result(self, result_id):
        return _zk_result(self._own(self.get_backend().get_result(result_id)))

    async def aget_result(self, result_id):
        return _zk_result(self._own(await self.get_backend().aget_result(result_id)))

    def _own(self, result):
        if result.task.func != self.func and not _same_definition(result.task.func, self.func):
            raise TaskResultMismatch(
                f"Task does not match (received {result.task.module_path!r})")
        return result

    def submit(self, *args, **kwargs):
        """Queue the task; same as enqueue() (Django's name)."""
        return self.enqueue(*args, **kwargs)

    def submit_many(self, calls):
        """Queue one job per (args, kwargs) pair, in batched multis; return the results.

        All calls are checked and serialized before anything is written: one bad call
        raises and no job is created. On a backend other than ZooKeeperBackend, this is
        enqueue() per call.
        """
        backend = self.get_backend()
        if hasattr(backend, "enqueue_many"):
            return backend.enqueue_many(self, list(calls))
        return [self.enqueue(*args, **kwargs) for args, kwargs in calls]

    def submit_on_commit(self, *args, **kwargs):
        """Queue the task when the surrounding database transaction commits.

        Bad input raises here and now. The returned result has the job's id, but the job
        exists only once the transaction commits; after a rollback it never does.
        Outside a transaction the job is queued at once. On a backend other than
        ZooKeeperBackend (Django's Immediate or Dummy one in a project's tests) the
        result exists only once enqueue() has run: outside a transaction it runs now
        and its result is returned; inside one it is deferred with
        transaction.on_commit, and None is returned.
        """
        backend = self.get_backend()
        if hasattr(backend, "enqueue_on_commit"):
            return backend.enqueue_on_commit(self, args, kwargs)
        from django.db import transaction

        if not transaction.get_connection().in_atomic_block:
            return self.enqueue(*args, **kwargs)
        transaction.on_commit(lambda: self.enqueue(*args, **kwargs))
        return None

    async def asubmit(self, *args, **kwargs):
        return await self.aenqueue(*args, **kwargs)


def zk_task(function=None, *, priority=DEFAULT_TASK_PRIORITY,
            queue_name=DEFAULT_TASK_QUEUE_NAME, backend=DEFAULT_TASK_BACKEND_ALIAS,
            takes_context=False, **options):
    """Make a function a task: bare `@zk_task`, or `@zk_task(queue_name=..., ...)`.

    The task class is the backend's own when it is a ZkTask (ZooKeeperBackend), else
    ZkTask itself, so decorated functions keep working on Django's Immediate and Dummy
    backends in a user's unit tests.
    """
    if "run_after" in options:
        raise TypeError(
            "run_after cannot be set with @zk_task; use .using(run_after=...) per call."
        )

    def wrap(func):
        task_class = getattr(task_backends[backend], "task_class", ZkTask)
        if not (isinstance(task_class, type) and issubclass(task_class, ZkTask)):
            task_class = ZkTask
        return task_class(
            func=func, priority=priority, queue_name=queue_name, backend=backend,
            takes_context=takes_context, **options,
        )

    return wrap(function) if function is not None else wrap




def submit(func, *args, **kwargs):
    """Run any callable (a task, a function, a lambda) in the background on the default backend."""
    if isinstance(func, Task):
        return func.enqueue(*args, **kwargs)
    if not callable(func):
        raise InvalidTaskError(f"submit() needs a callable or a task, not {func!r}.")
    if not isinstance(func, types.FunctionType | types.BuiltinFunctionType):
        func = _as_function(func)
    return zk_task(func).enqueue(*args, **kwargs)


def _as_function(target):
    """A function that calls `target`: a bound method, a partial, a callable object or a
    method descriptor such as str.upper.

    A task needs a function with a module and a name, and a bound method sent as itself
    would be looked up by that name on the worker and lose its `self`. The function is
    named "<what it calls>", which no import can find, so it travels by value (dill)
    with `target` inside.
    """
    inner = target.func if isinstance(target, functools.partial) else target
    module = (getattr(inner, "__module__", None) or getattr(type(inner), "__module__", None)
              or "__main__")
    name = getattr(inner, "__qualname__", None) or f"{type(inner).__qualname__} object"
    if isinstance(target, functools.partial):
        name = f"partial of {name}"

    if inspect.iscoroutinefunction(target):
        async def call(*args, **kwargs):
            return await target(*args, **kwargs)
    else:
        def call(*args, **kwargs):
            return target(*args, **kwargs)
    call.__module__ = module
    call.__name__ = call.__qualname__ = f"<{name}>"
    return call


def _zk_result(result: TaskResult) -> "ZkTaskResult":
    if isinstance(result, ZkTaskResult):
        return result
    values = {f.name: getattr(result, f.name) for f in fields(TaskResult) if f.init}
    converted = ZkTaskResult(**values, queue_name=result.task.queue_name)
    object.__setattr__(converted, "_return_value", result._return_value)
    return converted


class UnloadableValue:
    """Stands for a return value this process could not load (see return_value)."""

    __slots__ = ("job_id", "error")

    def __init__(self, job_id: str, error: Exception):
        self.job_id = job_id
        self.error = error

    def raise_error(self):
        if isinstance(self.error, PayloadVerificationError):
            raise PayloadVerificationError(str(self.error)) from self.error
        raise SerializationError(
            f"The return value of job {self.job_id!r} cannot be loaded in this process "
            f"({type(self.error).__name__}: {self.error}). The worker could pickle it; "
            "deploy the same code here (its classes must be importable), or return "
            "plain data such as a primary key."
        ) from self.error


@dataclass(frozen=True, slots=True, kw_only=True)
class ZkTaskResult(TaskResult):
    """A django.tasks TaskResult that can also wait on ZooKeeper and cancel."""

    queue_name: str = DEFAULT_TASK_QUEUE_NAME
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        # Django's results normalize args through JSON; ours travel with dill, so
        # model instances, sets and Decimals stay what they were.
        pass

    @property
    def return_value(self):
        """The task's return value; raises if it did not succeed, as Django's does, or
        if the value cannot be loaded in this process (the status is still readable)."""
        value = TaskResult.return_value.__get__(self)
        if isinstance(value, UnloadableValue):
            value.raise_error()
        return value

    def wait(self, timeout: float | None = None) -> "ZkTaskResult":
        """Block until the job finishes (on a ZooKeeper watch); raise TimeoutError if not."""
        backend = self.task.get_backend()
        if not hasattr(backend, "wait"):  # Django's Immediate or Dummy backend
            if not self.is_finished and backend.supports_get_result:
                self.refresh()
            if self.is_finished:
                return self
            raise TimeoutError(
                f"Job {self.id!r} is {self.status}, and the {type(backend).__name__} "
                "runs no tasks: waiting would never end."
            )
        self._copy_from(backend.wait(self.id, timeout=timeout))
        return self

    async def await_result(self, timeout: float | None = None) -> "ZkTaskResult":
        """wait() for async code: `await result.await_result(timeout=10)` waits on the
        same ZooKeeper watch without blocking the event loop (wait() would)."""
        backend = self.task.get_backend()
        if not hasattr(backend, "await_result"):  # Django's Immediate or Dummy backend
            return await sync_to_async(self.wait, thread_sensitive=False)(timeout)
        self._copy_from(await backend.await_result(self.id, timeout=timeout))
        return self

    def refresh(self):
        self._copy_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self):
        # Django's copies TASK_REFRESH_ATTRS, which leaves out `extra` (attempts...).
        self._copy_from(await self.task.get_backend().aget_result(self.id))

    def cancel(self, *, force: bool = False) -> bool:
        """Cancel the job: True if it will never run; False if its worker was asked to
        stop it (cooperatively, or by terminating its task process with force=True).
        A finished job: True if it was cancelled before, False otherwise."""
        backend = self.task.get_backend()
        if not hasattr(backend, "cancel"):  # Django's Immediate or Dummy backend
            if self.is_finished:
                return False
            raise NotImplementedError(
                f"The {type(backend).__name__} cannot cancel jobs; cancelling needs the "
                "ZooKeeperBackend.")
        cancelled = backend.cancel(self.id, force=force)
        self.refresh()
        return cancelled

    def _copy_from(self, other: TaskResult) -> None:
        for name in ("status", "enqueued_at", "started_at", "finished_at", "last_attempted_at",
                     "errors", "worker_ids", "_return_value", "extra"):
            value: Any = getattr(other, name, None)
            object.__setattr__(self, name, value)
