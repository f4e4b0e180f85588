"""Unit tests of the pure modules: no ZooKeeper here."""

import base64
import dataclasses
import json

import pytest

from tests import tasks as tasks_module
from zktasks import envelope, records, serialization
from zktasks.conf import Options
from zktasks.exceptions import ConfigurationError, CorruptRecord, PayloadVerificationError
from zktasks.leader import Leader, WorkerView
from zktasks.ratelimit import Buckets
from zktasks.tree import (
    BUCKET_MS,
    bucket_expiry_ms,
    bucket_start,
    delayed_node_name,
    delayed_shards,
    finished_bucket,
    finished_leaf,
    finished_leaves,
    job_node_name,
    new_job_id,
    parse_bucket,
    parse_delayed_node,
    parse_job_node,
)

KEY = "k" * 50


def test_envelope_round_trip_and_binding():
    sealed = envelope.seal(b"abc", job_id="j1", kind=envelope.PAYLOAD, key=KEY)
    assert envelope.open_envelope(sealed, job_id="j1", kind=envelope.PAYLOAD, keys=(KEY,)) == b"abc"
    for job_id, kind, key in [("j2", envelope.PAYLOAD, KEY), ("j1", envelope.RESULT, KEY),
                              ("j1", envelope.PAYLOAD, "other")]:
        with pytest.raises(PayloadVerificationError):
            envelope.open_envelope(sealed, job_id=job_id, kind=kind, keys=(key,))


def test_envelope_refuses_modified_bytes_and_garbage():
    sealed = envelope.seal(b"abc", job_id="j", kind="payload", key=KEY)
    forged = dict(sealed, data=base64.b64encode(b"abd").decode())
    for bad in (forged, {"data": sealed["data"]}, None, "x", dict(sealed, data="%%%")):
        with pytest.raises(PayloadVerificationError):
            envelope.open_envelope(bad, job_id="j", kind="payload", keys=(KEY,))


def test_envelope_opens_with_a_fallback_key_and_seals_with_the_current_one():
    old = envelope.seal(b"abc", job_id="j", kind=envelope.PAYLOAD, key="old-key")
    keys = ("new-key", "old-key")
    assert envelope.open_envelope(old, job_id="j", kind=envelope.PAYLOAD, keys=keys) == b"abc"
    with pytest.raises(PayloadVerificationError, match="SIGNING_KEY_FALLBACKS"):
        envelope.open_envelope(old, job_id="j", kind=envelope.PAYLOAD, keys=("new-key",))
    # One key given as a string is that key, not its characters.
    assert envelope.open_envelope(old, job_id="j", kind=envelope.PAYLOAD,
                                  keys="old-key") == b"abc"
    with pytest.raises(PayloadVerificationError):
        envelope.open_envelope(old, job_id="j", kind=envelope.PAYLOAD, keys="oldkey-")


def test_mac_is_sha256():
    sealed = envelope.seal(b"", job_id="j", kind="payload", key=KEY)
    assert len(sealed["mac"]) == 64


def test_job_ids_sort_by_time_and_node_names_by_priority():
    first, second = new_job_id(), new_job_id()
    assert len(first) == 32 and first[:12] <= second[:12]
    names = sorted([job_node_name(0, first), job_node_name(10, second),
                    job_node_name(-5, first), job_node_name(0, second)])
    assert [parse_job_node(n) for n in names] == [(10, second), (0, first), (0, second),
                                                  (-5, first)]
    assert parse_job_node("garbage") is None


def test_status_record_round_trip_is_readable_json():
    record = records.StatusRecord(
        id="a" * 32, task="m.f", backend="default", queue="q", priority=3,
        enqueued_at=records.now(), worker_ids=("w",),
        errors=(records.ErrorRecord(exception_class_path="x.Y", message="m", traceback="t"),),
    )
    raw = record.to_bytes()
    assert json.loads(raw)["state"] == "READY"
    assert records.StatusRecord.from_bytes(raw) == record
    for bad in (b"", b"[]", b'{"state": "WEIRD"}', b"\xff"):
        with pytest.raises(CorruptRecord):
            records.StatusRecord.from_bytes(bad)


