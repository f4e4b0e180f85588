"""Failover timings: how long zktasks takes to recover from a dead leader or worker.

    .venv/bin/python bench/failover.py [--trials N] [--session-timeout S] [--json PATH]
                                       [--keep-logs]

Starts a standalone ZooKeeper on loopback (fsync on, tickTime 200 ms) and, for each trial
of each scenario, 3 fresh `runworker --pool process` processes on a fresh root (started
together; all contend for leadership). Session timeout 4 s unless --session-timeout says
otherwise. Scenarios:

* leader_kill  SIGKILL the leader, submit a job at once (to the queue all serve); measure
  kill -> that job's assignment znode created (its ctime) by the new leader. Also kill ->
  the dead leader's worker znode gone (session expired, seen through a watch) and kill ->
  the new leader's election stamp (the mtime of its election znode).
* worker_kill  5 jobs that sleep 60 s on workers of 3 runners, prefetch 0: a worker
  holding 2 of them (never the leader) is SIGKILLed; measure kill -> each of its jobs
  RUNNING again on another worker (the status record's mtime once it shows attempts + 1
  and a new worker id); the max over its jobs is the figure.
* drain        18 jobs of 1-2 s with recorded side effects (bench.chaos_tasks), 2
  runners and prefetch 2 per worker: a non-leading worker holding running and prefetched
  jobs gets SIGTERM; measure SIGTERM -> exit, and check from the side-effect file that
  every job ran exactly once and succeeded (the prefetched ones on the others), with exit
  code 0.

Times come from one clock: the harness's time.time() at the kill and ZooKeeper's znode
stamps (same host). The harness polls the tree (every 20 ms) to find the znodes; the stamps
make the poll interval irrelevant to the figures. It prints min / median / max per
measure and the median as a multiple of SESSION_TIMEOUT against the target (<= 1.5x).

Exit status: 0 when every trial ran and the drain repeated and lost nothing (a missed
timing target is reported, not failed); 1 when a drain repeated or lost a job, a job
never failed over, or a worker exited on its own (a crash is zktasks' failure, as in
bench/chaos.py); 2 when the harness itself could not run. Everything it starts is
stopped on the way out (also on Ctrl-C or SIGTERM). See bench/README.md, "Failover".
"""

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Sets DJANGO_SETTINGS_MODULE to bench.chaos_settings: the workers' settings, fed by env.
from bench.chaos import HarnessError, Monitor, WorkerProc, log, read_effects  # noqa: E402

TASK_PATH = "bench.chaos_tasks.record_side_effect"
TARGET = 1.5                # the target: recovery within 1.5 x the session timeout
POLL = 0.02                 # seconds between the harness's reads of the tree
REGISTER_DEADLINE = 90.0    # seconds for a worker to boot and register
CONCURRENCY = 2
SCENARIOS = ("leader_kill", "worker_kill", "drain")
LONG_JOB_MS = 60_000        # worker_kill: jobs that outlive the measurement
DRAIN_JOBS = 18
DRAIN_JOB_MS = (1000, 2000)
DRAIN_PREFETCH = 2


class Finding(Exception):
    """The product did not do what the scenario expects (a finding, not a harness fault)."""


# --------------------------------------------------------------------------- one trial


