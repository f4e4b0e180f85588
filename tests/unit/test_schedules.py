"""Cron parsing and tick arithmetic (pure)."""

from datetime import UTC, datetime

import pytest

from zktasks.exceptions import ConfigurationError
from zktasks.schedules import Cron, parse_schedules


def at(*args):
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize("expression,after,expected", [
    ("*/15 * * * *", at(2026, 1, 1, 10, 7), at(2026, 1, 1, 10, 15)),
    ("0 3 * * *", at(2026, 1, 1, 10, 7), at(2026, 1, 2, 3, 0)),
    ("30 9 * * 1-5", at(2026, 11, 21, 10, 0), at(2026, 11, 23, 9, 30)),  # Sat -> Mon
    ("0 0 1 * *", at(2026, 2, 15), at(2026, 3, 1)),
    ("0 12 * * 0", at(2026, 11, 22, 12, 0), at(2026, 11, 29, 12, 0)),  # Sunday, strictly after
    ("0 12 * * 7", at(2026, 11, 22, 11, 0), at(2026, 11, 22, 12, 0)),  # 7 is Sunday too
])
def test_cron_next_after(expression, after, expected):
    assert Cron.parse(expression).next_after(after) == expected


def test_cron_reads_steps_and_stars_as_cron_does():
    # "5/15": from 5, every 15 (cronie, croniter); it meant minute 5 alone.
    assert Cron.parse("5/15 * * * *").minutes == {5, 20, 35, 50}
    # A day field starting with "*" counts as unrestricted: "*/2" with Monday means
    # Mondays that are odd days (vixie cron, cronie), not odd days or Mondays.
    cron = Cron.parse("0 0 */2 * 1")
    runs = [cron.next_after(at(2026, 11, 1))]
    while len(runs) < 3:
        runs.append(cron.next_after(runs[-1]))
    assert runs == [at(2026, 11, 9), at(2026, 11, 23), at(2026, 12, 7)]
    assert all(r.weekday() == 0 and r.day % 2 == 1 for r in runs)


def test_rare_crons_skip_what_cannot_match():
    """Computed by skipping months, days and hours, not minute by minute (the leader
    spent one to two seconds per tick on this one), with the same answers."""
    [schedule] = parse_schedules("default", {"x": {"task": "m.f", "cron": "0 0 29 2 *"}})
    assert schedule.latest_tick(at(2028, 2, 28)) == at(2024, 2, 29)
    assert schedule.next_tick(at(2026, 11, 25)) == at(2028, 2, 29)
    assert schedule.latest_tick(at(2028, 2, 29)) == at(2028, 2, 29)
    # Feb 29 on a Sunday, Wednesday or Saturday: years apart, past the five years
    # searched before (it raised "never matches", and its one tick was swallowed).
    [rare] = parse_schedules("default", {"x": {"task": "m.f", "cron": "0 0 29 2 */3"}})
    assert rare.next_tick(at(2026, 11, 25)) == at(2032, 2, 29)
    assert rare.latest_tick(at(2026, 11, 25)) == at(2020, 2, 29)
    assert Cron.parse("0 12 31 12 */7").next_after(at(2035, 1, 1)) == at(2045, 12, 31, 12)


@pytest.mark.parametrize("cron,match", [
    ("0 0 * * MON", "names .* are not supported; use numbers"),
    ("0 0 1 JAN *", "names"),
    ("0 0 * * 1x", "not a number"),
    (5, "not a string"),
    (["0", "3", "*", "*", "*"], "not a string"),
])
def test_cron_errors_say_what_to_write(cron, match):
    """A cron that is not a string raised AttributeError out of manage.py check."""
    with pytest.raises(ConfigurationError, match=match):
        parse_schedules("default", {"x": {"task": "m.f", "cron": cron}})


@pytest.mark.parametrize("bad", ["* * * *", "61 * * * *", "*/0 * * * *", "a b c d e"])
def test_cron_rejects_bad_expressions(bad):
    with pytest.raises((ValueError, TypeError)):
        Cron.parse(bad)


