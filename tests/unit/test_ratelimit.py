"""Rate limits per queue: parsing, the token buckets, and how the leader's plan keeps them.
Pure: the clock is passed in, no ZooKeeper."""

import pytest

from tests.unit.test_pure import bare_leader
from zktasks.conf import Options
from zktasks.exceptions import ConfigurationError
from zktasks.leader import WorkerView
from zktasks.ratelimit import Buckets, parse_rate
from zktasks.tree import job_node_name


def jobs(count: int, start: int = 0, priority: int = 0) -> list[str]:
    return sorted(job_node_name(priority, f"{i:032x}") for i in range(start, start + count))


@pytest.mark.parametrize("text,per_second,burst", [
    ("10/s", 10.0, 1), ("100/m", 100 / 60, 1), ("1.5/h", 1.5 / 3600, 1),
    (" 200 / s ", 200.0, 20), (5, 5.0, 1), (250.0, 250.0, 25), ("5", 5.0, 1),
])
def test_rates_are_written_as_celery_writes_them(text, per_second, burst):
    limit = parse_rate(text, "X")
    assert limit.per_second == pytest.approx(per_second) and limit.burst == burst
    assert parse_rate(limit.text, "X") == limit  # what is shown reads back the same


@pytest.mark.parametrize("value,match", [
    ("10/x", r"X is '10/x'; give a rate such as '10/s', '100/m' or '500/h'"),
    ("ten/s", "give a rate such as"),
    (True, "X is True; give a rate"),
    (None, "X is None; give a rate"),
    ("0/s", "must be above 0 .*stop serving it"),
    (-1, "must be above 0"),
    (float("inf"), "too large to be a rate"),
    (10**400, "too large to be a rate"),  # was an OverflowError out of manage.py check
    ("9" * 400 + "/s", "too large to be a rate"),
    ("\uff11\uff10/s", "give a rate such as"),  # full-width digits
    (float("nan"), "must be above 0"),
])
def test_bad_rates_say_what_to_write(value, match):
    with pytest.raises(ConfigurationError, match=match):
        parse_rate(value, "X")


@pytest.mark.parametrize("params,match", [
    ({"OPTIONS": {"RATE_LIMITS": ["emails"]}}, r"\['RATE_LIMITS'\] must be a dict of queue"),
    ({"OPTIONS": {"RATE_LIMITS": {"bad/name": "1/s"}}}, "'bad/name', which is not a queue"),
    ({"QUEUES": ["default"], "OPTIONS": {"RATE_LIMITS": {"emails": "1/s"}}},
     r"names queue 'emails', which is not in QUEUES \['default'\]"),
    ({"QUEUES": [], "OPTIONS": {"RATE_LIMITS": {"emails": "1/d"}}},
     r"\['RATE_LIMITS'\]\['emails'\] is '1/d'"),
    # No QUEUES: Django's default, ["default"], and submits elsewhere are refused.
    ({"OPTIONS": {"RATE_LIMITS": {"emails": "1/s"}}}, r"not in QUEUES \['default'\]"),
])
def test_rate_limit_settings_errors_name_the_setting(params, match):
    with pytest.raises(ConfigurationError, match=match):
        Options.from_params("default", params)


def test_rate_limit_settings():
    options = Options.from_params("default", {"QUEUES": ["default", "emails"], "OPTIONS": {
        "RATE_LIMITS": {"emails": "120/m"}}})
    assert options.rate_limits["emails"].text == "120/m"
    assert options.rate_limits["emails"].per_second == 2.0
    assert Options.from_params("default", {}).rate_limits == {}
    assert Options.from_params("default", {"QUEUES": [], "OPTIONS": {
        "RATE_LIMITS": {"anything": 1}}}).rate_limits["anything"].text == "1/s"
    hash(options)  # the options stay hashable with a dict of limits in them


