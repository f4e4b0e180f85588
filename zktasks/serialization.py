"""Turn a call (function, args, kwargs) into bytes a worker can run, and back.

Module-level functions of installed code travel by reference (their dotted path);
functions a worker cannot import (lambdas, closures, functions of `__main__`, a script or
a test module) travel by value, as dill's serialized Runnable of the seed did.
"""

import builtins
import contextlib
import copyreg
import dataclasses
import datetime
import decimal
import functools
import importlib
import io
import math
import pickle
import random
import reprlib
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Any

import dill
from django.tasks.base import Task

from .exceptions import SerializationError


@dataclass(frozen=True, slots=True)
class FunctionRef:
    """A function known by its import path on every worker."""

    module: str
    qualname: str

    def resolve(self):
        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        # The module attribute of a decorated task is the Task; run its function.
        return getattr(obj, "func", obj)


@dataclass(frozen=True, slots=True)
class ByValue:
    """A function pickled whole; `module` is where it was defined (for its name only)."""

    func: Any
    module: str
    # The copies _detached() made of the functions of the same module that `func` uses
    # (helpers, and the functions of tasks it submits): each gets its module back too.
    helpers: tuple = ()

    def resolve(self):
        local = find_local(self.module, getattr(self.func, "__qualname__", ""))
        if local is not None:
            # Importable here after all (a test module in the submitting process): use
            # the original, so Task.get_result() finds the same function object.
            return local
        # getattr: bytes written before `helpers` existed unpickle without it.
        for func in (self.func, *getattr(self, "helpers", ())):
            try:
                func.__module__ = self.module
                if isinstance(func, types.FunctionType):
                    func.__globals__["__name__"] = self.module  # for getLogger(__name__)
            except (AttributeError, TypeError):
                pass
        return self.func


def find_local(module: str, qualname: str):
    """Return the function `module.qualname` if this process can import it, else None."""
    if module == "__main__" or "<" in qualname or module not in sys.modules:
        return None
    try:
        return FunctionRef(module, qualname).resolve()
    except Exception:
        return None


def _is_test_module(module: str) -> bool:
    parts = module.split(".")
    return any(
        p == "conftest" or p.startswith("test_") or p in ("test", "tests") or p.endswith("_test")
        for p in parts
    )


def travels_by_value(func) -> bool:
    """Say whether a worker is unlikely to import `func` and so needs it by value."""
    qualname = getattr(func, "__qualname__", "")
    module = getattr(func, "__module__", None) or "__main__"
    if "<locals>" in qualname or "<lambda>" in qualname or module == "__main__":
        return True
    if _is_test_module(module):
        return True
    # A function replaced in its module (not reachable by its own name) cannot travel
    # by reference: only a Task wrapping it is an acceptable stand-in.
    try:
        found = FunctionRef(module, qualname).resolve()
    except Exception:
        return True
    return found is not func


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _detached(func: types.FunctionType, memo: dict) -> types.FunctionType:
    """Copy `func` as if defined in __main__, so dill pickles its code, not its path.

    dill pickles any function it can find by import as a reference; a function of a test
    module is importable here but not on a worker. The copy gets a globals dict holding
    only the names its code uses, and the same treatment for functions of its own module
    that it calls, so helpers travel with it.
    """
    if func in memo:
        return memo[func]
    module = func.__module__
    new_globals: dict[str, Any] = {"__builtins__": builtins, "__name__": "__main__"}
    copy = types.FunctionType(
        func.__code__, new_globals, func.__name__, func.__defaults__, func.__closure__
    )
    copy.__kwdefaults__ = func.__kwdefaults__
    copy.__qualname__ = func.__qualname__
    copy.__doc__ = func.__doc__
    copy.__module__ = "__main__"
    memo[func] = copy
    for name in _code_names(func.__code__):
        if name not in func.__globals__:
            continue
        value = func.__globals__[name]
        if isinstance(value, Task):
            if isinstance(value.func, types.FunctionType) and value.func.__module__ == module:
                # A task of the same module that `func` submits (or calls): it stays a
                # task, around a copy of its function, so `other.submit()` works there.
                value = _task_around(value, _detached(value.func, memo))
        elif isinstance(value, types.FunctionType) and value.__module__ == module:
            value = _detached(value, memo)
        elif isinstance(value, types.ModuleType) and _importable(value):
            # `from myapp import tasks`, then `tasks.add.submit()`: dill would pickle the
            # module's whole __dict__ (every task in it; a task made as `x = zk_task(_x)`
            # then failed to load) and write it over the worker's copy. By name instead.
            value = _module_by_name(value.__name__)
        new_globals[name] = value
    return copy


