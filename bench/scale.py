"""Scale bench: submit N pending jobs with submit_many, then drain them with 2 workers.

    .venv/bin/python -m bench.scale --jobs 100000
    .venv/bin/python -m bench.scale --jobs 1000000 --heap 6g > /tmp/scale-1m.log 2>&1 &

It starts its own ZooKeeper (a JVM heap big enough for the backlog: every pending job is
a status record of about 1 KB), submits N jobs of `bench.tasks.record` (each run appends
its number to a file, so executions are counted, repeats included) with
`task.submit_many()` in calls of --chunk jobs, then starts `runworker` processes and waits
until every number is in the file and nothing is pending or assigned.

It reports: submit rate; drain rate; errors (ERROR lines and tracebacks in the worker
logs, jobs that never ran, jobs run twice, FAILED entries in the finished index); the
largest children lists in the tree (the queue's shard list, the biggest shard, the
biggest finished-index bucket: each must stay far below the ~1 MB response limit, about
25,000 job names); peak RSS (VmHWM) of the worker that leads and of ZooKeeper. A
progress line is printed every --every seconds, so a run stopped early still says what
it measured. Figures go to --out as JSON too.
"""

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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
    """Numbers appended to the record file so far (read incrementally)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.rest = b""
        self.seen: set[int] = set()
        self.total = 0

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
            self.seen.add(int(line))
            self.total += 1


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

    work = Path(tempfile.mkdtemp(prefix="zktasks-scale-"))
    root = f"/scale-{secrets.token_hex(4)}"
    print(f"work dir {work}; root {root}", flush=True)
    from kazoo.client import KazooClient

    from zktasks.testing import ZooKeeperServer

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
    from bench.tasks import record
    from zktasks.tree import Layout

    record_file = work / "executions.txt"
    figures: dict = {"jobs": args.jobs, "workers": args.workers, "pool": args.pool,
                     "concurrency": args.concurrency, "zk_heap": args.heap,
                     "result_ttl": args.result_ttl}
    client = KazooClient(hosts=zk.hosts, timeout=30)
    client.start(30)
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    sampler = Sampler(client, Layout(root), zk.pid, procs)
    executions = Executions(record_file)
    stop = threading.Event()
    phase = {"name": "submit", "submitted": 0}
    t0 = time.monotonic()

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

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        # -- submit ---------------------------------------------------------------
        started = time.monotonic()
        task = record
        if args.due_in is not None:
            # Every job due at the same instant: the burst case of delayed/'s shards.
            from django.utils import timezone

            due = timezone.now() + timedelta(seconds=args.due_in)
            task = record.using(run_after=due)
            figures["due_at"] = due.isoformat()
        for start in range(0, args.jobs, args.chunk):
            count = min(args.chunk, args.jobs - start)
            task.submit_many([((str(record_file), n), {})
                              for n in range(start, start + count)])
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
            log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "django", "runworker", "--queues", "default",
                 "--concurrency", str(args.concurrency), "--pool", args.pool,
                 "--name", name, "-v", "1"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, process_group=0)
        deadline = started + (args.deadline or max(300.0, args.jobs / 20))
        while True:
            executions.update()
            if len(executions.seen) >= args.jobs:
                sampler.sample()
                if sampler.pending == 0 and sampler.assigned == 0 and sampler.delayed == 0:
                    break
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited with {proc.returncode}; "
                                       f"see {work / (name + '.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain not done by the deadline: ran "
                                   f"{len(executions.seen):,} of {args.jobs:,}")
            time.sleep(1.0)
        drain_s = time.monotonic() - started
        figures["drain_seconds"] = round(drain_s, 1)
        figures["drain_per_s"] = round(args.jobs / drain_s)
        print(f"drained {args.jobs:,} in {drain_s:.1f}s = {figures['drain_per_s']:,} "
              "jobs/s", flush=True)
    finally:
        stop.set()
        try:
            sampler.sample()
        except Exception:
            pass
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
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
        errors = 0
        for name in procs:
            text = (work / f"{name}.log").read_text(errors="replace")
            errors += len(re.findall(r" ERROR |Traceback", text))
        figures["error_lines_in_worker_logs"] = errors
        from zktasks.tree import finished_leaves

        figures["failed_in_index"] = sum(
            1 for found in finished_leaves(
                sampler._children(sampler.layout.finished),
                lambda rels: {r: sampler._children(sampler.layout.finished_bucket(r))
                              for r in rels}).values()
            for names in found.values() for e in names if ".F." in e)
        print(json.dumps(figures, indent=2), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
        client.stop()
        client.close()
        from zktasks.client import close_clients

        close_clients()  # the backend's session, before its server goes
        zk.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