def test_a_bucket_refills_at_its_rate_and_holds_one_burst():
    buckets = Buckets({"q": parse_rate("2/s", "X"), "fast": parse_rate("100/s", "X")}, 0.0)
    assert buckets.allowance("other", 0.0) is None  # not limited
    assert buckets.allowance("q", 0.0) == 1
    buckets.take("q", 1, 0.0)
    assert buckets.allowance("q", 0.0) == 0
    assert buckets.wait("q", 0.0) == pytest.approx(0.5)
    assert buckets.wait("q", 0.3) == pytest.approx(0.2)
    assert buckets.allowance("q", 0.5) == 1
    assert buckets.allowance("q", 60.0) == 1  # an idle hour does not save up a burst
    assert buckets.allowance("fast", 0.0) == 10
    buckets.take("fast", 10, 0.0)
    assert buckets.allowance("fast", 0.05) == 5
    # The leader waits for a burst's worth (10 at 100/s), not for each token...
    assert buckets.wait("fast", 0.05, want=500) == pytest.approx(0.05)
    assert buckets.wait("fast", 0.05, want=3) == 0.0  # ...or for as many as wait


def test_a_bucket_is_taken_up_where_it_was_left_and_given_back_when_refused():
    limits = {"q": parse_rate("2/s", "X"), "fast": parse_rate("100/s", "X")}
    old = Buckets(limits, 0.0)
    old.take("q", 1, 0.0)
    state = old.state("q", 0.0)
    assert state == {"tokens": 0.0, "rate": "2/s"}
    new = Buckets(limits, 100.0)  # another leader's monotonic clock
    assert new.allowance("q", 100.0) == 1  # a bucket not taken up starts full
    assert new.restore("q", state["tokens"], 0.25, 100.0)
    assert new.allowance("q", 100.0) == 0  # a quarter of a second: half a token
    assert new.wait("q", 100.0) == pytest.approx(0.25)
    assert new.restore("q", 0.0, -30.0, 100.0)  # a clock behind refills nothing
    assert new.allowance("q", 100.0) == 0
    assert new.restore("q", 0.0, 3600.0, 100.0)  # nor more than a burst
    assert new.allowance("q", 100.0) == 1
    for tokens, elapsed in (("x", 1.0), (None, 1.0), (0.0, float("nan")), (float("inf"), 0)):
        assert not new.restore("q", tokens, elapsed, 100.0)
    assert not new.restore("unlimited", 0.0, 0.0, 100.0)
    new.take("fast", 10, 100.0)
    new.give_back("fast", 4, 100.0)
    assert new.allowance("fast", 100.0) == 4
    new.give_back("fast", 40, 100.0)
    assert new.allowance("fast", 100.0) == 10  # capped at the burst


def test_plan_hands_out_a_limited_queue_s_jobs_at_its_rate():
    leader = bare_leader({"paced": parse_rate("1/s", "X")}, now=100.0)
    leader.pending = {"paced": jobs(3), "default": jobs(2, start=10)}
    leader.workers = {"w1": WorkerView("w1", concurrency=8)}
    moves = leader.plan(now=100.0)
    assert [q for q, _, _ in moves].count("paced") == 1
    assert [q for q, _, _ in moves].count("default") == 2  # other queues are not held back
    assert leader._until_token(100.0) == pytest.approx(1.0)
    assert leader.plan(now=100.5) == [] and leader._until_token(100.5) == pytest.approx(0.5)
    assert [q for q, _, _ in leader.plan(now=101.0)] == ["paced"]
    leader.pending["paced"] = []
    assert leader.plan(now=101.2) == []
    assert leader._until_token(101.2) == float("inf")  # nothing waits: no wake-up


def test_the_leader_wakes_for_a_burst_of_a_fast_queue_not_for_each_job():
    leader = bare_leader({"fast": parse_rate("1000/s", "X")})
    leader.pending = {"fast": jobs(500)}
    leader.workers = {"w1": WorkerView("w1", concurrency=200)}
    assert len(leader.plan(now=0.0)) == 100  # a burst: a tenth of a second's worth
    assert leader._until_token(0.0) == pytest.approx(0.1)


def test_plan_gives_a_limited_job_an_idle_runner_not_a_prefetch_slot():
    """Prefetched behind a long job, limited jobs would start together later."""
    leader = bare_leader({"paced": parse_rate("10/s", "X")})
    busy = WorkerView("busy", concurrency=1, prefetch=4, assigned={"long"})
    idle = WorkerView("idle", concurrency=1, prefetch=0)
    leader.pending = {"paced": jobs(2)}
    leader.workers = {"busy": busy, "idle": idle}
    assert leader.plan(now=0.0) == [("paced", jobs(2)[0], "idle")]