def _importable(module: types.ModuleType) -> bool:
    """Whether a module is one a worker can import by its name (not a script's
    __main__, not one made at run time)."""
    name = getattr(module, "__name__", "")
    return (name != "__main__" and sys.modules.get(name) is module
            and getattr(module, "__spec__", None) is not None)


class _module_by_name:  # noqa: N801 (a pickling stand-in)
    """Stands for a module in a detached function's globals; unpickles as the import."""

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return importlib.import_module, (self.name,)


class _task_around:  # noqa: N801 (a pickling stand-in, used like a function)
    """Stands for `task` in a detached function's globals; unpickles as that task, around
    the by-value copy of its function.

    Django's Task pickles by reference (Task.__reduce__ names its module path), which a
    worker that cannot import the module cannot follow.
    """

    def __init__(self, task: Task, func: types.FunctionType):
        self.task_class = type(task)
        self.values = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
        self.values["func"] = func

    def __reduce__(self):
        return unvalidated_task, (self.task_class, self.values)


def unvalidated_task(task_class, values) -> Task:
    """A task of `task_class` with `values` as its fields.

    Not task_class(**values): its __post_init__ validates the task against this
    process's backend settings, and the task was valid where it was submitted.
    """
    task = object.__new__(task_class)
    for name, value in values.items():
        object.__setattr__(task, name, value)
    return task


def function_spec(func, *, by_value: bool | None = None):
    """Return what to pickle for `func`: a FunctionRef, or the function itself by value."""
    if by_value is None:
        by_value = travels_by_value(func)
    if not by_value:
        return FunctionRef(func.__module__, func.__qualname__)
    module = getattr(func, "__module__", None) or "__main__"
    if isinstance(func, types.FunctionType):
        memo: dict = {}
        detached = _detached(func, memo)
        return ByValue(detached, module, tuple(f for f in memo.values() if f is not detached))
    return ByValue(func, module)


MAX_BACKOFF = 3600.0  # seconds: the cap of exponential backoff
# The cap of any retry delay (Retry(delay=...) or a backoff callable's answer): the
# next attempt's due time names its delayed node in 13 digits of milliseconds, and an
# infinite delay would overflow the datetime after the run, dropping the outcome.
MAX_RETRY_DELAY = 10 * 365 * 86400.0


