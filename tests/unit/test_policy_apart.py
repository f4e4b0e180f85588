"""A job's retry policy travels apart from its arguments (serialization.load_policy),
and a worker process looks at a call without unpickling its arguments (peek_call)."""

import datetime
import decimal
import json
import pickle
import uuid
import zoneinfo

import dill

from tests import tasks
from zktasks import serialization
from zktasks.serialization import RetryPolicy, Unloaded


class Recorded:
    """An argument whose unpickling is seen: it appends to `LOADED`."""

    def __reduce__(self):
        return _note_loaded, ()


LOADED: list = []


def _note_loaded():
    LOADED.append(1)
    return "loaded"


class Local:  # a class of a test module: travels by value, like one of __main__
    def __init__(self):
        self.x = 1


def test_a_worker_of_the_previous_release_reads_the_new_bytes():
    """pickle.loads and dill.loads stop at the call's STOP: the policy after it is
    invisible to a worker that does not know it is there (a rolling upgrade)."""
    policy = RetryPolicy(backoff=2.0, retry_on=(ValueError,))
    plain = serialization.dump_call(json.dumps, (1, "a"), {"k": [2]}, task_path="t",
                                    policy=policy)
    assert pickle.loads(plain) == (serialization.FunctionRef("json", "dumps"), (1, "a"),
                                   {"k": [2]}, policy)
    by_value = serialization.dump_call(lambda x: x * 3, (Local(),), {}, task_path="t",
                                       policy=RetryPolicy(backoff=lambda a, e: 9))
    spec, args, kwargs, old_policy = dill.loads(by_value)
    assert spec.resolve()(2) == 6 and args[0].x == 1 and old_policy.backoff.resolve()(1, 0) == 9


def test_the_policy_is_read_without_the_arguments():
    LOADED.clear()
    for policy in (RetryPolicy(), RetryPolicy(backoff=5, retry_on=(KeyError, OSError)),
                   RetryPolicy(backoff=lambda attempt, exc: attempt * 10)):
        blob = serialization.dump_call(json.dumps, (Recorded(),), {}, task_path="t",
                                       policy=policy)
        read = serialization.load_policy(blob)
        assert read.retry_on == policy.retry_on
        if callable(policy.backoff):
            assert read.backoff(3, None) == 30
        else:
            assert read.backoff == policy.backoff
    assert LOADED == []
    assert serialization.load_call(blob).args == ("loaded",)  # the task process's load
    # The default policy costs 8 bytes.
    bare = serialization.dump_call(json.dumps, (1,), {}, task_path="t")
    assert len(bare) == len(pickle.dumps(pickle.loads(bare), pickle.HIGHEST_PROTOCOL)) + 8


def test_bytes_from_before_say_so():
    """No trailer: load_policy says None (the worker then loads the call, as before)."""
    old = dill.dumps((serialization.FunctionRef("json", "dumps"), (1,), {}, RetryPolicy(3)))
    assert serialization.load_policy(old) is None
    assert serialization.peek_call(old, "json.dumps").policy == RetryPolicy()


