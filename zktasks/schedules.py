"""Periodic schedules: parse them from settings and compute their ticks. Pure: no I/O.

A schedule runs a task every N seconds or on a cron expression (5 fields, UTC). The
leader (leader.py) turns each due tick into one job whose id is derived from the
schedule's name and the tick's time, so two leaders (an old one paused, a new one) can
never both run the same tick: the second create of that id fails with NodeExists.

Missed ticks (no leader for a while) are coalesced: one job for the latest missed tick,
then the schedule goes on from now, the way cron daemons and Celery beat's default do.
"""

import hashlib
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from .exceptions import ConfigurationError

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 7))
# A znode name: no leading dot ('.' and '..' are not names ZooKeeper takes).
NAME_RE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}\Z")
EVERY_MAX = 10 * 366 * 86400  # seconds: a tick computed past it overflows datetime soon
# The most days each month has (February's 29th comes every fourth year).
_MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31,
               11: 30, 12: 31}


def _number(text: str, name: str) -> int:
    if text.isascii() and text.isdigit():
        return int(text)
    if text.isalpha():
        raise ValueError(f"{text!r} in the {name} field: names (MON, JAN) are not "
                         "supported; use numbers (days of the week 0-7, Sunday 0 or 7; "
                         "months 1-12)")
    raise ValueError(f"{text!r} in the {name} field is not a number")


def _parse_field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        step = None
        if "/" in part:
            part, _, step_text = part.partition("/")
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) < 1:
                raise ValueError(f"bad step {step_text!r} in the {name} field")
            step = int(step_text)
        if part == "*":
            start, stop = low, high
        elif "-" in part:
            a, _, b = part.partition("-")
            start, stop = _number(a, name), _number(b, name)
        else:
            start = stop = _number(part, name)
            if step is not None:
                # "5/15": from 5 to the end, every 15 (cronie and croniter read it so;
                # it meant 5 alone here before).
                stop = high
        if not (low <= start <= high and low <= stop <= high and start <= stop):
            raise ValueError(f"{part!r} is outside {low}-{high} in the {name} field")
        values.update(range(start, stop + 1, step or 1))
    if name == "day of week" and 7 in values:  # cron allows 7 for Sunday, like 0
        values = (values - {7}) | {0}
    return frozenset(values)


# Days of the Gregorian calendar's whole cycle (400 years): every (day, month, weekday)
# that ever comes comes within one. Five years were searched before, and "0 0 29 2 */3"
# (a Feb 29 that is a Sunday, Wednesday or Saturday) comes up to 12 years apart, and a
# Feb 29 that is a Sunday, 28 to 40.
_CYCLE = timedelta(days=146_097)


def _within_cycle(moment: datetime, direction: int) -> datetime:
    """The far end of a search from `moment`: a cycle away, or the end of time."""
    try:
        return moment + direction * _CYCLE
    except OverflowError:
        end = datetime.max if direction > 0 else datetime.min
        return end.replace(tzinfo=moment.tzinfo)