def test_finished_bucket_names_carry_a_per_task_ttl():
    ms = 1_700_000_012_345
    assert finished_bucket(ms) == "1700000010000"
    assert finished_bucket(ms, 2) == "1700000010000-2"
    assert finished_bucket(ms, 1.2) == "1700000010000-2"  # whole seconds, rounded up
    assert finished_bucket(ms, 0.1) == "1700000010000-1"
    assert parse_bucket("1700000010000") == (1_700_000_010_000, None)
    assert parse_bucket("1700000010000-604800") == (1_700_000_010_000, 604_800)
    for foreign in ("", "abc", "170000001000", "1700000010000-", "1700000010000-0",
                    "1700000010000-x", "1700000010000-2-3", "-1700000010000"):
        assert parse_bucket(foreign) is None, foreign
    assert bucket_start("1700000010000-5") == bucket_start("1700000010000")
    # A bucket expires when its ten seconds are over plus its TTL (global if no suffix).
    assert bucket_expiry_ms("1700000010000", 60) == 1_700_000_010_000 + BUCKET_MS + 60_000
    assert bucket_expiry_ms("1700000010000-2", 60) == 1_700_000_010_000 + BUCKET_MS + 2_000
    assert bucket_expiry_ms("garbage", 60) is None
    # Buckets of one start sort together, before the next start's.
    names = sorted(["1700000020000", "1700000010000-30", "1700000010000",
                    "1700000010000-5"])
    assert [bucket_start(n) for n in names] == ["1700000010000"] * 3 + ["1700000020000"]


def test_finished_leaves_are_a_bucket_s_seconds_and_older_direct_entries():
    ms = 1_700_000_012_345
    assert finished_leaf(ms) == "1700000010000/2"
    assert finished_leaf(ms, 60) == "1700000010000-60/2"
    assert finished_leaf(1_700_000_019_999) == "1700000010000/9"
    entry = "a" * 32 + ".S.default"
    tree = {"1700000010000": ["3", "0", entry], "1700000010000/0": ["b" * 32 + ".F.q"],
            "1700000010000/3": [], "1700000020000": ["7"], "1700000020000/7": None}
    asked = []

    def list_many(relatives):
        asked.append(sorted(relatives))
        return {r: tree.get(r) for r in relatives}

    leaves = finished_leaves(["1700000010000", "1700000020000", "1700000030000"], list_many)
    assert leaves == {
        "1700000010000": {"1700000010000": [entry], "1700000010000/0": ["b" * 32 + ".F.q"],
                          "1700000010000/3": []},
        "1700000020000": {"1700000020000/7": []},   # a second deleted meanwhile
        "1700000030000": {},                         # a bucket deleted meanwhile
    }
    assert len(asked) == 2  # buckets in one call, then all their seconds in one


def test_status_record_result_ttl_is_optional_and_old_records_load():
    record = records.StatusRecord(id="a" * 32, task="m.f", backend="default", queue="q",
                                  priority=0)
    assert "result_ttl" not in json.loads(record.to_bytes())  # old readers still load it
    assert records.StatusRecord.from_bytes(record.to_bytes()).result_ttl is None
    kept = record.evolve(result_ttl=2.5)
    assert records.StatusRecord.from_bytes(kept.to_bytes()).result_ttl == 2.5
    old = json.loads(record.to_bytes())
    old.pop("result_ttl", None)
    assert records.StatusRecord.from_bytes(json.dumps(old).encode()) == record


def _module_function(x):
    return x + 1


def test_by_value_decisions():
    assert serialization.travels_by_value(lambda: 1)
    assert serialization.travels_by_value(_module_function)  # a test module
    assert not serialization.travels_by_value(json.dumps)


def test_by_value_function_carries_its_module_helpers():
    blob = serialization.dump_call(_module_function, (1,), {}, task_path="t")
    call = serialization.load_call(blob)
    assert call.func(*call.args) == 2


def _uses_a_module(x):
    return tasks_module.add.func(x, x), tasks_module.__name__


def test_a_module_a_by_value_function_names_travels_by_name():
    """dill pickled the module's whole __dict__ (tests.tasks: every task in it), and
    loading it failed on a task made as `x = zk_task(_x)`."""
    blob = serialization.dump_call(_uses_a_module, (2,), {}, task_path="t")
    assert len(blob) < 2_000
    call = serialization.load_call(blob)
    assert call.func(*call.args) == (4, "tests.tasks")


def test_short_repr_survives_hostile_repr():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

    assert "Hostile" in serialization.short_repr((Hostile(),), {})
    assert len(serialization.short_repr(("x" * 10_000,), {})) <= 500