def _retry_seconds(value) -> float:
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError("a retry delay of NaN seconds")
    return min(MAX_RETRY_DELAY, max(0.0, seconds))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and after how long a failed attempt is retried (max_attempts permitting)."""

    backoff: Any = None                      # seconds (exponential base) or a callable
    retry_on: tuple[type[BaseException], ...] | None = None

    def delay(self, attempt: int, exc: BaseException) -> float | None:
        """Return seconds to wait before the next attempt, or None for no retry."""
        from .exceptions import Retry

        if isinstance(exc, Retry) and exc.delay is not None:
            return _retry_seconds(exc.delay)
        if (self.retry_on is not None and not isinstance(exc, Retry)
                and not isinstance(exc, self.retry_on)):
            return None
        if callable(self.backoff):
            chosen = self.backoff(attempt, exc)
            return None if chosen is None else _retry_seconds(chosen)
        base = float(self.backoff or 0.0)
        # Exponential with jitter: spread retries of jobs that failed together.
        return min(MAX_BACKOFF, base * 2 ** max(0, attempt - 1)) * random.uniform(0.5, 1.0)


@dataclass(frozen=True, slots=True)
class Call:
    func: Any
    args: tuple
    kwargs: dict
    policy: RetryPolicy


def dump_call(func, args, kwargs, *, task_path: str, by_value: bool | None = None,
              policy: RetryPolicy | None = None) -> bytes:
    """Serialize a call, naming the offending argument if dill cannot handle one."""
    spec = function_spec(func, by_value=by_value)
    policy = policy or RetryPolicy()
    if callable(policy.backoff) and travels_by_value(policy.backoff):
        policy = RetryPolicy(function_spec(policy.backoff, by_value=True), policy.retry_on)
    call = (spec, tuple(args), dict(kwargs), policy)
    plain_policy = _plain_policy(policy)
    if isinstance(spec, FunctionRef) and plain_policy and _plain(call[1:3]):
        return _with_trailer(_fast_dumps, call, plain_policy)
    _refuse_open_files(task_path, args, kwargs)
    try:
        return _with_trailer(_dill_dumps, call, plain_policy)
    except _OpenFileFound as found:
        raise SerializationError(
            f"Task {task_path!r} cannot be submitted: it holds an open file "
            f"({found.described}) inside what it sends (a lambda's or closure's variables, "
            "a partial's or bound method's object, an argument's attributes), which a "
            "worker would have to open again by its path. Save it to storage the workers "
            "share and pass the name, or pass its bytes.") from None
    except Exception as exc:
        if (isinstance(exc, RecursionError) and isinstance(spec, FunctionRef)
                and plain_policy and _plain_nested(call[1:3])):
            with contextlib.suppress(RecursionError):
                return _with_trailer(_fast_dumps, call, plain_policy)
        culprit = _find_culprit(spec, args, kwargs)
        raise SerializationError(
            f"Task {task_path!r} cannot be submitted: {culprit} cannot be serialized by dill "
            f"({type(exc).__name__}: {exc}); pass something dill can pickle instead, "
            "such as a primary key or a file path."
        ) from exc


# The retry policy travels twice: inside the call, and again after it, pickled on its
# own (the same bytes, pickled once: _PolicyBytes), so that a worker process can ask it
# (after its task process died or was killed at its time limit) without unpickling the
# arguments. Unpickling an argument runs its
# class's code (an extension built for another ABI can crash the process, a
# __setstate__ can hang): that is for the task process alone, whose death costs one job.
# (Celery's task protocol 2 moved its headers out of the body for the same reason.)
#
#   blob = <pickle of (spec, args, kwargs, <policy pickle>)> <policy pickle>
#          <its length, 4 bytes> <POLICY_MARK>
#
# pickle.loads and dill.loads stop at the first pickle's STOP and ignore what follows, so
# a worker of the previous release reads these bytes as before (a rolling upgrade), and
# a pickle always ends with STOP ("."), so bytes written before this trailer existed
# never end with the mark. The default policy is an empty pickle: 8 bytes in all.
POLICY_MARK = b"ZKrp"
_POLICY_TRAILER = len(POLICY_MARK) + 4


def _policy_bytes(policy: "RetryPolicy", *, plain: bool) -> bytes:
    """The policy pickled for the trailer; empty for the default one."""
    if policy.backoff is None and policy.retry_on is None:
        return b""
    if plain:
        return _fast_dumps(policy)
    return _dill_dumps(policy)  # a backoff by value, or a retry_on class of __main__


def _with_trailer(dumps, call: tuple, plain_policy: bool) -> bytes:
    """`dumps` of the call, its policy given as the trailer's own bytes (_PolicyBytes):
    pickled once, not twice (a backoff by value costs dill a few hundred µs)."""
    pickled = _policy_bytes(call[3], plain=plain_policy)
    if not pickled:
        return dumps(call) + _DEFAULT_TRAILER
    return (dumps((*call[:3], _PolicyBytes(pickled))) + pickled
            + len(pickled).to_bytes(4, "big") + POLICY_MARK)


class _PolicyBytes:
    """A pickled policy inside the call; it unpickles as the policy (`loads`, a name
    the previous release has too, so its workers read these bytes as before)."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes):
        self.blob = blob

    def __reduce__(self):
        return loads, (self.blob,)