class Trial:
    """A fresh root, a backend bound to it, and the worker processes of one trial."""

    def __init__(self, bench: "Bench", scenario: str, n: int):
        from zktasks.backend import ZooKeeperBackend

        self.bench = bench
        self.scenario = scenario
        self.n = n
        self.tag = f"{scenario.replace('_', '-')}-{n}"
        self.root = f"/failover-{bench.run_id}-{self.tag}"
        self.env = dict(bench.env, ZKTASKS_CHAOS_ROOT=self.root)
        self.monitor = bench.monitor
        self.monitor.root = self.root
        # The harness submits through its own backend on this trial's root (Django's
        # task_backends would keep the first root for the whole process).
        self.backend = ZooKeeperBackend("default", {"QUEUES": [], "OPTIONS": {
            "HOSTS": bench.hosts, "ROOT": self.root,
            "SESSION_TIMEOUT": bench.session_timeout, "CONNECT_TIMEOUT": 60.0}})
        self.effects = bench.run_dir / f"effects-{self.tag}.log"
        self.procs: list[WorkerProc] = []
        self.by_id: dict[str, WorkerProc] = {}

    # -- ZooKeeper reads

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def stat(self, path: str):
        from kazoo.exceptions import NoNodeError

        try:
            return self.monitor.client.exists_async(path).get(timeout=5.0)
        except NoNodeError:
            return None

    def read(self, path: str) -> tuple[dict | None, object]:
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.monitor.client.get_async(path).get(timeout=5.0)
        except NoNodeError:
            return None, None
        return json.loads(data), stat

    def statuses(self, job_ids: list[str]) -> dict[str, dict | None]:
        raw = self.monitor.get_many([self.path("status", j) for j in job_ids])
        return {p.rsplit("/", 1)[1]: (json.loads(v) if v else None) for p, v in raw.items()}

    def leader(self) -> tuple[str | None, str | None, float | None]:
        """(worker id, election znode, stamp time) of the lowest election znode."""
        nodes = self.monitor.children(self.path("leader"), timeout=5.0)
        if not nodes:
            return None, None, None
        first = min(nodes, key=lambda n: n[-10:])
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.monitor.client.get_async(self.path("leader", first)).get(5.0)
        except NoNodeError:
            return None, None, None
        return (data.decode() or None), first, stat.mtime / 1000

    def watch_gone(self, path: str) -> dict:
        """When the harness learns that `path` was deleted (a watch, not a poll)."""
        seen: dict = {}

        def fire(event):
            if event.type == "DELETED":
                seen["at"] = time.time()
        if self.monitor.client.exists(path, watch=fire) is None:
            seen["at"] = None
        return seen

    def wait_for(self, what: str, check, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            for proc in self.procs:
                if proc.state == "running" and proc.popen.poll() is not None:
                    # Nothing asked it to stop: a worker crash, zktasks' failure.
                    proc.state, proc.exit_code = "crashed", proc.popen.returncode
                    raise Finding(f"{proc.name} exited on its own with code "
                                  f"{proc.popen.returncode} while waiting for {what}; log "
                                  f"{proc.log_path}:\n{proc.log_tail(30)}")
            if time.monotonic() > deadline:
                raise Finding(f"{what}: not within {timeout:.0f}s")
            time.sleep(POLL)

    # -- processes

    def start_workers(self, count: int = 3, extra_args: tuple[str, ...] = (),
                      concurrency: int = CONCURRENCY) -> None:
        """Start the workers together (all contend for leadership) and wait until all
        are registered and one leads."""
        for i in range(1, count + 1):
            self.procs.append(WorkerProc(f"fo-{self.tag}-w{i}", self.env, self.bench.log_dir,
                                         concurrency, extra_args=extra_args))
        ids = self.wait_for(f"{count} workers to register", lambda: (
            w if len(w := self.monitor.worker_ids() or []) >= count else None),
            REGISTER_DEADLINE)
        for worker_id in ids:
            proc = next(p for p in self.procs if worker_id.startswith(p.name + "-"))
            self.by_id[worker_id] = proc
        self.wait_for("a leader", lambda: self.leader()[0] in self.by_id, REGISTER_DEADLINE)

    def submit(self, seq: int, min_ms: int, max_ms: int) -> str:
        from django.utils.module_loading import import_string

        task = import_string(TASK_PATH)
        result = self.backend.enqueue(task, (str(self.effects), seq, min_ms, max_ms), {})
        return result.id

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


def leader_kill(trial: Trial) -> dict:
    st = trial.bench.session_timeout
    trial.start_workers()
    warm = trial.submit(-1, 10, 10)
    trial.wait_for("the warm-up job", lambda: (
        (trial.statuses([warm])[warm] or {}).get("state") == "SUCCESSFUL"), 60.0)
    leader_id, fence, _ = trial.leader()
    victim = trial.by_id[leader_id]
    others = [w for w in trial.by_id if w != leader_id]
    gone = trial.watch_gone(trial.path("workers", leader_id))

    killed_at = time.time()
    victim.kill()
    # 1 s of work, so that its assignment znode lives long enough to be seen by a poll.
    job = trial.submit(0, 1000, 1000)
    submitted_at = time.time()

    def assigned():
        for worker_id in others:
            stat = trial.stat(trial.path("assignments", worker_id, job))
            if stat is not None:
                return worker_id, stat.ctime / 1000
        return None
    worker_id, assigned_at = trial.wait_for("the job's assignment by a new leader",
                                            assigned, 10 * st + 30)
    # (The assignment's data names no leader: the election says who it was.)
    new_leader, new_fence, stamped_at = trial.leader()
    if new_leader == leader_id or new_fence == fence:
        raise Finding(f"the dead leader's election znode is still first ({fence})")
    trial.wait_for("the job to succeed", lambda: (
        (trial.statuses([job])[job] or {}).get("state") == "SUCCESSFUL"), 60.0)
    return {
        "victim": leader_id, "new_leader": new_leader, "assigned_to": worker_id,
        "submit_s": submitted_at - killed_at,
        "session_gone_s": gone["at"] - killed_at if gone.get("at") else None,
        "elected_s": stamped_at - killed_at,
        "assigned_s": assigned_at - killed_at,
        "leftover_task_processes": victim.leftovers(),
    }


def worker_kill(trial: Trial) -> dict:
    st = trial.bench.session_timeout
    # 3 runners each, no prefetch: 5 jobs go 2, 2, 1 (the leader hands each to the worker
    # with the most free slots), so a worker that does not lead holds 2, and the others
    # have 4 free slots for them.
    trial.start_workers(extra_args=("--prefetch", "0"), concurrency=3)
    jobs = [trial.submit(seq, LONG_JOB_MS, LONG_JOB_MS) for seq in range(5)]

    def all_running():
        found = trial.statuses(jobs)
        if all((r or {}).get("state") == "RUNNING" for r in found.values()):
            return found
        return None
    found = trial.wait_for("5 long jobs to run", all_running, 60.0)
    leader_id = trial.leader()[0]
    held = Counter(r["worker_ids"][-1] for r in found.values())
    victim_id = max((w for w in trial.by_id if w != leader_id), key=lambda w: held[w])
    mine = {j: r["attempts"] for j, r in found.items() if r["worker_ids"][-1] == victim_id}
    if not mine:
        # 3 runners each and no prefetch: the leader cannot run all 5 itself, unless it
        # assigned past its capacity.
        raise Finding(f"no job runs on a worker that does not lead: {dict(held)}")
    victim = trial.by_id[victim_id]
    gone = trial.watch_gone(trial.path("workers", victim_id))

    killed_at = time.time()
    victim.kill()
    again: dict[str, tuple[str, float]] = {}

    def all_again():
        for job_id, attempts in mine.items():
            if job_id in again:
                continue
            record, stat = trial.read(trial.path("status", job_id))
            if record and record["state"] == "RUNNING" and record["attempts"] == attempts + 1 \
                    and record["worker_ids"][-1] != victim_id:
                again[job_id] = (record["worker_ids"][-1], stat.mtime / 1000)
        return len(again) == len(mine)
    trial.wait_for("the dead worker's jobs to run elsewhere", all_again, 10 * st + 30)
    running = {j: t - killed_at for j, (_, t) in again.items()}
    return {
        "victim": victim_id, "held": len(mine), "held_by_worker": dict(held),
        "ran_again_on": {j: w for j, (w, _) in again.items()},
        "session_gone_s": gone["at"] - killed_at if gone.get("at") else None,
        "running_s": max(running.values()),
        "running_each_s": sorted(running.values()),
        "leftover_task_processes": victim.leftovers(),
    }


def drain(trial: Trial) -> dict:
    trial.start_workers(extra_args=("--prefetch", str(DRAIN_PREFETCH)))
    jobs = [trial.submit(seq, *DRAIN_JOB_MS) for seq in range(DRAIN_JOBS)]
    leader_id = trial.leader()[0]
    candidates = [w for w in trial.by_id if w != leader_id]

    def loaded():
        """A non-leading worker with its runners busy and jobs prefetched behind them."""
        found = trial.statuses(jobs)
        for worker_id in candidates:
            running = {j for j, r in found.items() if r and r["state"] == "RUNNING"
                       and r["worker_ids"][-1] == worker_id}
            assigned = set(trial.monitor.children(trial.path("assignments", worker_id)))
            if len(running) >= CONCURRENCY and len(assigned - running) >= 1:
                return worker_id, running, assigned - running
        return None
    victim_id, running, prefetched = trial.wait_for(
        "a worker with running and prefetched jobs", loaded, 60.0)
    victim = trial.by_id[victim_id]
    signalled_at = time.time()
    victim.popen.send_signal(signal.SIGTERM)
    try:
        victim.popen.wait(60.0)
    except Exception as exc:
        raise Finding("the drained worker did not exit within 60 s") from exc
    exited_at = time.time()
    drain_s = exited_at - signalled_at
    victim.state, victim.exit_code = "stopped", victim.popen.returncode

    def finished():
        found = trial.statuses(jobs)
        return found if all((r or {}).get("state") in ("SUCCESSFUL", "FAILED")
                             for r in found.values()) else None
    try:
        found = trial.wait_for("every job to finish", finished, 120.0)
    except Finding:
        found = trial.statuses(jobs)
    runs, bad = read_effects(trial.effects)
    starts = Counter(r.job_id for r in runs if r.mark == "S")
    effects = Counter(r.job_id for r in runs if r.mark == "E")
    ran_on = {r.job_id: r.worker_id for r in runs if r.mark == "E"}
    repeated = sorted(j for j in jobs if starts[j] > 1 or effects[j] > 1)
    # The drain splits into waiting for the running jobs and the worker's own exit.
    last_effect = max((r.at for r in runs if r.mark == "E" and r.worker_id == victim_id
                       and r.job_id in running), default=None)
    lost = sorted(j for j in jobs if (found[j] or {}).get("state") != "SUCCESSFUL"
                  or effects[j] != 1)
    return {
        "victim": victim_id, "running": len(running), "prefetched": len(prefetched),
        "drain_s": drain_s, "exit_code": victim.exit_code,
        "jobs_done_s": None if last_effect is None else last_effect - signalled_at,
        "exit_after_jobs_s": None if last_effect is None else exited_at - last_effect,
        "jobs": len(jobs), "repeated": len(repeated), "lost": len(lost),
        "repeated_jobs": repeated, "lost_jobs": {j: (found[j] or {}).get("state")
                                                 for j in lost},
        "prefetched_ran_elsewhere": sum(1 for j in prefetched
                                        if ran_on.get(j) not in (None, victim_id)),
        "running_finished_on_victim": sum(1 for j in running if ran_on.get(j) == victim_id),
        "bad_effect_lines": len(bad),
    }


# --------------------------------------------------------------------------- the run


class Bench:
    def __init__(self, args):
        self.args = args
        self.session_timeout = args.session_timeout
        self.run_id = secrets.token_hex(3)
        self.run_dir = Path(tempfile.mkdtemp(prefix="zktasks-failover-"))
        self.log_dir = self.run_dir / "workers"
        self.log_dir.mkdir()
        self.server = None
        self.monitor: Monitor | None = None
        self.hosts = ""
        self.env: dict = {}
        self.trials: dict[str, list[dict]] = {s: [] for s in args.scenarios}
        self.errors: list[str] = []

    def start(self) -> None:
        from zktasks.testing import ZooKeeperServer, free_port

        self.server = ZooKeeperServer(data_dir=self.run_dir / "zookeeper",
                                      client_port=free_port(),
                                      extra_config={"forceSync": "yes"})
        self.server.start(120.0)
        self.hosts = self.server.hosts
        os.environ.update(ZKTASKS_CHAOS_HOSTS=self.hosts,
                          ZKTASKS_CHAOS_SESSION_TIMEOUT=str(self.session_timeout),
                          ZKTASKS_CHAOS_ROOT=f"/failover-{self.run_id}")
        env = dict(os.environ)
        env.update(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None,
                                                                  [env.get("PYTHONPATH")])]),
                   PYTHONUNBUFFERED="1")
        self.env = env
        self.monitor = Monitor(self.hosts, f"/failover-{self.run_id}")

        import django

        django.setup()

    def run(self) -> None:
        kinds = {"leader_kill": leader_kill, "worker_kill": worker_kill, "drain": drain}
        for n in range(1, self.args.trials + 1):
            for scenario in self.args.scenarios:
                trial = Trial(self, scenario, n)
                began = time.time()
                try:
                    row = kinds[scenario](trial)
                except Finding as exc:
                    self.errors.append(f"{scenario} trial {n}: {exc}")
                    log(f"  {scenario:<12} trial {n}: FAILED: {exc}")
                    continue
                finally:
                    trial.close()
                row["trial"] = n
                row["wall_s"] = time.time() - began
                self.trials[scenario].append(row)
                log(f"  {scenario:<12} trial {n}: {brief(scenario, row)}")

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.close()