@pytest.mark.parametrize("options,match", [
    ({"HOSTS": ""}, "HOSTS"),
    ({"HOSTS": "nohostport"}, "not 'host:port'"),
    ({"HOSTS": "h:1/chroot"}, "chroot"),
    ({"HOSTS": "::1:2181"}, r"IPv6 address in brackets, as in '\[::1\]:2181'"),
    ({"ROOT": "relative"}, "ROOT"),
    ({"ROOT": "/"}, "ROOT"),
    ({"SESSION_TIMEOUT": 0}, "SESSION_TIMEOUT"),
    ({"AUTH": "nopassword"}, "AUTH"),
    ({"MAX_RECORD_BYTES": 5_000_000}, "MAX_RECORD_BYTES"),
    ({"DEAD_LETTER_TTL": 0}, "DEAD_LETTER_TTL"),
    ({"DEAD_LETTER_LIMIT": 0}, "DEAD_LETTER_LIMIT"),
    ({"DEAD_LETTER_LIMIT": 2.5}, "DEAD_LETTER_LIMIT"),
    ({"TYPO": 1}, "unknown keys"),
    ({"SIGNING_KEY_FALLBACKS": "old-key"}, "SIGNING_KEY_FALLBACKS.*list"),
    ({"SIGNING_KEY_FALLBACKS": ["old", ""]}, "SIGNING_KEY_FALLBACKS"),
    ({"TLS": "yes"}, r"\['TLS'\] is 'yes'; give True, or a dict"),
    ({"TLS": {"CAFILE": "ca.pem"}}, "unknown keys"),
    ({"TLS": {"CA": "/nonexistent/ca.pem"}}, r"\['CA'\] is '/nonexistent/ca.pem', which is "
                                             "not a readable file"),
    ({"TLS": {"CA": 7}}, r"\['CA'\] is 7; give a path"),
    ({"TLS": {"VERIFY": "no"}}, r"\['VERIFY'\] is 'no'; give True or False"),
    ({"TLS": {"VERIFY": False}}, "set CHECK_HOSTNAME False too"),
    ({"TLS": {"KEYFILE": "/etc/hostname"}}, "a KEYFILE but no CERTFILE"),
    ({"TLS": {"KEYFILE_PASSWORD": "pw"}}, "a KEYFILE_PASSWORD but no CERTFILE"),
    ({"TLS": {"CA": "/etc"}}, "not a directory: put the CA certificates in one file"),
    ({"TLS": {"CA": "/etc/hostname"}}, r"\['CA'\] does not load"),
])
def test_options_errors_name_the_setting(options, match):
    with pytest.raises(ConfigurationError, match=match):
        Options.from_params("default", {"OPTIONS": options})


def test_options_defaults():
    options = Options.from_params("default", {})
    assert options.hosts == "127.0.0.1:2181" and options.root == "/zktasks"
    assert options.signing_key  # SECRET_KEY
    assert options.dead_letter_ttl == 30 * 86400 and options.dead_letter_limit == 1000
    kept = Options.from_params("default", {"OPTIONS": {"DEAD_LETTER_TTL": None}})
    assert kept.dead_letter_ttl is None  # kept however old (the limit still holds)


def test_options_keep_their_secrets_out_of_repr():
    options = Options.from_params("default", {"OPTIONS": {
        "AUTH": "alice:s3cret", "SIGNING_KEY": "sk-XYZ", "SIGNING_KEY_FALLBACKS": ["sk-OLD"],
        "TLS": {"VERIFY": False, "CHECK_HOSTNAME": False}}})
    options = dataclasses.replace(options, tls=dataclasses.replace(
        options.tls, keyfile_password="kp-SECRET"))
    text = repr(options)
    assert "127.0.0.1:2181" in text and "verify=False" in text
    assert not any(secret in text for secret in ("s3cret", "sk-XYZ", "sk-OLD", "kp-SECRET"))


@pytest.mark.parametrize("options, match", [
    ({"SIGNING_KEY_FALLBACKS": "sk-OLD"}, r"is of type str, not a list"),
    ({"SIGNING_KEY_FALLBACKS": ["sk-OLD", ""]}, r"FALLBACKS'\] entry 1 is an empty string"),
    ({"SIGNING_KEY_FALLBACKS": ["sk-OLD", b"sk-BYTES"]}, r"entry 1 is of type bytes"),
    ({"TLS": {"CERTFILE": "/etc/hostname", "KEYFILE_PASSWORD": b"kp-SECRET"}},
     r"\['KEYFILE_PASSWORD'\] is of type bytes; give"),
])
def test_option_errors_never_show_a_secret(options, match):
    """check() prints these (zktasks.E001) in deploy and CI logs, and a fallback key
    still verifies signatures: the message says what is wrong, not the value."""
    with pytest.raises(ConfigurationError, match=match) as raised:
        Options.from_params("default", {"OPTIONS": options})
    assert not any(s in str(raised.value) for s in ("sk-OLD", "sk-BYTES", "kp-SECRET"))