_DEFAULT_TRAILER = bytes(4) + POLICY_MARK


def load_policy(blob: bytes) -> "RetryPolicy | None":
    """The retry policy of verified call bytes, read without touching their arguments;
    None for bytes written before the policy travelled apart (load_call has it)."""
    if not blob.endswith(POLICY_MARK) or len(blob) < _POLICY_TRAILER:
        return None
    end = len(blob) - _POLICY_TRAILER
    size = int.from_bytes(blob[end:end + 4], "big")
    if size > end:
        return None
    if size == 0:
        return RetryPolicy()
    return _resolved(loads(blob[end - size:end]))


def _resolved(policy: "RetryPolicy") -> "RetryPolicy":
    if isinstance(policy.backoff, FunctionRef | ByValue):
        return RetryPolicy(policy.backoff.resolve(), policy.retry_on)
    return policy


# Plain data pickles the same with the standard library's C pickler as with dill, at a
# small fraction of the cost (dill's Pickler runs in Python: about 0.3 ms per submit in
# `bench --profile`). Anything else goes through dill, which also pickles by value what a
# worker could not import (a class of __main__, say); plain pickle would name it by
# reference and the worker would fail to load it. dill.loads reads both.
# Exact types: a subclass (a StrEnum of __main__, say) may not be importable by a worker.
_PLAIN_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, datetime.date,
                          datetime.datetime, datetime.time, datetime.timedelta,
                          datetime.timezone, decimal.Decimal})
_PLAIN_DEPTH = 8