def test_peek_call_builds_plain_data_and_stands_in_for_the_rest():
    from django.contrib.auth.models import User

    LOADED.clear()
    plain = (1, 2.5, "s", b"b", None, True, [1, {2, 3}], {"k": (4,)}, frozenset({5}),
             1 + 2j, decimal.Decimal("1.10"), uuid.UUID(int=7),
             datetime.datetime(2026, 1, 2, 3, 4, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
             datetime.date(2026, 1, 2), datetime.timedelta(seconds=3), ValueError("v"), int)
    others = {"recorded": Recorded(), "local": Local(), "user": User(username="u"),
              "function": lambda: 1}
    for func in (json.dumps, tasks.add.func):  # by reference (C pickle), by value (dill)
        blob = serialization.dump_call(func, plain, others, task_path="tests.tasks.add")
        call = serialization.peek_call(blob, "tests.tasks.add")
        assert call.args[:-2] == plain[:-2]
        # A class passed as a value that peek may also call comes guarded, shown as it.
        assert str(call.args[-2]) == "v" and repr(call.args[-1]) == "<class 'int'>"
        assert all(isinstance(v, Unloaded) for v in call.kwargs.values())
        assert call.kwargs["recorded"].path == f"{__name__}._note_loaded"
        assert call.kwargs["user"].path == "auth.User"
        assert repr(call.kwargs["user"]) == "<unloaded auth.User>"
        if func is tasks.add.func:  # by value: found here by its path, as resolve() does
            assert call.func is tasks.add.func
            assert call.kwargs["local"].path == f"{__name__}.Local"
    assert LOADED == []


def test_peek_call_of_a_function_by_value_that_is_not_here():
    """It keeps the submitted function's name: a signal's task_result.task names it."""
    from django.tasks import task_backends

    from zktasks.records import StatusRecord

    blob = serialization.dump_call(lambda: 1, (), {}, task_path="__main__.make.<locals>.f")
    call = serialization.peek_call(blob, "__main__.make.<locals>.f")
    assert call.args == () and not isinstance(call.func, Unloaded)
    record = StatusRecord(id="a" * 32, task="__main__.make.<locals>.f", backend="default",
                          queue="default", priority=0)
    task = task_backends["default"]._task_for(record, call.func, call.policy)
    assert task.module_path == "__main__.make.<locals>.f" and task.name == "f"


class FixedTz(datetime.tzinfo):
    def utcoffset(self, dt):
        return datetime.timedelta(hours=1)


class _HostileRepr:
    def __repr__(self):
        raise SystemExit("no")


def test_a_return_value_s_repr_is_recorded_only_when_it_is_not_plain_data():
    from zktasks.records import StatusRecord

    assert serialization.value_repr({"a": [1, 2]}) is None  # shown as it is
    assert serialization.value_repr(Local()).startswith("<tests.unit.test_policy_apart.Local")
    assert serialization.value_repr(_HostileRepr()) == "<_HostileRepr>"
    assert len(serialization.value_repr([Local()] * 10_000)) <= serialization.VALUE_REPR_CHARS
    record = StatusRecord(id="j", task="t", backend="default", queue="default", priority=0)
    assert b"result_repr" not in record.to_bytes()  # older readers see no new key
    shown = record.evolve(result_repr="<x>")
    assert StatusRecord.from_bytes(shown.to_bytes()).result_repr == "<x>"


def test_peek_value_stands_in_for_what_is_not_plain_data():
    LOADED.clear()
    peeked = serialization.peek_value(serialization.dump_value([Recorded(), {"k": 1}]))
    assert isinstance(peeked[0], Unloaded) and peeked[1] == {"k": 1}
    assert LOADED == []


def test_peek_gives_a_stand_in_for_what_a_real_type_refuses_and_keeps_the_rest():
    """A datetime whose tzinfo is not plain data (dateutil's, a class of the project):
    the datetime refused the stand-in, and the whole load failed, every argument lost."""
    when = datetime.datetime(2026, 1, 1, tzinfo=FixedTz())
    blob = serialization.dump_call(json.dumps, (when, "kept"), {}, task_path="t")
    args, kwargs = serialization.peek_arguments(blob)
    assert isinstance(args[0], Unloaded) and args[0].path == "datetime.datetime"
    assert args[1] == "kept"


def test_peek_takes_no_number_for_a_size():
    """Bytes written by hand (with the signing key) could ask a whitelisted constructor
    for gigabytes: bytes(10**10)."""
    # (None, (bytes(10**10),), {}, None), in pickle's protocol 0
    crafted = b"(N(cbuiltins\nbytes\n(L10000000000L\ntRt}Nt."
    args, _ = serialization.peek_arguments(crafted)
    assert isinstance(args[0], Unloaded) and args[0].path == "builtins.bytes"


def test_peek_arguments_that_are_not_a_tuple_and_a_dict_mean_none():
    """Bytes not made by dump_call (found by fuzzing peek with mutated calls): the
    arguments were turned into a tuple and a dict outside the guard, so a number or a
    list of pairs of the wrong length raised where callers are promised None."""
    # (None, 5, {}, None) and (None, (), [(1,)], None), in pickle's protocol 0
    assert serialization.peek_arguments(b"(NI5\n(dNt.") is None
    assert serialization.peek_arguments(b"(N)((I1\ntlNt.") is None
    assert serialization.peek_call(b"(NI5\n(dNt.", "json.dumps").args == ()


def test_peek_does_not_share_copyreg_s_extension_cache():
    """The C unpickler looks EXT codes up in copyreg's process-wide cache first: a real
    load filled it with the real class (a peek then called it), and a peek filled it
    with a stand-in (later real loads got that)."""
    import copyreg

    # The registry itself: the C pickle module holds these very dicts.
    copyreg.add_extension(__name__, "_note_loaded", 240)
    try:
        blob = serialization.dump_call(json.dumps, (Recorded(),), {}, task_path="t")
        assert b"\x82\xf0" in blob  # EXT1 240: _note_loaded by its code
        LOADED.clear()
        assert pickle.loads(blob)[1] == ("loaded",)  # a real load fills the cache
        args, _ = serialization.peek_arguments(blob)
        assert isinstance(args[0], Unloaded) and LOADED == [1]
        assert pickle.loads(blob)[1] == ("loaded",)  # and a peek did not change it
    finally:
        copyreg.remove_extension(__name__, "_note_loaded", 240)


def test_a_policy_by_value_is_pickled_once():
    """The call holds the trailer's own bytes, not a second pickling by dill (a lambda
    backoff cost a submit 80 % more)."""
    blob = serialization.dump_call(json.dumps, (1,), {}, task_path="t",
                                   policy=RetryPolicy(backoff=lambda attempt, exc: 4))
    size = int.from_bytes(blob[-8:-4], "big")
    pickled = blob[-8 - size:-8]
    assert blob.count(pickled) == 2
    assert serialization.load_call(blob).policy.backoff(1, None) == 4