def test_secret_key_fallbacks_are_not_shown_either(settings):
    settings.SECRET_KEY_FALLBACKS = ["OLD-DJANGO-SECRET", ""]  # env("OLD", default="")
    with pytest.raises(ConfigurationError,
                       match="SECRET_KEY_FALLBACKS entry 1 is an empty string") as raised:
        Options.from_params("default", {})
    assert "OLD-DJANGO-SECRET" not in str(raised.value)


def test_the_client_key_holds_no_password():
    """The registry key of a shared client is a local of the frames that connect, and
    Django's error pages and error trackers show frame locals: an unreachable ZooKeeper
    raises through them from a view."""
    alice = Options.from_params("default", {"OPTIONS": {"AUTH": "alice:s3cret"}})
    assert "s3cret" not in repr(alice.client_key)
    assert alice.client_key == Options.from_params(
        "default", {"OPTIONS": {"AUTH": "alice:s3cret"}}).client_key  # still shared
    assert alice.client_key != Options.from_params(
        "default", {"OPTIONS": {"AUTH": "alice:other"}}).client_key


def test_tls_options():
    assert Options.from_params("default", {}).tls is None
    assert Options.from_params("default", {"OPTIONS": {"TLS": False}}).tls is None
    system = Options.from_params("default", {"OPTIONS": {"TLS": True}})
    assert system.tls.client_kwargs() == {
        "use_ssl": True, "ca": None, "certfile": None, "keyfile": None,
        "keyfile_password": None, "verify_certs": True, "check_hostname": True}
    # Another TLS setting is another session, not a shared one.
    assert system.client_key != Options.from_params("default", {}).client_key


def test_signing_key_fallbacks_follow_secret_key_fallbacks_unless_set(settings):
    settings.SECRET_KEY_FALLBACKS = ["old-secret"]
    default = Options.from_params("default", {})
    assert default.verify_keys == (settings.SECRET_KEY, "old-secret")
    own = Options.from_params("default", {"OPTIONS": {"SIGNING_KEY": "mine"}})
    assert own.verify_keys == ("mine",)  # SECRET_KEY's old keys never signed these
    rotated = Options.from_params("default", {"OPTIONS": {
        "SIGNING_KEY": "new", "SIGNING_KEY_FALLBACKS": ("older", "oldest")}})
    assert rotated.signing_key == "new"
    assert rotated.verify_keys == ("new", "older", "oldest")
    settings.SECRET_KEY_FALLBACKS = "old-secret"
    with pytest.raises(ConfigurationError, match="SECRET_KEY_FALLBACKS"):
        Options.from_params("default", {})


def bare_leader(rate_limits=None, now=0.0) -> Leader:
    """A Leader with only what plan() reads: no store, no ZooKeeper."""
    leader = Leader.__new__(Leader)
    leader.buckets = Buckets(rate_limits or {}, now)
    return leader


def test_plan_prefers_priority_then_age_and_least_loaded_worker():
    leader = bare_leader()
    a, b = "0" * 31 + "a", "0" * 31 + "b"
    leader.pending = {"default": sorted([job_node_name(0, a), job_node_name(5, b)]),
                      "emails": [job_node_name(0, "0" * 31 + "c")]}
    leader.workers = {
        "w1": WorkerView("w1", frozenset({"default"}), concurrency=1),
        "w2": WorkerView("w2", frozenset({"default", "emails"}), concurrency=1, prefetch=1,
                         assigned={"x"}),
        "w3": WorkerView("w3", frozenset({"default"}), concurrency=5, draining=True),
    }
    moves = leader.plan()
    # Highest priority first, to the worker with an idle runner (w2's one is busy).
    assert moves[0] == ("default", job_node_name(5, b), "w1")
    assert {m[2] for m in moves} == {"w1", "w2"}  # never the draining worker
    assert len(moves) == 2  # capacity: w1 has 1, w2 has 1 free; one job waits
    assert leader.workers["w2"].free == 0 and leader.workers["w1"].free == 0


def test_plan_sends_a_job_to_an_idle_runner_before_anyone_s_prefetch():
    """A worker whose prefetch grew to 16 has more free slots than an idle worker with 4,
    but its one runner is busy: the job would wait behind a long one."""
    leader = bare_leader()
    leader.pending = {"default": [job_node_name(0, "0" * 31 + "a")]}
    warm = WorkerView("w1", concurrency=1, prefetch=16, assigned={"long"})
    idle = WorkerView("w0", concurrency=1, prefetch=4)
    leader.workers = {"w1": warm, "w0": idle}
    assert warm.free > idle.free
    assert [m[2] for m in leader.plan()] == ["w0"]


