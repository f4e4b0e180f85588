"""Rate-limit bench: does a queue limited to R start its jobs at R, across workers?

    .venv/bin/python -m bench.ratelimit --rate 50/s --jobs 300 --workers 2

It starts its own ZooKeeper, submits --jobs no-op jobs to the queue "limited" (limited to
--rate in OPTIONS['RATE_LIMITS']) with submit_many, so all wait at once, then starts
--workers `runworker` processes (thread pool, --concurrency runners each) that serve it,
and waits for every result. From the jobs' recorded start times it reports:

* the achieved rate: jobs after the first, over the time from the first start to the
  last (the limit allows at most R; a per-worker limit, as Celery's rate_limit, would
  allow R times the workers);
* the most starts in any window of one second, against what the bucket allows (its
  burst plus R);
* how the starts fell to the workers (the limit holds for the sum, not for each).

Nothing is asserted: the figures are for the README and bench/README. Exit status 0
when every job succeeded, 1 otherwise, 2 when ZooKeeper could not start. The workers run
in their own process groups, each with a watchdog that kills the group if the harness is
SIGKILLed; the harness stops them, and its ZooKeeper, also on errors, Ctrl-C, SIGTERM and
SIGHUP, and keeps its work dir only when the run failed.
"""

import argparse
import bisect
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STOP_DEADLINE = 30.0   # seconds for the workers to exit after SIGTERM, then SIGKILL


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def stop_workers(procs: list[tuple[subprocess.Popen, subprocess.Popen | None]]) -> None:
    """SIGTERM every worker, wait (SIGKILL after STOP_DEADLINE), then kill what is left of
    each group and end its watchdog."""
    from bench.peers.servers import sweep_group

    for proc, _ in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + STOP_DEADLINE
    for proc, dog in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"worker {proc.pid} did not exit after SIGTERM; killing it", file=sys.stderr)
            proc.kill()
            proc.wait(10)
        finally:
            sweep_group(proc.pid, dog)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="50/s", help="the queue's limit (default 50/s)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    # SIGTERM and a hang-up stop the run as Ctrl-C does: through the finally below.
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)

    work = Path(tempfile.mkdtemp(prefix="zktasks-ratelimit-"))
    root = f"/ratelimit-{secrets.token_hex(4)}"
    from bench.peers.servers import watchdog
    from zktasks.testing import ZooKeeperServer, ZooKeeperStartError, ZooKeeperUnavailable

    zk = None
    procs: list[tuple[subprocess.Popen, subprocess.Popen | None]] = []
    ok = False
    try:
        zk = ZooKeeperServer(data_dir=work / "zookeeper")
        zk.start(timeout=120)
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.ratelimit_settings",
                   ZKTASKS_BENCH_HOSTS=zk.hosts, ZKTASKS_BENCH_ROOT=root,
                   ZKTASKS_BENCH_RATE=args.rate)
        os.environ.update(env)
        import django

        django.setup()
        from django.tasks import task_backends

        from bench.tasks import noop
        from zktasks.ratelimit import parse_rate

        limit = parse_rate(args.rate, "--rate")
        results = noop.using(queue_name="limited").submit_many([((), {})] * args.jobs)
        for i in range(args.workers):
            with open(work / f"worker{i}.log", "wb") as log:   # the child keeps its copy
                proc = subprocess.Popen(
                    [sys.executable, "-m", "django", "runworker", "--queues", "limited",
                     "--pool", "thread", "--concurrency", str(args.concurrency),
                     "--name", f"rl{i}", "-v", "1"],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, process_group=0)
            procs.append((proc, watchdog(proc.pid)))
        budget = 120 + 2 * args.jobs / limit.per_second
        deadline = time.monotonic() + budget
        done = [r.wait(timeout=max(1.0, deadline - time.monotonic())) for r in results]
        backend = task_backends["default"]
        done = [backend.get_result(r.id) for r in done]
        ok = all(r.status.name == "SUCCESSFUL" for r in done)
    except (ZooKeeperUnavailable, ZooKeeperStartError) as exc:
        print(f"ratelimit: ZooKeeper did not start: {exc}", file=sys.stderr)
        return 2
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        try:
            stop_workers(procs)
        finally:
            with contextlib.suppress(Exception):
                from zktasks.client import close_clients

                close_clients()  # before the server goes, or kazoo logs the dropped connection
            if zk is not None:
                zk.stop()
            if ok:
                shutil.rmtree(work, ignore_errors=True)
            else:
                print(f"ratelimit: work dir kept: {work}", file=sys.stderr)
    starts = sorted(r.started_at.timestamp() for r in done)
    span = starts[-1] - starts[0]
    achieved = (len(starts) - 1) / span if span else float("inf")
    most = max(bisect.bisect_left(starts, s + 1.0) - i for i, s in enumerate(starts))
    by_worker = Counter(r.worker_ids[-1] for r in done)
    print(f"limit {limit.text} ({limit.per_second:g}/s, burst {limit.burst}); {args.jobs} "
          f"no-op jobs, {args.workers} workers x {args.concurrency} threads")
    print(f"achieved {achieved:.2f} jobs/s over {span:.1f} s "
          f"({achieved / limit.per_second:.3f} of the limit)")
    print(f"most starts in any 1 s window: {most} (the bucket allows "
          f"{limit.burst + limit.per_second:g})")
    print("starts per worker: " + ", ".join(f"{w} {n}" for w, n in sorted(by_worker.items())))
    states = Counter(r.status.name for r in done)
    print(f"states: {dict(states)}")
    return 0 if set(states) == {"SUCCESSFUL"} else 1


if __name__ == "__main__":
    sys.exit(main())
