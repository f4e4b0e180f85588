"""Rate limits per queue (OPTIONS['RATE_LIMITS']): parse them, and the leader's buckets.

`{"emails": "100/m"}` lets the jobs of queue "emails" start at most 100 times a minute,
across the whole cluster. The leader hands out every job, so it keeps the limit alone:
Celery's `rate_limit` is kept by each worker process for itself, so ten workers run ten
times the rate. Parsing and the token buckets are pure: no I/O, the clock is passed in.

A token bucket, as Celery's `kombu.utils.limits.TokenBucket`, refilled at the rate. Its
capacity (the burst) is one job, or a tenth of a second's worth at rates over 10/s, so
that the leader need not wake more than about ten times a second to hand out a fast
queue's jobs (it waits until a burst's worth is due, see Buckets.wait).

The bucket outlives its leader: every assignment multi that hands out a limited queue's
jobs also writes the bucket as it leaves it to `ratelimits/{queue}` (`state`), in the
same fenced transaction, and a leader starting its term takes it up from there
(`restore`), refilled for the time that passed. Without it every new leader started
full, and a rolling deploy, one leader change per restarted worker, let a burst through
at each. Only a bucket never written (a first term, a queue newly limited) or unreadable
starts full. The time that passed is measured across two machines' clocks: a new
leader's clock ahead of the old one's refills early by the difference, a burst at most.
"""

import math
import re
from dataclasses import dataclass

from .exceptions import ConfigurationError
from .tree import QUEUE_RE

PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
BURST_WINDOW = 0.1  # seconds' worth of jobs the bucket holds at high rates
# ASCII digits only (\d would take "１０/s" too): as Celery writes `rate_limit`.
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*([smh])\s*)?$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    text: str          # as written in settings, for logs and the dashboard: "100/m"
    per_second: float

    @property
    def burst(self) -> int:
        return max(1, math.floor(self.per_second * BURST_WINDOW))


def parse_rate(value, where: str) -> RateLimit:
    """"N/s", "N/m" or "N/h" as Celery writes them; a bare number ("5" or 5) means
    per second, as in Celery."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        count, period = _float(value, where), "s"
        text = f"{count:g}/s"
    else:
        match = _RATE_RE.match(value) if isinstance(value, str) else None
        if match is None:
            raise ConfigurationError(
                f"{where} is {value!r}; give a rate such as '10/s', '100/m' or '500/h'.")
        count, period = _float(match[1], where), match[2] or "s"
        text = f"{match[1]}/{period}"
    if not math.isfinite(count) or count <= 0:
        raise ConfigurationError(
            f"{where} is {value!r}; the rate must be above 0 (to hold a queue's jobs, stop "
            "serving it: runworker --queues).")
    return RateLimit(text=text, per_second=count / PERIODS[period])


def _float(value, where: str) -> float:
    """float(value), refusing what no float holds: 10**400 (OverflowError) or inf."""
    try:
        count = float(value)
    except OverflowError:
        count = math.inf
    if count == math.inf:
        raise ConfigurationError(f"{where} is too large to be a rate.")
    return count


def parse_rate_limits(alias: str, raw, queues) -> dict[str, RateLimit]:
    """Read OPTIONS['RATE_LIMITS']: {queue: rate}. `queues` is the backend's QUEUES."""
    where = f"TASKS[{alias!r}]['OPTIONS']['RATE_LIMITS']"
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where} must be a dict of queue name -> rate, such as "
                                 "{'emails': '100/m'}.")
    limits = {}
    for queue, rate in raw.items():
        if not isinstance(queue, str) or not QUEUE_RE.match(queue):
            raise ConfigurationError(f"{where} has {queue!r}, which is not a queue name.")
        if queues and queue not in queues:
            raise ConfigurationError(
                f"{where} names queue {queue!r}, which is not in QUEUES {list(queues)!r}.")
        limits[queue] = parse_rate(rate, f"{where}[{queue!r}]")
    return limits


class Buckets:
    """The leader's token buckets, one per limited queue; `now` is time.monotonic()."""

    def __init__(self, limits: dict[str, RateLimit], now: float):
        self.limits = limits
        self._tokens = {queue: float(limit.burst) for queue, limit in limits.items()}
        self._at = dict.fromkeys(limits, now)

    def _fill(self, queue: str, now: float) -> float:
        limit = self.limits[queue]
        tokens = min(float(limit.burst),
                     self._tokens[queue] + max(0.0, now - self._at[queue]) * limit.per_second)
        self._tokens[queue], self._at[queue] = tokens, now
        return tokens

    def allowance(self, queue: str, now: float) -> int | None:
        """How many of the queue's jobs may start now; None when it has no limit."""
        if queue not in self.limits:
            return None
        return math.floor(self._fill(queue, now) + 1e-9)

    def take(self, queue: str, count: int, now: float) -> None:
        if queue in self.limits and count:
            self._tokens[queue] = self._fill(queue, now) - count

    def give_back(self, queue: str, count: int, now: float) -> None:
        """Return tokens taken for jobs that were not handed out after all (a refused
        multi assigns none of its batch)."""
        if queue in self.limits and count:
            self._tokens[queue] = min(float(self.limits[queue].burst),
                                      self._fill(queue, now) + count)

    def state(self, queue: str, now: float) -> dict:
        """What `restore` takes up: the tokens left now (JSON-ready; the caller adds the
        wall-clock time, since `now` is monotonic and means nothing to another host)."""
        return {"tokens": round(self._fill(queue, now), 6), "rate": self.limits[queue].text}

    def restore(self, queue: str, tokens, elapsed: float, now: float) -> bool:
        """Take up a bucket left `elapsed` seconds ago with `tokens`; False (and the
        bucket left as it is) when the values are not numbers. A rate changed since
        refills at the new one, capped at the new burst."""
        if queue not in self.limits:
            return False
        try:
            tokens, elapsed = float(tokens), float(elapsed)
        except (TypeError, ValueError, OverflowError):
            return False
        if not (math.isfinite(tokens) and math.isfinite(elapsed)):
            return False
        limit = self.limits[queue]
        refill = max(0.0, elapsed) * limit.per_second  # a clock behind refills nothing
        self._tokens[queue] = min(float(limit.burst), max(0.0, tokens) + refill)
        self._at[queue] = now
        return True

    def wait(self, queue: str, now: float, want: int = 1) -> float:
        """Seconds until the queue may start `want` more jobs (0 if it may now); `want`
        is capped at the burst. The leader waits for as many as it has waiting, up to a
        burst: waking for each token, a 1000/s queue would wake it every millisecond."""
        if queue not in self.limits:
            return 0.0
        want = max(1, min(want, self.limits[queue].burst))
        short = want - self._fill(queue, now)
        return max(0.0, short / self.limits[queue].per_second)