def test_plan_refills_a_busy_worker_once_half_its_prefetch_is_gone():
    leader = bare_leader()
    leader.pending = {"default": sorted(job_node_name(0, f"{i:032x}") for i in range(20))}
    # 2 runners + 8 prefetched: with 2 running and 5 queued it wants nothing yet...
    busy = WorkerView("w1", concurrency=2, prefetch=8, assigned={f"r{i}" for i in range(7)})
    leader.workers = {"w1": busy}
    assert leader.plan() == []
    # ...with 4 queued (half of 8) it is filled up in one batch.
    busy.assigned = {f"r{i}" for i in range(6)}
    moves = leader.plan()
    assert len(moves) == 4 and busy.free == 0


def test_system_check_reports_bad_options(settings):
    from django.core import checks

    settings.TASKS = {"default": {"BACKEND": "zktasks.backend.ZooKeeperBackend",
                                  "OPTIONS": {"ROOT": "nope"}}}
    errors = [e for e in checks.run_checks() if e.id.startswith("zktasks")]
    assert [e.id for e in errors] == ["zktasks.E001"]
    assert "ROOT" in errors[0].msg


def test_system_check_imports_schedule_tasks_and_fits_their_arguments(settings):
    """A typo in a schedule's task passed every check; the leader said it once, at the
    first tick, and no job was ever submitted."""
    from django.core import checks

    settings.TASKS = {"default": {
        "BACKEND": "zktasks.backend.ZooKeeperBackend",
        "OPTIONS": {"SCHEDULES": {
            "typo": {"task": "tests.tasks.ad", "every": 60},
            "nomodule": {"task": "tests.nosuch.add", "every": 60},
            "short": {"task": "tests.tasks.add", "every": 60, "args": [1]},
            "plain": {"task": "tests.tasks.os", "every": 60},
            "broken": {"task": "tests.schedule_target_broken.job", "every": 60},
            "fine": {"task": "tests.tasks.add", "every": 60, "args": [1, 2]},
        }}}}
    errors = {e.msg: e.id for e in checks.run_checks() if e.id.startswith("zktasks")}
    found = sorted((next(n for n in ("typo", "nomodule", "short", "plain", "broken", "fine")
                         if f"[{n!r}]" in msg), code) for msg, code in errors.items())
    assert found == [("broken", "zktasks.E003"), ("nomodule", "zktasks.E003"),
                     ("plain", "zktasks.E003"), ("short", "zktasks.E004"),
                     ("typo", "zktasks.E003")]
    assert any("KeyError: 'SETTING_THIS_ENVIRONMENT_LACKS'" in msg for msg in errors)
    assert any("missing a required argument: 'b'" in msg for msg in errors)


def test_plain_calls_use_the_fast_pickler_and_others_dill():
    import json
    import pickle as std_pickle

    from zktasks import serialization
    from zktasks.serialization import dump_call, dump_value, load_call

    class Tag(str):  # a local class: a worker could not import it by reference
        pass

    args = (1, "a", [2.5, None], {"k": (b"x",)})
    plain = dump_call(json.dumps, args, {}, task_path="t")
    std_pickle.loads(plain)  # the standard library reads it: no dill involved
    assert load_call(plain).args == args
    # A str subclass is not plain: dill carries it by value, and dill reads both formats.
    other = load_call(dump_call(json.dumps, (Tag("red"),), {}, task_path="t")).args[0]
    assert other == "red" and type(other).__name__ == "Tag"
    assert serialization._plain({"a": [1, (2, 3)]}) and not serialization._plain([Tag()])
    assert std_pickle.loads(dump_value({"ok": True})) == {"ok": True}


def test_envelope_mac_is_djangos_salted_hmac_with_sha256():
    # The derived key is cached (envelope._derived_key); the MACs must not change.
    from django.utils.crypto import salted_hmac

    for key in [KEY, "other", "ünïcode"]:
        sealed = envelope.seal(b"\x00blob", job_id="j1", kind=envelope.RESULT, key=key)
        expected = salted_hmac("zktasks.envelope", b"result\x00j1\x00\x00blob", secret=key,
                               algorithm="sha256").hexdigest()
        assert sealed["mac"] == expected