def test_every_ticks_and_deterministic_ids():
    [schedule] = parse_schedules("default", {"beat": {"task": "m.f", "every": 10}})
    now = at(2026, 1, 1, 0, 0, 25)
    assert schedule.latest_tick(now) == at(2026, 1, 1, 0, 0, 20)
    assert schedule.next_tick(now) == at(2026, 1, 1, 0, 0, 30)
    tick = schedule.latest_tick(now)
    assert schedule.job_id(tick) == schedule.job_id(tick) and len(schedule.job_id(tick)) == 32
    assert schedule.job_id(tick) != schedule.job_id(schedule.next_tick(now))


@pytest.mark.parametrize("raw,match", [
    ({"x": {"task": "m.f"}}, "exactly one of"),
    ({"x": {"task": "m.f", "every": 1, "cron": "* * * * *"}}, "exactly one of"),
    ({"x": {"task": "m.f", "every": 0}}, "every"),
    ({"x": {"task": "m.f", "cron": "bad"}}, "cron"),
    ({"x": {"every": 5}}, "task"),
    ({"bad/name": {"task": "m.f", "every": 5}}, "names"),
    ({"x": {"task": "m.f", "every": 5, "typo": 1}}, "unknown keys"),
    # Accepted before, and each one then ended every leader's term at its first pass
    # (no job was assigned while it was configured), or ran the task with wrong
    # arguments at every tick.
    ({"x": {"task": "m.f", "cron": "0 0 30 2 *"}}, "never matches"),
    ({"x": {"task": "m.f", "cron": "0 0 31 4,6,9,11 *"}}, "never matches"),
    ({"x": {"task": "m.f", "every": float("nan")}}, "every"),
    ({"x": {"task": "m.f", "every": float("inf")}}, "every"),
    ({"x": {"task": "m.f", "every": 1e20}}, "every"),
    ({"..": {"task": "m.f", "every": 5}}, "names"),
    ({".": {"task": "m.f", "every": 5}}, "names"),
    ({"x": {"task": "m.f", "every": 5, "args": 5}}, "'args'"),
    ({"x": {"task": "m.f", "every": 5, "args": {"days": 7}}}, "'args'"),
    ({"x": {"task": "m.f", "every": 5, "args": "reports"}}, "'args'"),
    ({"x": {"task": "m.f", "every": 5, "kwargs": "ab"}}, "'kwargs'"),
    ({"x": {"task": "m.f", "every": 5, "kwargs": {1: 2}}}, "'kwargs'"),
])
def test_schedule_settings_errors_are_clear(raw, match):
    with pytest.raises(ConfigurationError, match=match):
        parse_schedules("default", raw)


@pytest.mark.parametrize("cron", ["0 0 29 2 *", "0 0 30 2 1", "0 0 31 * *", "0 0 30 2,3 *"])
def test_cron_days_that_some_month_has_are_valid(cron):
    """Feb 29 comes every fourth year; day and weekday both given match either; a day
    some listed month has is enough."""
    [schedule] = parse_schedules("default", {"x": {"task": "m.f", "cron": cron}})
    now = datetime(2026, 11, 24, tzinfo=UTC)
    assert schedule.latest_tick(now) < now < schedule.next_tick(now)


def test_a_schedule_without_state_is_late_only_once_a_leader_had_time_for_it():
    from datetime import UTC, datetime, timedelta

    from zktasks.dashboard import SCHEDULE_GRACE, _not_taken_up

    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    assert "no worker leads" in _not_taken_up(False, now)
    assert _not_taken_up(None, now) == ""  # an election under way
    assert _not_taken_up(now - SCHEDULE_GRACE + timedelta(seconds=1), now) == ""
    late = _not_taken_up(now - SCHEDULE_GRACE - timedelta(seconds=1), now)
    assert "no tick recorded since the leader took over at 2026-11-25 11:59:44 UTC" in late