def test_plan_keeps_a_worker_free_for_a_limited_job_that_waits_for_a_runner():
    """A backlog of another queue, newer than the limited job, would otherwise keep the
    worker's runners full for good."""
    leader = bare_leader({"paced": parse_rate("1/s", "X")})
    shared = WorkerView("shared", concurrency=2, prefetch=2, assigned={"a", "b"})
    other = WorkerView("other", frozenset({"default"}), concurrency=2)
    leader.pending = {"paced": jobs(1), "default": jobs(5, start=10)}
    leader.workers = {"shared": shared, "other": other}
    moves = leader.plan(now=0.0)
    assert {w for _, _, w in moves} == {"other"}  # shared is held, other is filled
    assert len(moves) == 2 and leader.pending["paced"] == jobs(1)
    shared.assigned = {"a"}  # one of its runners is done
    moves = leader.plan(now=0.0)
    assert moves[0] == ("paced", jobs(1)[0], "shared")


def test_plan_does_not_hold_workers_for_a_limited_job_without_a_token():
    leader = bare_leader({"paced": parse_rate("1/h", "X")})
    leader.buckets.take("paced", 1, 0.0)
    shared = WorkerView("shared", concurrency=1, prefetch=4, assigned={"a"})
    leader.pending = {"paced": jobs(1), "default": jobs(3, start=10)}
    leader.workers = {"shared": shared}
    moves = leader.plan(now=1.0)
    assert [q for q, _, _ in moves] == ["default"] * 3
    assert leader._until_token(1.0) == pytest.approx(3599.0)


class _Conf:
    def __init__(self, limits: dict[str, str]):
        self.rate_limits = {q: parse_rate(t, "X") for q, t in limits.items()}


def _said(limits, node="n-0000000003") -> tuple[bytes, None]:
    import json

    return json.dumps({"limits": limits, "node": node, "at": "2026-11-25T00:00:00"}).encode(), None


@pytest.mark.parametrize("item", [
    None, (b"", None), (b"not json", None), (b"[1]", None),
    (b'{"limits": 5, "node": "n-0000000003"}', None),
    _said({"paced": "5/s"}, node="n-0000000002"),  # a leader before this one
])
def test_limits_not_said_by_this_leader_are_unknown(item):
    from zktasks.dashboard import kept_rate_limits

    assert kept_rate_limits(item, "n-0000000003") is None


def test_the_leader_s_limits_are_shown_and_this_process_s_beside_where_they_differ():
    from zktasks.dashboard import kept_rate_limits, with_rate_limits

    kept = kept_rate_limits(_said({"paced": "5/s", "old": "1/h"}), "n-0000000003")
    assert kept == {"paced": "5/s", "old": "1/h"}
    data = {"leader": {"node": "n-0000000003", "rate_limits": kept},
            "queues": [{"name": "default", "pending": 3}]}
    rows = {q["name"]: q for q in with_rate_limits(
        data, _Conf({"paced": "10/s", "new": "2/m"}))["queues"]}
    assert set(rows) == {"default", "paced", "old", "new"}
    assert rows["default"]["pending"] == 3 and rows["default"]["rate_limit"] is None
    assert "rate_limit_differs" not in rows["default"]
    assert (rows["paced"]["rate_limit"], rows["paced"]["rate_limit_here"]) == ("5/s", "10/s")
    assert (rows["old"]["rate_limit"], rows["old"]["rate_limit_here"]) == ("1/h", None)
    assert (rows["new"]["rate_limit"], rows["new"]["rate_limit_here"]) == (None, "2/m")
    assert all(r["rate_limit_source"] == "leader" for r in rows.values())

    # No leader, or one that has not said yet: this process's settings, as before.
    for leader in (None, {"node": "n-0000000004", "rate_limits": None}):
        rows = {q["name"]: q for q in with_rate_limits(
            {"leader": leader, "queues": []}, _Conf({"paced": "10/s"}))["queues"]}
        assert rows["paced"]["rate_limit"] == "10/s"
        assert rows["paced"]["rate_limit_source"] == "settings"
        assert "rate_limit_differs" not in rows["paced"]