def test_loads_reads_standard_and_dill_pickles_alike():
    import pickle

    import dill

    plain = {"a": [1, 2.5, "x"], "b": (None, b"dill")}
    assert serialization.loads(pickle.dumps(plain)) == plain
    square = eval("lambda x: x * x")  # noqa: S307 - a function only dill pickles by value
    assert serialization.loads(dill.dumps(square, recurse=True))(7) == 49


@pytest.mark.parametrize("options,match", [
    ({"MAX_RECORD_BYTES": "abc"}, r"MAX_RECORD_BYTES'\] is 'abc'; give a whole number"),
    ({"MAX_RECORD_BYTES": None}, r"MAX_RECORD_BYTES'\] is None; give a whole number"),
    ({"MAX_RECORD_BYTES": 500_000.5}, "MAX_RECORD_BYTES"),
    ({"MAX_RECORD_BYTES": True}, "MAX_RECORD_BYTES"),
    ({"CONNECT_TIMEOUT": float("nan")}, r"CONNECT_TIMEOUT'\] is nan; give a finite positive"),
    ({"SESSION_TIMEOUT": float("inf")}, r"SESSION_TIMEOUT'\] is inf; give a finite positive"),
    ({"RESULT_TTL": float("inf")}, "RESULT_TTL"),
    ({"DEAD_LETTER_TTL": float("nan")}, "DEAD_LETTER_TTL"),
])
def test_options_refuse_non_numbers_and_non_finite_numbers(options, match):
    with pytest.raises(ConfigurationError, match=match):
        Options.from_params("default", {"OPTIONS": options})


def test_options_keep_fractional_result_ttl_and_numeric_strings():
    def parse(**options):
        return Options.from_params("default", {"OPTIONS": options})

    assert parse(RESULT_TTL=0.5).result_ttl == 1  # rounded up, never to 0
    assert parse(RESULT_TTL=90.2).result_ttl == 91
    assert parse(MAX_RECORD_BYTES="500000").max_record_bytes == 500_000  # from os.environ


def test_system_check_reports_a_non_numeric_max_record_bytes(settings):
    from django.core import checks

    settings.TASKS = {"default": {"BACKEND": "zktasks.backend.ZooKeeperBackend",
                                  "OPTIONS": {"MAX_RECORD_BYTES": "abc"}}}
    errors = [e for e in checks.run_checks() if e.id.startswith("zktasks")]
    assert [e.id for e in errors] == ["zktasks.E001"]
    assert "MAX_RECORD_BYTES" in errors[0].msg


@pytest.mark.parametrize("params, check_id, says", [
    ({"QUEUES": ["default", 1]}, "zktasks.E002", "[1]"),
    ({"OPTIONS": ["HOSTS"]}, "zktasks.E001", "OPTIONS'] is of type list; give a dict"),
])
def test_system_check_reports_settings_of_the_wrong_type(settings, params, check_id, says):
    """Reported as check messages, as Django's own backends do; they raised out of
    check() (TypeError, ValueError), so manage.py check ended in a traceback."""
    from django.core import checks

    settings.TASKS = {"default": {"BACKEND": "zktasks.backend.ZooKeeperBackend", **params}}
    errors = [e for e in checks.run_checks() if e.id.startswith("zktasks")]
    assert [e.id for e in errors] == [check_id] and says in errors[0].msg


@pytest.mark.parametrize("params, says, hint", [
    ({"HOSTS": "zk1:2181"}, "['HOSTS'] beside OPTIONS", "Move them into"),
    ({"QUEUE": ["emails"]}, "unknown keys ['QUEUE']", "go in OPTIONS"),
])
def test_system_check_reports_keys_django_ignores(settings, params, says, hint):
    """Django reads BACKEND, QUEUES and OPTIONS of a TASKS entry and ignores the rest:
    HOSTS put beside OPTIONS (CACHES' LOCATION habit) silently meant 127.0.0.1:2181."""
    from django.core import checks

    settings.TASKS = {"default": {"BACKEND": "zktasks.backend.ZooKeeperBackend", **params}}
    errors = [e for e in checks.run_checks() if e.id.startswith("zktasks")]
    assert [e.id for e in errors] == ["zktasks.E001"]
    assert says in errors[0].msg and hint in errors[0].hint


def test_system_check_reports_every_misplaced_and_unknown_key_at_once(settings):
    from django.core import checks

    settings.TASKS = {"default": {"BACKEND": "zktasks.backend.ZooKeeperBackend",
                                  "HOSTS": "zk1:2181", "QUEUE": ["emails"],
                                  "OPTIONS": {"HOST": "zk1:2181"}}}
    errors = [e for e in checks.run_checks() if e.id.startswith("zktasks")]
    assert [e.id for e in errors] == ["zktasks.E001"] * 3
    assert ["beside OPTIONS" in errors[0].msg, "['QUEUE']" in errors[1].msg,
            "'HOST'" in errors[2].msg] == [True] * 3


