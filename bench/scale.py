"""Scale bench: submit N pending jobs with submit_many, then drain them with 2 workers.

    .venv/bin/python -m bench.scale --jobs 100000
    .venv/bin/python -m bench.scale --jobs 1000000 --heap 6g > /tmp/scale-1m.log 2>&1 &

It starts its own ZooKeeper (a JVM heap big enough for the backlog: every pending job is
a status record of about 1 KB), submits N jobs of `bench.tasks.record` (each run appends
its number to a file, so executions are counted, repeats included) with
`task.submit_many()` in calls of --chunk jobs, then starts `runworker` processes and waits
until every number is in the file and nothing is pending or assigned.

It reports: submit rate; drain rate (jobs over the time from the first execution's start
to the last one's finish, both as zktasks recorded them in the jobs' status records: the
workers' start-up and the harness's polls are not in it); errors (ERROR lines and
tracebacks in the worker logs, jobs that never ran, jobs run twice, FAILED entries in the
finished index); the largest children lists in the tree (the queue's shard list, the
biggest shard, the biggest finished-index bucket: each must stay far below the ~1 MB
response limit, about 25,000 job names); peak RSS (VmHWM) of the worker that leads and of
ZooKeeper. A progress line is printed every --every seconds, so a run stopped early still
says what it measured. Figures go to --out as JSON too.

Exit status: 0 when every job ran exactly once and nothing went wrong; 1 when a job never
ran or ran twice, a worker logged an ERROR or a traceback, a job FAILED, a worker exited
or the drain missed its deadline; 2 when ZooKeeper could not start. Everything it starts
(ZooKeeper, the workers, each in its own process group with a watchdog that kills the
group if the harness is SIGKILLed) is stopped on the way out, also on Ctrl-C, SIGTERM and
SIGHUP; the work dir is kept when the run failed.
"""

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The drain is timed on the status records of the first and the last jobs in the record
# file (file order is execution order): the earliest start among the first ones, the
# latest finish among the last ones.
EDGE_JOBS = 64
STOP_DEADLINE = 60.0    # seconds for a worker to drain and exit after SIGTERM


def hwm_mb(pid: int | None, field: str = "VmHWM") -> float | None:
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    return round(int(match[1]) / 1024, 1) if match else None


