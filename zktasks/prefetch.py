"""How many jobs a worker asks to hold beyond the ones it runs: its prefetch.

A worker advertises its prefetch in its worker znode; the leader assigns it up to
`concurrency + prefetch` jobs and refills once half the prefetched ones are gone
(leader.WorkerView). A larger prefetch means larger assignment batches: fewer multis,
reads and wake-ups per job under a backlog. Its price is time: a prefetched job waits
on its worker behind the others, and a worker that joins later does not take it over.

So the default follows the jobs (`runworker --prefetch N` fixes it instead):

* 4 per runner, Celery's prefetch multiplier, while jobs are long or not yet measured;
* 16 per runner while recent jobs ran for at most SHORT_ENTER_S on average, until they
  average more than SHORT_LEAVE_S. A prefetched job then waits behind at most about
  16 x 5-10 ms = 0.1 s of work per runner, and the worker needs a quarter of the
  ZooKeeper requests per job. Measured (bench/README, "Prefetch that follows the jobs"):
  draining a backlog of no-op jobs with task processes went from about 900 to 1,200-1,300
  jobs/s, and the pipelined row from about 1,000 to 1,400-1,500.

The two thresholds keep a workload near the boundary from switching back and forth, and
a change is advertised at most once per HOLD_S: each one is a write to the worker znode
and a read by the leader.
"""

BASE_PER_RUNNER = 4
SHORT_PER_RUNNER = 16
SHORT_ENTER_S = 0.005
SHORT_LEAVE_S = 0.010
HOLD_S = 2.0


class Prefetch:
    """The prefetch a worker advertises, and when to change it."""

    def __init__(self, concurrency: int, fixed: int | None = None):
        self.fixed = fixed is not None
        self.base = max(0, int(fixed)) if self.fixed else BASE_PER_RUNNER * concurrency
        self.short = self.base if self.fixed else SHORT_PER_RUNNER * concurrency
        self.current = self.base
        self._changed_at = None  # monotonic time of the last change

    def wanted(self, average_run_s: float | None, now: float) -> int | None:
        """The prefetch to advertise now, or None to keep the current one.

        Cheap enough for every finished job: a few comparisons.
        """
        if self.fixed or average_run_s is None:
            return None
        if self.current == self.base and average_run_s <= SHORT_ENTER_S:
            value = self.short
        elif self.current == self.short and average_run_s > SHORT_LEAVE_S:
            value = self.base
        else:
            return None
        if self._changed_at is not None and now - self._changed_at < HOLD_S:
            return None
        return value

    def advertised(self, value: int, now: float) -> None:
        """The worker znode now says `value`."""
        self.current = value
        self._changed_at = now