def test_seconds_refuse_non_finite_and_absurd_durations():
    import argparse

    from zktasks.management.commands._common import MAX_SECONDS, seconds

    assert seconds("0") == 0 and seconds("2.5") == 2.5 and seconds(str(MAX_SECONDS))
    for bad in ("inf", "-inf", "nan", "1e11", "1e30", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(bad)


@pytest.fixture
def bare_logging():
    """Run runworker's logging set-up as in a project without LOGGING: pytest's capture
    handlers on the root logger put aside meanwhile; zktasks and kazoo restored after."""
    import logging

    from zktasks.management.commands.runworker import Command

    root = logging.getLogger()
    saved = {}
    for name in ("zktasks", "kazoo"):
        logger = logging.getLogger(name)
        saved[name] = (logger.level, list(logger.handlers))
        logger.setLevel(logging.NOTSET)
        logger.handlers = []

    def configure(verbosity: int) -> None:
        # pytest adds its handlers to the root logger at the start of each test phase.
        kept, root.handlers = root.handlers, []
        try:
            Command()._configure_logging(verbosity)
        finally:
            root.handlers = kept

    last_resort = logging.lastResort
    yield configure
    logging.lastResort = last_resort
    for name, (level, handlers) in saved.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.setLevel(level)
        logger.handlers = handlers


@pytest.mark.parametrize("verbosity,zktasks_level,kazoo_level", [
    (0, "WARNING", "WARNING"), (1, "INFO", "WARNING"), (2, "DEBUG", "WARNING"),
    (3, "DEBUG", "INFO"),
])
def test_runworker_logs_by_verbosity_when_the_project_configures_none(
        bare_logging, verbosity, zktasks_level, kazoo_level):
    import logging

    bare_logging(verbosity)
    zk, kazoo = logging.getLogger("zktasks"), logging.getLogger("kazoo")
    assert logging.getLevelName(zk.level) == zktasks_level
    assert logging.getLevelName(kazoo.level) == kazoo_level
    # One timestamped handler for both: kazoo's lines no longer go out bare.
    assert zk.handlers == kazoo.handlers and len(zk.handlers) == 1
    assert "%(asctime)s %(levelname)s" in zk.handlers[0].formatter._fmt


def test_runworker_leaves_a_configured_logger_alone(bare_logging):
    import logging

    zk = logging.getLogger("zktasks")
    zk.setLevel(logging.WARNING)  # as LOGGING = {"loggers": {"zktasks": ...}} does
    bare_logging(2)
    assert zk.level == logging.WARNING and zk.handlers == []
    kazoo = logging.getLogger("kazoo")  # not configured: still gets formatted lines
    assert kazoo.level == logging.WARNING and len(kazoo.handlers) == 1


def test_a_tasks_warning_never_comes_out_ahead_of_held_worker_lines(monkeypatch):
    """runworker's handler holds INFO lines under load; the timestamped last resort
    (a task's own warning) flushes them first, or the warning printed ahead of them."""
    import io
    import logging
    import sys

    from zktasks.loghandler import GroupingStreamHandler, format_last_resort

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(logging, "lastResort", logging.lastResort)  # put back after
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a project that configures no logging
    held = GroupingStreamHandler(stream, delay=3600)  # holds all but a first line
    held.setFormatter(logging.Formatter("%(message)s"))
    format_last_resort(after=held)
    try:
        for message in ("job started", "job succeeded"):
            held.handle(logging.makeLogRecord({"msg": message, "levelno": logging.INFO}))
        assert "job succeeded" not in stream.getvalue()  # held
        logging.lastResort.handle(logging.makeLogRecord(
            {"msg": "from the task", "levelno": logging.WARNING, "levelname": "WARNING",
             "name": "myapp.tasks"}))
        lines = stream.getvalue().splitlines()
        assert lines[:2] == ["job started", "job succeeded"]
        assert lines[2].endswith("WARNING myapp.tasks from the task")
    finally:
        held.close()


def test_the_timestamped_last_resort_writes_to_stderr_as_it_is_now(monkeypatch):
    """Python's own last resort looks sys.stderr up at each record; ours kept the one of
    its install, and missed a redirect (or wrote to a stream closed since)."""
    import contextlib
    import io
    import logging

    from zktasks.loghandler import format_last_resort

    monkeypatch.setattr(logging, "lastResort", logging.lastResort)  # put back after
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    format_last_resort()
    redirected = io.StringIO()
    with contextlib.redirect_stderr(redirected):
        logging.lastResort.handle(logging.makeLogRecord(
            {"msg": "late", "levelno": logging.WARNING, "levelname": "WARNING",
             "name": "myapp"}))
    assert redirected.getvalue().endswith("WARNING myapp late\n")


def test_a_delayed_name_whose_queue_no_queue_can_have_is_foreign():
    job_id = new_job_id()
    name = delayed_node_name(1_800_000_000_000, 0, job_id, "emails.v2")
    assert parse_delayed_node(name) == (1_800_000_000_000, 0, job_id, "emails.v2")
    for queue in ("..", ".", "a/b", ".hidden"):
        name = delayed_node_name(1_800_000_000_000, 0, job_id, queue)
        assert parse_delayed_node(name) is None and delayed_shards(name) is None


def test_a_drain_signal_is_acted_on_even_when_its_line_cannot_be_written():
    """The handler wrote its line, then asked the worker to stop. A signal that came in
    the middle of a write to stderr (a slow pipe: journald, docker) made that line raise
    RuntimeError (a reentrant call), and the drain was never asked for."""
    import signal

    from zktasks.management.commands.runworker import Command

    class Worker:
        stops: list = []

        def stop(self, *, graceful):
            self.stops.append(graceful)

    class Reentrant:
        def write(self, text):
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    command, worker = Command(), Worker()
    command.stderr = Reentrant()
    try:
        command._install_signals(worker)
        handler = signal.getsignal(signal.SIGTERM)
        handler(signal.SIGTERM, None)
        handler(signal.SIGTERM, None)
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)
    assert worker.stops == [True, False]  # drain, then stop at once