def brief(scenario: str, row: dict) -> str:
    if scenario == "leader_kill":
        return (f"session gone {fmt(row['session_gone_s'])}s, new leader "
                f"{fmt(row['elected_s'])}s, job assigned {fmt(row['assigned_s'])}s")
    if scenario == "worker_kill":
        return (f"session gone {fmt(row['session_gone_s'])}s, its {row['held']} jobs running "
                f"elsewhere after {', '.join(fmt(v) for v in row['running_each_s'])}s")
    return (f"{row['running']} running + {row['prefetched']} prefetched, drained in "
            f"{fmt(row['drain_s'])}s (its jobs done after {fmt(row['jobs_done_s'])}s), exit "
            f"{row['exit_code']}, {row['repeated']} repeated, {row['lost']} lost of {row['jobs']}")


def fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


MEASURES = (
    # (scenario, key, label, headline: compared with the target)
    ("leader_kill", "session_gone_s", "leader kill -> its session gone (seen)", False),
    ("leader_kill", "elected_s", "leader kill -> new leader elected (stamp)", False),
    ("leader_kill", "assigned_s", "leader kill -> job assigned by new leader", True),
    ("worker_kill", "session_gone_s", "worker kill -> its session gone (seen)", False),
    ("worker_kill", "running_s", "worker kill -> its jobs running elsewhere", True),
    ("drain", "jobs_done_s", "drain: SIGTERM -> its running jobs done", False),
    ("drain", "exit_after_jobs_s", "drain: running jobs done -> worker exited", False),
    ("drain", "drain_s", "drain: SIGTERM -> worker exited", False),
)