class Executions:
    """Numbers appended to the record file so far (read incrementally), with the first
    and the last EDGE_JOBS of them in file order."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.rest = b""
        self.seen: set[int] = set()
        self.total = 0
        self.first: list[int] = []
        self.last: deque[int] = deque(maxlen=EDGE_JOBS)

    def update(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            number = int(line)
            self.seen.add(number)
            self.total += 1
            if len(self.first) < EDGE_JOBS:
                self.first.append(number)
            self.last.append(number)


class Sampler:
    """Reads the tree's sizes and the processes' memory every few seconds."""

    def __init__(self, client, layout, zk_pid, procs):
        self.client = client
        self.layout = layout
        self.zk_pid = zk_pid
        self.procs = procs
        self.max = {"shards_in_queue": 0, "jobs_in_a_shard": 0, "entries_in_a_finished_list": 0,
                    "delayed_minutes": 0, "shards_in_a_delayed_minute": 0,
                    "jobs_in_a_delayed_shard": 0}
        self.pending = 0
        self.delayed = 0
        self.assigned = 0
        self.leader_name: str | None = None
        self.leader_hwm: dict[str, float] = {}
        self.zk_rss_max = 0.0

    def _stats(self, paths):
        calls = [(p, self.client.exists_async(p)) for p in paths]
        out = {}
        for path, call in calls:
            try:
                out[path] = call.get(timeout=30)
            except Exception:
                out[path] = None
        return out

    def sample(self) -> None:
        from zktasks.tree import finished_leaves, parse_shard

        queue = self.layout.queue("default")
        shards = [s for s in self._children(queue) if parse_shard(s)]
        stats = self._stats([f"{queue}/{s}" for s in shards])
        sizes = [st.numChildren for st in stats.values() if st is not None]
        self.pending = sum(sizes)
        self.max["shards_in_queue"] = max(self.max["shards_in_queue"], len(shards))
        self.max["jobs_in_a_shard"] = max([self.max["jobs_in_a_shard"], *sizes])
        # The newest buckets' lists (a bucket's seconds; older entries directly in it):
        # only those still grow.
        leaves = finished_leaves(sorted(self._children(self.layout.finished))[-3:],
                                 lambda rels: {r: self._children(
                                     self.layout.finished_bucket(r)) for r in rels})
        self.max["entries_in_a_finished_list"] = max(
            [self.max["entries_in_a_finished_list"],
             *(len(names) for found in leaves.values() for names in found.values())])
        minutes = self._children(self.layout.delayed)
        listed = {m: self._children(self.layout.delayed_minute(m)) for m in minutes}
        stats = self._stats([self.layout.delayed_shard(m, sec)
                             for m, seconds in listed.items() for sec in seconds])
        sizes = [st.numChildren for st in stats.values() if st is not None]
        self.delayed = sum(sizes)
        self.max["delayed_minutes"] = max(self.max["delayed_minutes"], len(minutes))
        self.max["shards_in_a_delayed_minute"] = max(
            [self.max["shards_in_a_delayed_minute"], *map(len, listed.values())])
        self.max["jobs_in_a_delayed_shard"] = max([self.max["jobs_in_a_delayed_shard"],
                                                   *sizes])
        owners = self._children(self.layout.assignments)
        stats = self._stats([self.layout.worker_assignments(o) for o in owners])
        self.assigned = sum(st.numChildren for st in stats.values() if st is not None)
        contenders = sorted(self._children(self.layout.leader), key=lambda n: n[-10:])
        if contenders:
            try:
                raw, _ = self.client.get(f"{self.layout.leader}/{contenders[0]}")
                self.leader_name = raw.decode()
            except Exception:
                pass
        for name, proc in self.procs.items():
            value = hwm_mb(proc.pid)
            if value is not None:
                self.leader_hwm[name] = value
        self.zk_rss_max = max(self.zk_rss_max, hwm_mb(self.zk_pid, "VmRSS") or 0.0)

    def _children(self, path):
        from kazoo.exceptions import NoNodeError

        try:
            return self.client.get_children(path)
        except NoNodeError:
            return []

    def leader_peak(self) -> tuple[str | None, float | None]:
        if not self.leader_name:
            return None, None
        for name, value in self.leader_hwm.items():
            if self.leader_name.startswith(name + "-"):
                return name, value
        return None, None


class Worker:
    """A runworker process in its own process group, with its log and a watchdog that
    kills the group if the harness dies without stopping it (SIGKILL)."""

    def __init__(self, name: str, cmd: list[str], env: dict, log_path: Path):
        from bench.peers.servers import watchdog

        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      process_group=0)
        self.pid = self.popen.pid
        self.watchdog = watchdog(self.pid)

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def terminate(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def stop(self, deadline: float) -> None:
        """Wait for the exit SIGTERM asked for (SIGKILL after `deadline`), then kill what
        is left of the group (task processes) and end the watchdog."""
        from bench.peers.servers import sweep_group

        try:
            self.terminate()
            try:
                self.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{self.name} did not exit after SIGTERM; killing it", flush=True)
                self.popen.kill()
                self.popen.wait(10)
        finally:
            sweep_group(self.pid, self.watchdog)
            self._log.close()


def job_times(backend, ids: list[str], numbers) -> list:
    """The status records (TaskResults) of these jobs that can still be read."""
    from zktasks import JobNotFound

    found = []
    for number in numbers:
        with contextlib.suppress(JobNotFound):
            found.append(backend.get_result(ids[number]))
    return found


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=5_000,
                        help="jobs per submit_many() call (each call writes many multis)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool", choices=["thread", "process"], default="thread")
    parser.add_argument("--heap", default="4g", help="ZooKeeper's JVM heap (-Xmx)")
    parser.add_argument("--result-ttl", type=int, default=600,
                        help="RESULT_TTL: finished records the leader expires as it goes")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between reports")
    parser.add_argument("--due-in", type=float, default=None, metavar="SECONDS",
                        help="submit every job with run_after = now + SECONDS (all due at "
                             "once: they wait in delayed/ shards, then drain)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds the drain may take (default: jobs / 20)")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the data and log dirs")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.chunk < 1 or args.workers < 1:
        parser.error("--jobs, --chunk and --workers must be at least 1")
    # SIGTERM and a hang-up stop the run as Ctrl-C does: through the finally below.
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)

    work = Path(tempfile.mkdtemp(prefix="zktasks-scale-"))
    root = f"/scale-{secrets.token_hex(4)}"
    print(f"work dir {work}; root {root}", flush=True)
    from kazoo.client import KazooClient

    from zktasks.testing import ZooKeeperServer, ZooKeeperStartError, ZooKeeperUnavailable

    record_file = work / "executions.txt"
    figures: dict = {"jobs": args.jobs, "workers": args.workers, "pool": args.pool,
                     "concurrency": args.concurrency, "zk_heap": args.heap,
                     "result_ttl": args.result_ttl}
    problems: list[str] = []
    zk = None
    client = None
    sampler = None
    reporter = None
    procs: dict[str, Worker] = {}
    executions = Executions(record_file)
    stop = threading.Event()
    phase = {"name": "submit", "submitted": 0}
    t0 = time.monotonic()
    code = 1

    def report():
        while not stop.wait(args.every):
            try:
                sampler.sample()
                executions.update()
            except Exception as exc:  # a report must not end the run
                print(f"sample failed: {exc!r}", flush=True)
                continue
            name, hwm = sampler.leader_peak()
            print(f"[{time.monotonic() - t0:7.0f}s] {phase['name']}: submitted "
                  f"{phase['submitted']:,} delayed {sampler.delayed:,} "
                  f"pending {sampler.pending:,} assigned "
                  f"{sampler.assigned:,} ran {len(executions.seen):,} "
                  f"(runs {executions.total:,}) max lists {sampler.max} "
                  f"leader {name} VmHWM {hwm} MB; ZK RSS {hwm_mb(zk.pid, 'VmRSS')} MB",
                  flush=True)

    try:
        zk = ZooKeeperServer(
            data_dir=work / "zookeeper",
            jvm_options=(f"-Xmx{args.heap}", f"-Xms{args.heap}", "-XX:+UseParallelGC"),
            # Snapshots of a tree this big are slow and large: fewer of them, few kept.
            extra_config={"snapCount": "2000000", "autopurge.snapRetainCount": "3",
                          "autopurge.purgeInterval": "1"},
        )
        zk.start(timeout=120)
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.scale_settings",
                   ZKTASKS_BENCH_HOSTS=zk.hosts, ZKTASKS_BENCH_ROOT=root,
                   ZKTASKS_BENCH_RESULT_TTL=str(args.result_ttl))
        os.environ.update(env)
        import django

        django.setup()
        from django.tasks import task_backends

        from bench.tasks import record
        from zktasks.tree import Layout

        backend = task_backends["default"]
        client = KazooClient(hosts=zk.hosts, timeout=30)
        client.start(30)
        sampler = Sampler(client, Layout(root), zk.pid, procs)
        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()

        # -- submit ---------------------------------------------------------------
        started = time.monotonic()
        task = record
        if args.due_in is not None:
            # Every job due at the same instant: the burst case of delayed/'s shards.
            from django.utils import timezone

            due = timezone.now() + timedelta(seconds=args.due_in)
            task = record.using(run_after=due)
            figures["due_at"] = due.isoformat()
        ids: list[str] = []   # job id by number
        for start in range(0, args.jobs, args.chunk):
            count = min(args.chunk, args.jobs - start)
            ids.extend(r.id for r in task.submit_many(
                [((str(record_file), n), {}) for n in range(start, start + count)]))
            phase["submitted"] = start + count
        submit_s = time.monotonic() - started
        figures["submit_seconds"] = round(submit_s, 1)
        figures["submit_per_s"] = round(args.jobs / submit_s)
        print(f"submitted {args.jobs:,} in {submit_s:.1f}s = "
              f"{figures['submit_per_s']:,} jobs/s", flush=True)
        sampler.sample()
        figures["zk_rss_mb_after_submit"] = hwm_mb(zk.pid, "VmRSS")

        # -- drain ----------------------------------------------------------------
        phase["name"] = "drain"
        started = time.monotonic()
        for i in range(args.workers):
            name = f"scale{i}"
            procs[name] = Worker(
                name, [sys.executable, "-m", "django", "runworker", "--queues", "default",
                       "--concurrency", str(args.concurrency), "--pool", args.pool,
                       "--name", name, "-v", "1"], env, work / f"{name}.log")
        deadline = started + (args.deadline or max(300.0, args.jobs / 20))
        first_runs = None   # status records of the first jobs to run, read while fresh
        while True:
            executions.update()
            if first_runs is None and len(executions.first) >= min(EDGE_JOBS, args.jobs):
                first_runs = job_times(backend, ids, executions.first)
            if len(executions.seen) >= args.jobs:
                sampler.sample()
                if sampler.pending == 0 and sampler.assigned == 0 and sampler.delayed == 0:
                    break
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited with {proc.returncode}; "
                                       f"see {proc.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain not done by the deadline: ran "
                                   f"{len(executions.seen):,} of {args.jobs:,}")
            time.sleep(0.25)
        wall_s = time.monotonic() - started
        last_runs = job_times(backend, ids, executions.last)
        starts = [r.started_at.timestamp() for r in first_runs or [] if r.started_at]
        ends = [r.finished_at.timestamp() for r in last_runs if r.finished_at]
        figures["drain_wall_seconds"] = round(wall_s, 1)   # workers' start-up included
        if starts and ends:
            drain_s = max(ends) - min(starts)
            figures["drain_seconds"] = round(drain_s, 3)
            figures["drain_per_s"] = round(args.jobs / drain_s) if drain_s > 0 else None
            print(f"drained {args.jobs:,} in {drain_s:.1f}s from the first execution to the "
                  f"last = {figures['drain_per_s']:,} jobs/s ({wall_s:.1f}s from starting "
                  "the workers)", flush=True)
        else:
            figures["drain_seconds"] = figures["drain_per_s"] = None
            print(f"drained {args.jobs:,} in {wall_s:.1f}s from starting the workers; the "
                  "first or last jobs' records had expired (RESULT_TTL), so no drain rate",
                  flush=True)
        code = 0
    except (ZooKeeperUnavailable, ZooKeeperStartError) as exc:
        print(f"scale: ZooKeeper did not start: {exc}", file=sys.stderr)
        code = 2
    except RuntimeError as exc:
        problems.append(str(exc))
    except KeyboardInterrupt:
        problems.append("interrupted")
        code = 130
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        stop.set()
        if reporter is not None:
            reporter.join(30)
        if sampler is not None:
            with contextlib.suppress(Exception):
                sampler.sample()
            executions.update()
            name, hwm = sampler.leader_peak()
            figures.update({
                "ran": len(executions.seen), "runs": executions.total,
                "never_ran": args.jobs - len(executions.seen),
                "ran_twice_or_more": executions.total - len(executions.seen),
                "max_children": sampler.max,
                "leader": name, "leader_vmhwm_mb": hwm,
                "workers_vmhwm_mb": dict(sampler.leader_hwm),
                "zk_rss_max_mb": sampler.zk_rss_max, "zk_vmhwm_mb": hwm_mb(zk.pid),
            })
        for proc in procs.values():
            proc.terminate()   # all drain at once
        stop_by = time.monotonic() + STOP_DEADLINE
        for proc in procs.values():
            try:
                proc.stop(stop_by)
            except Exception as exc:
                print(f"stopping {proc.name} failed: {exc!r}", file=sys.stderr)
        errors = 0
        for proc in procs.values():
            text = proc.log_path.read_text(errors="replace")
            errors += len(re.findall(r" ERROR |Traceback", text))
        figures["error_lines_in_worker_logs"] = errors
        if sampler is not None:
            from zktasks.tree import finished_leaves

            with contextlib.suppress(Exception):
                figures["failed_in_index"] = sum(
                    1 for found in finished_leaves(
                        sampler._children(sampler.layout.finished),
                        lambda rels: {r: sampler._children(sampler.layout.finished_bucket(r))
                                      for r in rels}).values()
                    for names in found.values() for e in names if ".F." in e)
        if code != 2:
            print(json.dumps(figures, indent=2), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()
        with contextlib.suppress(Exception):
            from zktasks.client import close_clients

            close_clients()  # the backend's session, before its server goes
        if zk is not None:
            zk.stop()
    if code != 2:
        if figures.get("never_ran"):
            problems.append(f"{figures['never_ran']:,} job(s) never ran")
        if figures.get("ran_twice_or_more"):
            problems.append(f"{figures['ran_twice_or_more']:,} extra run(s): jobs ran twice")
        if figures.get("error_lines_in_worker_logs"):
            problems.append(f"{figures['error_lines_in_worker_logs']} ERROR line(s) or "
                            "traceback(s) in the worker logs")
        if figures.get("failed_in_index"):
            problems.append(f"{figures['failed_in_index']} FAILED job(s) in the finished index")
    if problems:
        print(f"SCALE FAILED: {'; '.join(problems)}. Work dir kept: {work}", file=sys.stderr)
        return code or 1
    if code == 2 or args.keep:
        print(f"work dir kept: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