@pytest.mark.parametrize("raw", [b'{"size": 1e400}', b"[1]", b"\xff"])
def test_a_dead_letter_that_is_itself_garbage_is_read_as_such(raw):
    """decode() is what the listing, the dashboard and the CLI read entries with: a
    "size" of 1e400 raised OverflowError out of it (a traceback, a 500)."""
    from zktasks import deadletter

    letter = deadletter.decode("0000000000001-junk", raw)
    assert letter.unreadable


def test_times_encode_with_their_own_offset_though_equal_times_were_encoded_before():
    """records._iso keeps the text of UTC times: an equal time in another zone is still
    written with its own offset, and every time reads back as it was."""
    from datetime import UTC, datetime, timedelta, timezone

    from zktasks.records import StatusRecord

    utc = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    paris = utc.astimezone(timezone(timedelta(hours=1)))
    first = StatusRecord(id="j1", task="t", backend="default", queue="q", priority=0,
                         enqueued_at=utc, run_after=paris)
    again = StatusRecord.from_bytes(first.to_bytes())
    assert first.to_json()["enqueued_at"] == "2026-12-03T09:00:00+00:00"
    assert first.to_json()["run_after"] == "2026-12-03T10:00:00+01:00"
    assert (again.enqueued_at, again.run_after) == (utc, paris)
    assert again.run_after.utcoffset() == timedelta(hours=1)


def test_evolve_copies_every_field_changes_the_named_ones_and_refuses_unknown_names():
    """StatusRecord.evolve copies the slots itself (not dataclasses.replace): the copy
    must equal replace()'s, be encoded anew, leave the original alone, and refuse what
    replace() refuses — a name that is no field, and the kept encoding."""
    from zktasks.records import ErrorRecord, StatusRecord

    original = StatusRecord(
        id="j1", task="t", backend="default", queue="q", priority=3, attempts=1,
        enqueued_at=records.now(), payload={"v": 1, "data": "x"}, worker_ids=("w1",),
        errors=(ErrorRecord(exception_class_path="E", message="m", traceback="tb"),),
        extra={"k": "v"}, unique_key="u")
    before = original.to_bytes()
    changed = original.evolve(state=records.RUNNING, attempts=2, worker_ids=("w1", "w2"))
    assert changed == dataclasses.replace(original, state=records.RUNNING, attempts=2,
                                          worker_ids=("w1", "w2"))
    assert changed._encoded is None
    assert json.loads(changed.to_bytes()) == {**json.loads(before), "state": "RUNNING",
                                              "attempts": 2, "worker_ids": ["w1", "w2"]}
    assert original.to_bytes() is before and original.state == records.READY
    assert original.evolve() == original
    for wrong in ({"nope": 1}, {"_encoded": b"{}"}):
        with pytest.raises(TypeError):
            original.evolve(**wrong)
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.state = records.FAILED