@dataclass(frozen=True, slots=True)
class Cron:
    """A 5-field cron expression in UTC: minute hour day-of-month month day-of-week."""

    expression: str
    minutes: frozenset[int] = field(compare=False, default=frozenset())
    hours: frozenset[int] = field(compare=False, default=frozenset())
    days: frozenset[int] = field(compare=False, default=frozenset())
    months: frozenset[int] = field(compare=False, default=frozenset())
    weekdays: frozenset[int] = field(compare=False, default=frozenset())
    any_day: bool = field(compare=False, default=True)
    any_weekday: bool = field(compare=False, default=True)

    @classmethod
    def parse(cls, expression: str) -> "Cron":
        if not isinstance(expression, str):
            raise TypeError(f"{expression!r} is not a string; give one such as "
                            "'0 3 * * *'")
        parts = expression.split()
        if len(parts) != 5:
            raise ValueError(f"{expression!r} has {len(parts)} fields; cron needs 5")
        sets = [_parse_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
        days, months = sets[2], sets[3]
        if parts[4].startswith("*") and not any(day <= _MONTH_DAYS[month]
                                       for month in months for day in days):
            # Checked here: the leader found it out by stepping through five years of
            # minutes, at every tick, before giving up on it.
            raise ValueError(f"{expression!r} never matches: none of its months has any "
                             "of its days")
        # A field that starts with "*" ("*/2" too) counts as unrestricted for the
        # day-of-month / day-of-week rule, as in vixie cron and cronie.
        return cls(expression, *sets, any_day=parts[2].startswith("*"),
                   any_weekday=parts[4].startswith("*"))

    def _day_ok(self, when: datetime) -> bool:
        weekday = (when.weekday() + 1) % 7  # cron: 0 is Sunday
        if self.any_day or self.any_weekday:
            return when.day in self.days and weekday in self.weekdays
        # both restricted: cron runs when either matches
        return when.day in self.days or weekday in self.weekdays

    def matches(self, when: datetime) -> bool:
        return (when.minute in self.minutes and when.hour in self.hours
                and when.month in self.months and self._day_ok(when))

    def next_after(self, when: datetime) -> datetime:
        """The first matching minute strictly after `when`.

        A month, day or hour that cannot match is skipped whole: walking minutes, a
        rare expression ("0 0 29 2 *") took the leader one or two seconds per tick.
        """
        moment = when.replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = _within_cycle(moment, +1)
        while moment <= limit:
            if moment.month not in self.months:
                first = moment.replace(day=1, hour=0, minute=0)
                moment = (first + timedelta(days=32)).replace(day=1)
            elif not self._day_ok(moment):
                moment = moment.replace(hour=0, minute=0) + timedelta(days=1)
            elif moment.hour not in self.hours:
                moment = moment.replace(minute=0) + timedelta(hours=1)
            elif moment.minute not in self.minutes:
                moment += timedelta(minutes=1)
            else:
                return moment
        raise ValueError(f"{self.expression!r} never matches")

    def latest_at_or_before(self, when: datetime) -> datetime:
        """The last matching minute at or before `when` (skipping as next_after does)."""
        moment = when.replace(second=0, microsecond=0)
        limit = _within_cycle(moment, -1)
        while moment >= limit:
            if moment.month not in self.months:
                moment = moment.replace(day=1, hour=0, minute=0) - timedelta(minutes=1)
            elif not self._day_ok(moment):
                moment = moment.replace(hour=0, minute=0) - timedelta(minutes=1)
            elif moment.hour not in self.hours:
                moment = moment.replace(minute=0) - timedelta(minutes=1)
            elif moment.minute not in self.minutes:
                moment -= timedelta(minutes=1)
            else:
                return moment
        raise ValueError(f"{self.expression!r} never matches")


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    name: str
    task: str                     # dotted path of a task (or plain function)
    every: float | None = None    # seconds
    cron: Cron | None = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def when(self) -> str:
        """How often, for people: "every 60 s" or "cron 0 3 * * * (UTC)"."""
        if self.cron is not None:
            return f"cron {self.cron.expression} (UTC)"
        return f"every {self.every:g} s"

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after `after`."""
        if self.cron is not None:
            return self.cron.next_after(after)
        period = self.every
        epoch = after.timestamp()
        return datetime.fromtimestamp((epoch // period + 1) * period, UTC)

    def latest_tick(self, now: datetime) -> datetime:
        """The latest tick at or before `now`."""
        if self.cron is not None:
            return self.cron.latest_at_or_before(now)
        return datetime.fromtimestamp((now.timestamp() // self.every) * self.every, UTC)

    def job_id(self, tick: datetime) -> str:
        """The id of this tick's job: the same in every process, for every leader."""
        return tick_job_id(self.name, tick)


def tick_job_id(name: str, tick: datetime) -> str:
    """The id of schedule `name`'s job for `tick` (also for a schedule no longer in the
    settings, whose state the tree still holds)."""
    tick_ms = int(tick.timestamp() * 1000)
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{tick_ms:012x}ffff{digest}"


def parse_schedules(alias: str, raw) -> tuple[Schedule, ...]:
    """Read OPTIONS['SCHEDULES']: {name: {"task": path, "every": s | "cron": expr, ...}}."""
    where = f"TASKS[{alias!r}]['OPTIONS']['SCHEDULES']"
    if raw in (None, {}):
        return ()
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where} must be a dict of name -> schedule.")
    schedules = []
    for name, spec in raw.items():
        here = f"{where}[{name!r}]"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigurationError(f"{here}: use letters, digits, '_', '-', '.' in names.")
        if not isinstance(spec, dict) or not isinstance(spec.get("task"), str):
            raise ConfigurationError(f"{here} needs 'task': the dotted path of a task.")
        unknown = sorted(set(spec) - {"task", "every", "cron", "args", "kwargs"})
        if unknown:
            raise ConfigurationError(f"{here} has unknown keys {unknown!r}.")
        every, cron = spec.get("every"), spec.get("cron")
        if (every is None) == (cron is None):
            raise ConfigurationError(f"{here} needs exactly one of 'every' and 'cron'.")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)
                                  or not math.isfinite(every)
                                  or not 1 <= every <= EVERY_MAX):
            raise ConfigurationError(f"{here}['every'] is {every!r}; give seconds (>= 1, "
                                     f"at most {EVERY_MAX:,}: ten years).")
        try:
            parsed = Cron.parse(cron) if cron is not None else None
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"{here}['cron'] is invalid: {exc}.") from exc
        args, kwargs = spec.get("args", ()), spec.get("kwargs", {})
        if not isinstance(args, list | tuple):
            # A dict gave its keys and a string its letters as arguments, silently.
            raise ConfigurationError(f"{here}['args'] is {args!r}; give a list of "
                                     "positional arguments (keyword ones go in 'kwargs').")
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigurationError(f"{here}['kwargs'] is {kwargs!r}; give a dict of "
                                     "argument names to values.")
        schedules.append(Schedule(
            name=name, task=spec["task"], every=float(every) if every else None, cron=parsed,
            args=tuple(args), kwargs=dict(kwargs),
        ))
    return tuple(schedules)