def _plain(value, depth: int = 0) -> bool:
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return True
    if depth >= _PLAIN_DEPTH:
        return False
    if kind in (list, tuple, set, frozenset):
        return all(_plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _plain_nested(value, items: int = 1_000_000) -> bool:
    """_plain without its depth limit (a stack of its own), for data nested deeper than
    dill's pickler, in Python, can follow: a dict of lists 150 deep raised
    RecursionError there, where the C pickler (and Django's JSON) go past 400."""
    stack = [value]
    while stack:
        items -= 1
        if items < 0:
            return False  # a list that holds itself, or simply too much to be worth it
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_TYPES:
            continue
        if kind in (list, tuple, set, frozenset):
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            return False
    return True


def _plain_policy(policy: "RetryPolicy") -> bool:
    installed = all(getattr(c, "__module__", "__main__") != "__main__" and not
                    travels_by_value(c) for c in policy.retry_on or ())
    return installed and (policy.backoff is None or isinstance(policy.backoff,
                                                               int | float | FunctionRef))


def _fast_dumps(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class _OpenFileFound(Exception):
    def __init__(self, value):
        super().__init__(value)
        name = getattr(value, "name", None)
        self.described = type(value).__qualname__ + (f" {name!r}" if isinstance(name, str)
                                                     else "")


_STANDARD_STREAMS = tuple(s for s in (sys.__stdin__, sys.__stdout__, sys.__stderr__)
                          if s is not None)


class _Dispatch(dict):
    """dill's table of save functions, copied, for a Pickler of our own. A type
    registered with dill since the copy is looked up in dill's; a metaclass gets what
    dill gives one (its MetaCatchingDict). As cheap per object as dill's own lookup."""

    def get(self, kind, default=None):
        save = dict.get(self, kind)
        if save is None:
            save = dict.get(dill.Pickler.dispatch, kind)
            if save is None and issubclass(kind, type):
                save = dill.Pickler.dispatch.get(kind)
        return default if save is None else save


def _refusing_open(save):
    def save_file(pickler, obj):
        # The standard streams travel as a name (dill's own case): the worker writes to
        # its own stderr, as print(..., file=sys.stderr) in a lambda always has.
        if obj not in _STANDARD_STREAMS and _is_open_file(obj):
            raise _OpenFileFound(obj)
        save(pickler, obj)

    return save_file


class _Pickler(dill.Pickler):
    """dill's Pickler, refusing an open file wherever it sits in what is pickled.

    dill pickles one as its path and position, for the unpickler to open again; a file
    in a lambda's closure, a partial's arguments or an object's attribute was accepted
    at submit and then failed on the worker (KeyError from inside dill), or, its path
    gone, read nothing and succeeded. The scan of the arguments beforehand
    (_refuse_open_files, which names the argument) cannot follow what only pickling
    reaches, so dill's save functions for files refuse here. (An override of save()
    for the check cost a quarter more CPU per by-value submit: a call per object.)
    """

    dispatch = _Dispatch(dill.Pickler.dispatch)


for _kind, _save in list(_Pickler.dispatch.items()):
    if isinstance(_kind, type) and issubclass(_kind, io.IOBase):
        _Pickler.dispatch[_kind] = _refusing_open(_save)


def _dill_dumps(value) -> bytes:
    """dill.dumps(value, recurse=True), with _Pickler."""
    buffer = io.BytesIO()
    _Pickler(buffer, dill.settings["protocol"], recurse=True).dump(value)
    return buffer.getvalue()


def _refuse_open_files(task_path: str, args, kwargs) -> None:
    """An open file (an upload, a tempfile, open(path)), as an argument or directly in
    one: dill pickles it as its path and position, for the worker to open again. That
    file may not exist there (another machine), or be gone by then (Django deletes an
    upload's temporary file at the end of its request): the job failed on the worker
    with a KeyError from deep inside dill. Refused here, with what to do."""
    places = [(f"positional argument {i}", v) for i, v in enumerate(args)]
    places += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for where, value in places:
        inner = (list(value.values()) if isinstance(value, dict) else
                 list(value) if isinstance(value, list | tuple | set | frozenset) else [])
        for candidate in (value, *inner[:100]):
            if _is_open_file(candidate):
                raise SerializationError(
                    f"Task {task_path!r} cannot be submitted: {where} "
                    f"({type(candidate).__qualname__}) is an open file, which a worker would "
                    "have to open again by its path. Save it to storage the workers share "
                    "and pass the name, or pass its bytes.")


def _is_open_file(value) -> bool:
    """An object backed by an OS file. Not in-memory ones (BytesIO, StringIO, a
    ContentFile, a small upload), which dill pickles by value, nor a model's FieldFile,
    which Django pickles by name."""
    from django.core.files.base import File  # uploads (UploadedFile) and storage files
    from django.db.models.fields.files import FieldFile

    if isinstance(value, FieldFile):
        return False
    if isinstance(value, File):
        value = value.file
    # What tempfile.NamedTemporaryFile returns: a wrapper, not an IOBase itself.
    if isinstance(value, tempfile._TemporaryFileWrapper):
        return True
    if not isinstance(value, io.IOBase):
        return False
    try:
        value.fileno()
    except (OSError, ValueError):  # in memory (io.UnsupportedOperation), or closed
        return False
    return True


def _find_culprit(spec, args, kwargs) -> str:
    for index, value in enumerate(args):
        if not _picklable(value):
            return f"positional argument {index} ({type(value).__qualname__})"
    for key, value in kwargs.items():
        if not _picklable(value):
            return f"keyword argument {key!r} ({type(value).__qualname__})"
    if not _picklable(spec):
        return "the task function itself"
    return "the call"


def _picklable(value) -> bool:
    try:
        dill.dumps(value, recurse=True)
    except Exception:
        return False
    return True


def loads(blob: bytes):
    """Unpickle verified bytes: with the C unpickler when nothing in them needs dill.

    dill's Unpickler runs in Python (a fifth of a task process's CPU per no-op job in
    `bench --profile`). What it adds over the standard one is in `find_class`: names
    under `dill` (its reconstructors) and `__builtin__` (its aliases). Bytes that name
    neither are a standard pickle, which the C unpickler reads the same.
    """
    if b"dill" in blob or b"__builtin__" in blob:
        return dill.loads(blob)
    return pickle.loads(blob)


def load_call(blob: bytes) -> Call:
    """Return the call held in verified bytes."""
    spec, args, kwargs, policy = loads(blob)
    return Call(spec.resolve(), args, kwargs, _resolved(policy))


class Unloaded(type):
    """What peek_call puts where an object was that a worker process does not unpickle:
    its class's code never ran there. `path` names what would have made it (a class, a
    Django model as "app_label.Model", a function). `isinstance(x, Unloaded)` tells one.

    Each stand-in is a class of this metaclass, so that every way pickle rebuilds an
    object lands on it: called (REDUCE), its __new__ (NEWOBJ, which wants a type), its
    state set (BUILD), items added (APPENDS, SETITEMS). All of them give a stand-in back
    and keep nothing.
    """

    path: str

    def __call__(cls, *args, **kwargs):
        return _stand_in(_made_by(cls.path, args))

    def __setstate__(cls, state):
        pass

    def append(cls, item):
        pass

    def extend(cls, items):
        pass

    def __setitem__(cls, key, value):
        pass

    def __repr__(cls):
        return f"<unloaded {cls.path}>"


@functools.lru_cache(maxsize=256)
def _stand_in(path: str) -> Unloaded:
    def __new__(cls, *args, **kwargs):  # noqa: N807 (NEWOBJ calls cls.__new__(cls, ...))
        return cls

    return Unloaded("Unloaded", (), {"path": path, "__new__": __new__, "__slots__": ()})


def _made_by(path: str, args: tuple) -> str:
    """A better name than the rebuilding function's, where its arguments tell one."""
    try:
        if path == "dill._dill._create_type":  # a class by value: (type, name, bases, dict)
            namespace = args[3]
            return f"{namespace.get('__module__', '?')}.{namespace.get('__qualname__', args[1])}"
        if path == "django.db.models.base.model_unpickle":  # a model instance
            return ".".join(args[0])
    except Exception:
        pass
    return path


# What peek_call builds for real: plain data as _plain knows it, and what Django
# projects pass most, whose unpickling runs no code but the standard library's.
# Classes pickle rebuilds with NEWOBJ, which wants the type itself:
_PEEKED_TYPES = frozenset({
    ("uuid", "UUID"), (__name__, "FunctionRef"), (__name__, "RetryPolicy"),
    (__name__, "ByValue"),
})
# Constructors pickle calls (REDUCE), each through a _Guarded:
_PEEKED_CALLS = frozenset({
    *(("builtins", name) for name in ("set", "frozenset", "complex", "bytearray", "bytes",
                                       "int", "float", "str", "bool", "list", "dict",
                                       "tuple")),
    ("_codecs", "encode"), ("collections", "OrderedDict"),
    ("datetime", "date"), ("datetime", "datetime"), ("datetime", "time"),
    ("datetime", "timedelta"), ("datetime", "timezone"), ("decimal", "Decimal"),
    ("zoneinfo", "ZoneInfo._unpickle"), ("zoneinfo", "ZoneInfo"),
})


class _Guarded:
    """A constructor that peek may call. What it refuses (a stand-in among its
    arguments: a datetime whose tzinfo is one of dateutil's, say) gives a stand-in for
    that object alone instead of failing the whole load, and a number is never taken
    for a size (bytes(10**10), from bytes someone wrote by hand)."""

    __slots__ = ("kind", "path")

    def __init__(self, kind, path: str):
        self.kind, self.path = kind, path

    def __call__(self, *args):
        if self.kind in (bytes, bytearray) and args and isinstance(args[0], int):
            return _stand_in(self.path)
        try:
            return self.kind(*args)
        except Exception:
            return _stand_in(self.path)

    def __repr__(self):  # a class passed as an argument (`int`) shows as itself
        return repr(self.kind)


def _peek_class(module: str, name: str, find_class):
    if (module, name) in _PEEKED_TYPES:
        return find_class(module, name)
    if (module, name) in _PEEKED_CALLS:
        return _Guarded(find_class(module, name), f"{module}.{name}")
    if (module, name) == ("builtins", "getattr"):
        return _peek_getattr  # dill's way to name ZoneInfo._unpickle
    if (module, name) == ("dill._dill", "_load_type"):
        return _peek_type  # dill's way to name a builtin type (complex, ValueError)
    return _stand_in(f"{module}.{name}")


class _Peeker(pickle.Unpickler):
    def find_class(self, module, name):
        return _peek_class(module, name, super().find_class)


class _PyPeeker(pickle._Unpickler):
    """_Peeker in Python, for a process where copyreg extension codes are registered:
    the C unpickler resolves EXT opcodes through copyreg's process-wide cache first,
    which a real load fills with real classes (a peek then called them) and a peek
    would fill with stand-ins (later real loads got them)."""

    def find_class(self, module, name):
        return _peek_class(module, name, super().find_class)

    def get_extension(self, code):
        key = copyreg._inverted_registry.get(code)
        if not key:
            raise pickle.UnpicklingError(f"unregistered extension code {code}")
        self.append(self.find_class(*key))


def _peek_type(name: str):
    """dill's _load_type for the builtin types peek_call builds, a stand-in else (code
    and function types, say, which would rebuild a function)."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, BaseException):
        return kind
    if ("builtins", name) in _PEEKED_CALLS:
        return _Guarded(kind, f"builtins.{name}")
    return _stand_in(f"builtins.{name}")


def _peek_getattr(obj, name, *default):
    kind = obj.kind if isinstance(obj, _Guarded) else obj
    if isinstance(kind, type) and not isinstance(kind, Unloaded):
        path = (kind.__module__, f"{kind.__qualname__}.{name}")
        if path in _PEEKED_CALLS:
            return _Guarded(getattr(kind, name), ".".join(path))
    return _stand_in(f"{getattr(obj, 'path', '?')}.{name}")


def peek_call(blob: bytes, task_path: str) -> Call:
    """The call in verified bytes as a worker process may look at it, for the results
    its signals carry: the function by its import path, arguments of plain types as they
    are, and Unloaded stand-ins for anything else, whose class's code does not run here.
    A function sent by value is the one at `task_path` if this process has it (as
    ByValue.resolve), else a stand-in. Its policy is the one that travels apart
    (load_policy), or the default one for bytes written before it did.
    """
    spec, args, kwargs = _peek(blob) or (None, (), {})
    if isinstance(spec, FunctionRef):
        func = spec.resolve()
    else:
        module, _, qualname = task_path.rpartition(".")
        func = find_local(module, qualname) or _unloaded_function(module, qualname)
    return Call(func, tuple(args), dict(kwargs), load_policy(blob) or RetryPolicy())


def peek_arguments(blob: bytes) -> tuple[tuple, dict] | None:
    """The arguments in verified bytes as peek_call gives them, without the function
    (which need not be importable here); None if they cannot be told."""
    peeked = _peek(blob)
    return None if peeked is None else peeked[1:]


def _load_peeking(blob: bytes):
    # copyreg.add_extension runs at import time, if ever: a registry empty now stays so.
    peeker = _PyPeeker if copyreg._inverted_registry else _Peeker
    return peeker(io.BytesIO(blob)).load()


def _peek(blob: bytes):
    try:
        spec, args, kwargs, _ = _load_peeking(blob)
        # Inside the try: in bytes not made by dump_call the arguments may be anything
        # (a number, a stand-in), and a caller is promised None, never an error.
        return spec, tuple(args), dict(kwargs)
    except Exception:
        # A real type refused a stand-in among its parts (a datetime given a tzinfo
        # that is not one): no arguments, as for a payload that cannot be loaded.
        return None


def _unloaded_function(module: str, qualname: str):
    """Stands for a function sent by value, under its own name (a task's module_path
    and name are the submitted function's)."""
    def unloaded(*args, **kwargs):
        raise RuntimeError("A function sent by value is not loaded in a worker process.")

    unloaded.__module__ = module or "__main__"
    unloaded.__qualname__ = qualname
    unloaded.__name__ = qualname.rpartition(".")[2]
    return unloaded


def dump_value(value) -> bytes:
    """Serialize a return value (raises SerializationError)."""
    if _plain(value):
        return _fast_dumps(value)
    try:
        return _dill_dumps(value)
    except RecursionError:
        if _plain_nested(value):  # see dump_call
            with contextlib.suppress(RecursionError):
                return _fast_dumps(value)
        raise SerializationError(
            f"The return value ({type(value).__qualname__}) is nested too deep to be "
            "serialized; return something flatter.") from None
    except _OpenFileFound as found:
        raise SerializationError(
            f"The return value ({type(value).__qualname__}) holds an open file "
            f"({found.described}), which the reader would have to open again by its path; "
            "return its name or its bytes.") from None
    except Exception as exc:
        raise SerializationError(
            f"The return value ({type(value).__qualname__}) cannot be serialized by dill "
            f"({type(exc).__name__}: {exc}); return something dill can pickle."
        ) from exc


_VALUE_REPR = reprlib.Repr(maxlevel=3, maxtuple=20, maxlist=20, maxarray=20, maxdict=20,
                           maxset=20, maxfrozenset=20, maxdeque=20, maxstring=200,
                           maxlong=100, maxother=200)
VALUE_REPR_CHARS = 500


def value_repr(value) -> str | None:
    """A return value for people, recorded beside it for the dashboard, which does not
    unpickle objects other than plain data (peek_value); None for plain data, which it
    shows as it is. Never raises: a hostile __repr__ must not fail a job that ran."""
    if _plain(value):
        return None
    try:
        text = _VALUE_REPR.repr(value)
    except BaseException:  # noqa: BLE001 (a __repr__ raising SystemExit included)
        text = f"<{type(value).__qualname__}>"
    return text if len(text) <= VALUE_REPR_CHARS else text[:VALUE_REPR_CHARS - 1] + "…"


def peek_value(blob: bytes):
    """A verified return value as peek_call reads arguments: plain data as it is,
    Unloaded stand-ins for other objects. Raises pickle's errors for bytes it cannot
    read at all."""
    return _load_peeking(blob)


def short_repr(args, kwargs, limit: int = 500) -> str:
    """Render arguments for people (dashboard, logs), shortened; never raises."""
    try:
        parts = [_safe_repr(a) for a in args] + [f"{k}={_safe_repr(v)}" for k, v in kwargs.items()]
        text = ", ".join(parts)
    except Exception:  # a hostile __repr__ must not break a submission
        text = "<unrepresentable>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _safe_repr(value) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__qualname__}>"
    return text if len(text) <= 200 else text[:199] + "…"


__all__ = ["dump_call", "load_call", "load_policy", "peek_call", "peek_arguments",
           "peek_value", "value_repr", "loads", "dump_value",
           "function_spec", "short_repr", "Unloaded"]