def summarize(bench: Bench) -> list[dict]:
    st = bench.session_timeout
    rows = []
    for scenario, key, label, headline in MEASURES:
        values = [t[key] for t in bench.trials.get(scenario, []) if t.get(key) is not None]
        if not values:
            continue
        median = statistics.median(values)
        rows.append({
            "scenario": scenario, "measure": key, "label": label, "n": len(values),
            "min_s": round(min(values), 3), "median_s": round(median, 3),
            "max_s": round(max(values), 3),
            # A drain lasts as long as the jobs it waits for: no ratio to the timeout.
            "median_x": round(median / st, 2) if scenario != "drain" else None,
            "max_x": round(max(values) / st, 2) if scenario != "drain" else None,
            "target": f"<= {TARGET}x" if headline else None,
            "met": (median / st <= TARGET) if headline else None,
        })
    return rows


def report(bench: Bench, rows: list[dict], elapsed: float) -> str:
    st = bench.session_timeout
    header = ["measure", "n", "min s", "median s", "max s", "median/ST", "target"]
    lines = [[r["label"], str(r["n"]), f"{r['min_s']:.2f}", f"{r['median_s']:.2f}",
              f"{r['max_s']:.2f}", "" if r["median_x"] is None else f"{r['median_x']:.2f}x",
              "" if r["target"] is None else f"{r['target']} {'met' if r['met'] else 'NOT met'}"]
             for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=False)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=False)))
    out = [f"failover: SESSION_TIMEOUT (ST) {st:g}s, ZooKeeper tickTime "
           f"{bench.server.tick_time_ms} ms, 3 workers of {CONCURRENCY} runners (3 in "
           f"worker_kill), {bench.args.trials} trial(s), {elapsed:.0f}s", "", line(header),
           line(["-" * w for w in widths])]
    out += [line(cells) for cells in lines]
    drains = bench.trials.get("drain", [])
    if drains:
        out.append("")
        out.append(f"drain: {sum(d['jobs'] for d in drains)} jobs over {len(drains)} trial(s); "
                   f"{sum(d['running'] for d in drains)} running and "
                   f"{sum(d['prefetched'] for d in drains)} prefetched on the drained worker "
                   f"at SIGTERM; repeated {sum(d['repeated'] for d in drains)}, lost "
                   f"{sum(d['lost'] for d in drains)}; prefetched jobs that ran elsewhere "
                   f"{sum(d['prefetched_ran_elsewhere'] for d in drains)}; exit codes "
                   f"{sorted({d['exit_code'] for d in drains})}")
    kills = bench.trials.get("worker_kill", [])
    if kills:
        out.append(f"worker kill: {sum(k['held'] for k in kills)} jobs held by the killed "
                   f"workers over {len(kills)} trial(s), all running again elsewhere")
    left = [t for s in bench.trials.values() for t in s if t.get("leftover_task_processes")]
    if left:
        out.append(f"!! task processes outlived their SIGKILLed worker in {len(left)} trial(s)")
    for error in bench.errors:
        out.append(f"!! {error}")
    return "\n".join(out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Failover timings of zktasks (leader kill, worker kill, drain).")
    parser.add_argument("--trials", type=int, default=5, help="trials per scenario (default 5)")
    parser.add_argument("--session-timeout", type=float, default=4.0,
                        help="zktasks SESSION_TIMEOUT in seconds (default 4)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated subset of {','.join(SCENARIOS)} (default all)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the run directory (worker logs, side effects, ZooKeeper)")
    args = parser.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    if bad := [s for s in args.scenarios if s not in SCENARIOS]:
        parser.error(f"unknown scenarios {bad}; choose among {', '.join(SCENARIOS)}")
    if args.trials < 1 or args.session_timeout < 0.5:
        parser.error("--trials must be positive and --session-timeout at least 0.5")
    return args


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)   # a closed terminal stops it as SIGTERM does
    started = time.time()
    bench = Bench(args)
    log(f"failover: run directory {bench.run_dir}; session timeout {args.session_timeout:g}s; "
        f"{args.trials} trial(s) of {', '.join(args.scenarios)}")
    handler = logging.FileHandler(bench.run_dir / "harness.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    for name in ("kazoo", "zktasks"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    from zktasks.testing import ZooKeeperStartError, ZooKeeperUnavailable

    ok = False
    try:
        bench.start()
        log(f"ZooKeeper serving at {bench.hosts} ({time.time() - started:.1f}s)")
        bench.run()
        rows = summarize(bench)
        elapsed = time.time() - started
        log("")
        log(report(bench, rows, elapsed))
        drains = bench.trials.get("drain", [])
        failures = list(bench.errors)
        failures += [f"drain trial {d['trial']}: {d['repeated']} repeated, {d['lost']} lost, "
                     f"exit code {d['exit_code']}" for d in drains
                     if d["repeated"] or d["lost"] or d["exit_code"] != 0]
        if args.json:
            Path(args.json).write_text(json.dumps({
                "session_timeout_s": args.session_timeout, "target_x": TARGET,
                "tick_time_ms": bench.server.tick_time_ms, "trials": args.trials,
                "summary": rows, "runs": bench.trials, "failures": failures,
                "elapsed_s": round(elapsed, 1), "run_dir": str(bench.run_dir),
                "load_average": os.getloadavg(),
            }, indent=2, default=str) + "\n")
            log(f"\nwrote {args.json}")
        if failures:
            log(f"\nFAILOVER FINDINGS: {'; '.join(failures)}. Logs kept in {bench.run_dir}")
            return 1
        ok = True
        return 0
    except (ZooKeeperUnavailable, ZooKeeperStartError, HarnessError) as exc:
        print(f"failover harness could not run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("failover: interrupted; stopping everything it started", file=sys.stderr)
        return 130
    finally:
        # A second Ctrl-C must not cut the cleanup short (the watchdogs would still kill
        # the processes, but the run directory would be left behind unreported).
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        bench.close()
        if ok and not args.keep_logs:
            shutil.rmtree(bench.run_dir, ignore_errors=True)
        else:
            print(f"run directory kept: {bench.run_dir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
