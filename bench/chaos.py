"""Chaos harness: run jobs with recorded side effects while killing things, then check.

    .venv/bin/python bench/chaos.py [--duration S] [--jobs N] [--seed N] [--ensemble 3]
                                    [--pool process|thread] [--json PATH] [--keep]

Starts a ZooKeeper ensemble (3 members by default; --ensemble 1 for a single server) and
3 `runworker --pool process` processes (session timeout 3 s; `--pool thread` runs the
jobs on threads of the worker instead), all on a fresh root. For
--duration seconds it submits --jobs jobs of bench.chaos_tasks.record_side_effect (each
appends an fsync'd line per run to one file) and, at random times drawn from --seed:

* kill_worker   SIGKILL a worker (its task processes die with it), start a replacement;
* kill_leader   SIGKILL the worker that leads zktasks, start a replacement;
* pause_worker  SIGSTOP a worker's process group beyond the session timeout, then SIGCONT
  (it must come back under a new identity and record nothing over newer attempts);
* pause_leader  the same for the leading worker;
* zk_kill       SIGKILL one ZooKeeper member (never more than a minority at once; now and
  then the ensemble's own leader), restart it a few seconds later;
* zk_majority   once per run: SIGKILL 2 of 3 members for a few seconds, restart both.
  It is due mid-window; from then on nothing else is injected until the ensemble is whole
  and it has happened, the window running over its end for that if need be (at most
  MAJORITY_GRACE seconds), so every run on an ensemble has it.

Then it stops injecting, makes sure the ensemble is whole and workers run, waits (with a
deadline) until every submitted job has finished, and checks the history:

* lost: submitted but not SUCCESSFUL (must be 0), with where each one is in the tree;
* executions per job from the side-effect file, and for each job executed more than once
  the cause (the errors in its status record, the worker ids, the fault that hit them);
* a SUCCESSFUL job with no execution line, a result written by an attempt other than the
  last, two runs of one attempt, more runs than attempts: violations;
* leader elections (from the worker logs) and the time to recover after each fault.

It prints the tables and exits 1 when a job is lost, an invariant is broken, a worker
process exited on its own or one of its threads died, or a duplicate has no recorded cause
(0 otherwise, 2 when the harness itself could not run). The seed fixes the choices;
timings still vary with the machine, so two runs with one seed are alike, not identical.
See bench/README.md.
"""

import argparse
import bisect
import contextlib
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# Ours, whatever the caller's environment says (pytest sets tests.settings).
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.chaos_settings"

TASK_PATH = "bench.chaos_tasks.record_side_effect"
REGISTER_DEADLINE = 120.0   # seconds for the first workers to register
SETTLE_DEADLINE = 90.0      # seconds for the ensemble to be whole again after the window
STOP_DEADLINE = 40.0        # seconds for a worker to drain and exit after SIGTERM
SUBMIT_RETRY_PAUSE = 0.5    # seconds between retries of a refused submit
LIMITED_QUEUE = "limited"   # --rate-limit's queue (bench/chaos_settings.py)
POLL = 0.05
MAJORITY_GRACE = 120.0      # seconds the window may run over, waiting for a whole ensemble


class HarnessError(Exception):
    """The harness could not do its part (not a finding about zktasks)."""


def log(message: str) -> None:
    print(message, flush=True)


# --------------------------------------------------------------------------- processes


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(int(entry.name))
    return members




_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (\S+) (.*)$")


def parse_log_time(stamp: str) -> float:
    # logging's asctime: local time, milliseconds after a comma.
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class WorkerProc:
    """One `runworker` process in its own process group, logging to its own file."""

    def __init__(self, name: str, env: dict, log_dir: Path, concurrency: int,
                 extra_args: tuple[str, ...] = (), pool: str = "process"):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        cmd = [sys.executable, "-m", "django", "runworker", "--pool", pool,
               "--concurrency", str(concurrency), "--name", name, "-v", "2",
               "--traceback", *extra_args]
        self.popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT,
                                      process_group=0)
        # If the harness dies without cleaning up (SIGKILL, a CI timeout), its workers
        # would reconnect forever: the watchdog kills the group. It stays outside the
        # group, so SIGSTOP and the leftover check leave it alone.
        from zktasks.testing import start_watchdog

        self.watchdog = start_watchdog(self.popen.pid, in_group=False)
        self.started_at = time.time()
        self.state = "running"   # running | paused | killed | crashed | stopped
        self.ended_at: float | None = None
        self.exit_code: int | None = None
        self._registered = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def usable(self) -> bool:
        """Running and not paused: a candidate for a fault."""
        return self.state == "running" and self.popen.poll() is None

    @property
    def registered(self) -> bool:
        """Whether it has registered once (a fault before that tests little)."""
        if not self._registered:
            with contextlib.suppress(OSError):
                self._registered = b"worker registered worker=" in self.log_path.read_bytes()
        return self._registered

    def kill(self) -> None:
        """SIGKILL the runworker process alone: its task processes must die with it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(30)
        self.state, self.ended_at, self.exit_code = "killed", time.time(), self.popen.returncode

    def pause(self) -> None:
        """SIGSTOP the whole group (worker and task processes), as a frozen VM would."""
        os.killpg(self.pid, signal.SIGSTOP)
        self.state = "paused"

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)
        if self.state == "paused":
            self.state = "running"

    def leftovers(self) -> list[int]:
        """Processes of this worker's group still alive once the worker itself is gone."""
        return [pid for pid in _group_members(self.pid) if pid != self.pid]

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGCONT)
            os.killpg(self.pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (drain), then SIGKILL after STOP_DEADLINE; reap the group."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGCONT)
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
                self.state = "stop-timeout"
            else:
                self.state = "stopped"
            self.ended_at = time.time()
            self.exit_code = self.popen.returncode
        if _group_members(self.pid):
            self.kill_group()

    def close(self) -> None:
        self.kill_group()
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()
        with contextlib.suppress(OSError):
            self.watchdog.stdin.close()   # the group is gone: it kills nothing
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.watchdog.wait(5)

    def log_lines(self) -> list[tuple[float, str, str, str]]:
        """(time, level, logger, message) of each timestamped line of the worker's log."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if m := _LOG_LINE.match(line):
                    out.append((parse_log_time(m[1]), m[2], m[3], m[4]))
        return out

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the log, without kazoo's connection chatter."""
        with contextlib.suppress(OSError):
            kept = [line for line in self.log_path.read_text(errors="replace").splitlines()
                    if not line.startswith(("Connection dropped", "Transition to"))]
            return "\n".join(kept[-lines:])
        return "(no log)"

    def identities(self) -> list[tuple[float, str]]:
        """(registered at, worker id) for each identity this process registered under."""
        found = []
        for t, _, _, message in self.log_lines():
            if m := re.match(r"worker registered worker=(\S+)", message):
                found.append((t, m[1]))
        return found

    def identity_at(self, when: float) -> str | None:
        current = None
        for t, worker_id in self.identities():
            if t <= when + 0.05:
                current = worker_id
        return current


def owner_name(worker_id: str) -> str:
    """The --name prefix of a worker id ("chaos-w3-a1b2c3" -> "chaos-w3")."""
    return worker_id.rsplit("-", 1)[0]


# --------------------------------------------------------------------------- ZooKeeper


class Monitor:
    """The harness's own kazoo session, for reading the tree; every call has a deadline."""

    def __init__(self, hosts: str, root: str):
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        self.root = root
        self.client = KazooClient(
            hosts=hosts, timeout=10.0,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0))
        self.client.start(timeout=60.0)

    def children(self, path: str, timeout: float = 3.0) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return self.client.get_children_async(path).get(timeout=timeout)
        except NoNodeError:
            return []

    def get(self, path: str, timeout: float = 3.0) -> bytes | None:
        from kazoo.exceptions import NoNodeError

        try:
            return self.client.get_async(path).get(timeout=timeout)[0]
        except NoNodeError:
            return None

    def get_many(self, paths: list[str], timeout: float = 30.0) -> dict[str, bytes | None]:
        from kazoo.exceptions import NoNodeError

        out = {}
        for start in range(0, len(paths), 500):
            pending = [(p, self.client.get_async(p)) for p in paths[start:start + 500]]
            for path, async_result in pending:
                try:
                    out[path] = async_result.get(timeout=timeout)[0]
                except NoNodeError:
                    out[path] = None
        return out

    def leader_id(self) -> str | None:
        """The zktasks leader: data of the lowest-sequence election znode."""
        try:
            nodes = self.children(f"{self.root}/leader", timeout=1.0)
            if not nodes:
                return None
            first = min(nodes, key=lambda n: n[-10:])
            data = self.get(f"{self.root}/leader/{first}", timeout=1.0)
            return data.decode() if data else None
        except Exception:
            return None

    def worker_ids(self) -> list[str] | None:
        try:
            return self.children(f"{self.root}/workers", timeout=1.0)
        except Exception:
            return None

    def assigned(self, worker_id: str) -> int | None:
        try:
            return len(self.children(f"{self.root}/assignments/{worker_id}", timeout=1.0))
        except Exception:
            return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop()
            self.client.close()


class Cluster:
    """The ZooKeeper ensemble (or one server) and which members are down."""

    def __init__(self, size: int, base_dir: Path, tls=None):
        from zktasks.testing import ZooKeeperEnsemble, ZooKeeperServer, free_port

        self.size = size
        self.tls = tls
        if size > 1:
            self.ensemble = ZooKeeperEnsemble(size, base_dir=base_dir, tls=tls)
            self.members = list(self.ensemble.servers)
        else:
            self.ensemble = None
            self.members = [ZooKeeperServer(data_dir=base_dir / "server-1",
                                            client_port=free_port(), tls=tls)]
        self.down: set[int] = set()          # member indexes killed, not restarted yet
        self.restarting: dict[int, float] = {}  # index -> restarted at, until it serves

    @property
    def hosts(self) -> str:
        return ",".join(m.hosts for m in self.members)

    @property
    def client_hosts(self) -> str:
        """What zktasks' clients (the workers, the submitter) list: the TLS ports with
        --tls. The monitor reads the plain ones."""
        return ",".join(m.secure_hosts for m in self.members) if self.tls else self.hosts

    def start(self, timeout: float = 120.0) -> None:
        if self.ensemble is not None:
            self.ensemble.start(timeout)
        else:
            self.members[0].start(timeout)

    def spawn(self) -> None:
        """Start every JVM without waiting (workers boot meanwhile)."""
        from zktasks.testing import find_zookeeper

        install = find_zookeeper()
        for member in self.members:
            member._install = install
            member.start(wait=False)

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for member in self.members:
            member.wait_until_serving(max(deadline - time.monotonic(), 0.1))

    @property
    def whole(self) -> bool:
        return not self.down and not self.restarting

    @property
    def quorum(self) -> bool:
        """A majority of members is up (as far as the harness did anything to them)."""
        return len(self.down) + len(self.restarting) <= (self.size - 1) // 2

    def zk_leader_index(self) -> int | None:
        if self.ensemble is None:
            return 0
        for i, member in enumerate(self.members):
            if member.mode(timeout=0.5) == "leader":
                return i
        return None

    def kill(self, index: int) -> None:
        self.members[index].kill()
        self.down.add(index)

    def restart(self, index: int) -> None:
        self.members[index].start(wait=False)
        self.down.discard(index)
        self.restarting[index] = time.time()

    def poll_restarting(self) -> list[tuple[int, float]]:
        """Members that serve again since the last call: (index, seconds it took)."""
        done = []
        for index, since in list(self.restarting.items()):
            if self.members[index].mode(timeout=0.3) is not None:
                del self.restarting[index]
                done.append((index, time.time() - since))
        return done

    def label(self, index: int) -> str:
        return f"zk{index + 1} ({self.members[index].hosts})"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.ensemble is not None:
                self.ensemble.close()
            else:
                self.members[0].close()


# --------------------------------------------------------------------------- submitter


@dataclass
class Submission:
    seq: int
    job_id: str | None = None
    submitted_at: float | None = None
    errors: list = field(default_factory=list)   # (time, exception class, message)
    result: object = None
    call_s: float | None = None   # how long the submit() call that succeeded took
    queue: str = "default"


class Submitter(threading.Thread):
    """Submit --jobs jobs spread over the window, through zktasks' public API.

    A refused submit (ZooKeeperUnavailableError) is retried later with the same unique
    key, so an attempt that landed after all is found again instead of doubled.
    """

    def __init__(self, task, effects: Path, jobs: int, start: float, window: float,
                 run_id: str, deadline: float, task_kwargs: dict | None = None,
                 limited: bool = False):
        super().__init__(name="chaos-submitter", daemon=True)
        self.task = task
        self.task_kwargs = task_kwargs or {}
        self.effects = str(effects)
        self.jobs = jobs
        self.start_at = start
        self.window = window
        self.run_id = run_id
        self.deadline = deadline
        self.stop_event = threading.Event()
        # --rate-limit: every other job goes to the rate-limited queue.
        self.submissions = [Submission(seq, queue=LIMITED_QUEUE if limited and seq % 2
                                       else "default") for seq in range(jobs)]
        self.unexpected: list[str] = []

    def run(self) -> None:
        from zktasks.exceptions import ZooKeeperUnavailableError

        for sub in self.submissions:
            due = self.start_at + sub.seq * self.window / self.jobs
            if self.stop_event.wait(max(0.0, due - time.time())):
                return
            task = self.task.using(unique_key=f"{self.run_id}-{sub.seq}",
                                   queue_name=sub.queue)
            while True:
                began = time.monotonic()
                try:
                    result = task.submit(self.effects, sub.seq, **self.task_kwargs)
                except ZooKeeperUnavailableError as exc:
                    sub.errors.append((time.time(), type(exc).__name__, str(exc)[:200]))
                except Exception as exc:  # the contract promises a zktasks error
                    sub.errors.append((time.time(), type(exc).__name__, str(exc)[:200]))
                    self.unexpected.append(f"seq {sub.seq}: {type(exc).__module__}."
                                           f"{type(exc).__qualname__}: {exc}")
                else:
                    sub.job_id, sub.submitted_at, sub.result = result.id, time.time(), result
                    sub.call_s = time.monotonic() - began
                    break
                if time.time() > self.deadline or self.stop_event.wait(SUBMIT_RETRY_PAUSE):
                    return


# --------------------------------------------------------------------------- faults


@dataclass
class Fault:
    n: int
    kind: str
    at: float                        # wall time of the fault
    target: str                      # process name or ZooKeeper member
    worker_id: str | None = None     # the victim's identity at the time
    pid: int | None = None
    was_leader: bool = False         # the victim led zktasks (by the election znodes)
    held: int | None = None          # jobs assigned to the victim at the time
    ended_at: float | None = None    # SIGCONT / restart time
    served_after: float | None = None  # ZooKeeper: seconds from restart to serving
    detail: str = ""


class Chaos:
    """The fault injector and the bookkeeping of processes and faults."""

    def __init__(self, args, rng: random.Random, cluster: Cluster, env: dict,
                 log_dir: Path, monitor: Monitor):
        self.args = args
        self.rng = rng
        self.cluster = cluster
        self.env = env
        self.log_dir = log_dir
        self.monitor = monitor
        self.procs: list[WorkerProc] = []
        self.faults: list[Fault] = []
        self.actions: list[tuple[float, str, object]] = []   # (due, kind, arg)
        self.anomalies: list[dict] = []
        self.t0 = time.time()
        self._next_index = 0
        self.majority_done = False
        self.majority_skipped = False  # the ensemble never was whole when it was due
        self.stopping_at = float("inf")  # when the harness began stopping workers
        self.todo: list[str] | None = None

    def rel(self, when: float | None) -> str:
        return "-" if when is None else f"{when - self.t0:+.2f}s"

    # -- processes

    def start_worker(self) -> WorkerProc:
        self._next_index += 1
        queues = ("--queues", f"default,{LIMITED_QUEUE}") \
            if getattr(self.args, "rate_limit", None) else ()
        proc = WorkerProc(f"chaos-w{self._next_index}", self.env, self.log_dir,
                          self.args.concurrency, extra_args=queues, pool=self.args.pool)
        self.procs.append(proc)
        return proc

    def proc_named(self, name: str) -> WorkerProc | None:
        return next((p for p in self.procs if p.name == name), None)

    def usable(self) -> list[WorkerProc]:
        return [p for p in self.procs if p.usable]

    def check_processes(self) -> None:
        """A worker that exits on its own is a bug: record it, start a replacement."""
        for proc in self.procs:
            if proc.state in ("running", "paused") and proc.popen.poll() is not None:
                proc.state, proc.ended_at = "crashed", time.time()
                proc.exit_code = proc.popen.returncode
                self.anomalies.append({
                    "kind": "worker exited on its own", "worker": proc.name,
                    "at": self.rel(proc.ended_at), "exit_code": proc.exit_code,
                    "log_tail": proc.log_tail(60)})
                log(f"[{self.rel(time.time())}] !! {proc.name} exited on its own with code "
                    f"{proc.exit_code}; starting a replacement")
                self.start_worker()

    # -- the loop

    def schedule(self, delay: float, kind: str, arg) -> None:
        self.actions.append((time.time() + delay, kind, arg))
        self.actions.sort(key=lambda a: a[0])

    def run_due_actions(self, force: bool = False) -> None:
        now = time.time()
        while self.actions and (force or self.actions[0][0] <= now):
            _, kind, arg = self.actions.pop(0)
            if kind == "resume":
                proc, fault = arg
                proc.resume()
                fault.ended_at = time.time()
                log(f"[{self.rel(fault.ended_at)}]    #{fault.n} SIGCONT {proc.name}")
            elif kind == "zk_restart":
                index, fault = arg
                self.cluster.restart(index)
                fault.ended_at = time.time()
                log(f"[{self.rel(fault.ended_at)}]    #{fault.n} restart "
                    f"{self.cluster.label(index)}")
            elif kind == "leftovers":
                proc, fault = arg
                if left := proc.leftovers():
                    self.anomalies.append({
                        "kind": "task process outlived its SIGKILLed worker",
                        "worker": proc.name, "fault": fault.n, "pids": left})
                    proc.kill_group()
        for index, took in self.cluster.poll_restarting():
            for fault in reversed(self.faults):
                if fault.kind.startswith("zk_") and fault.served_after is None and \
                        str(index + 1) in fault.target.split(","):
                    fault.served_after = took
                    break

    def loop(self, until: float) -> None:
        lo, hi = self.args.gap
        next_fault = time.time() + self.rng.uniform(lo, hi)
        window = until - self.t0
        majority_at = self.t0 + window * self.rng.uniform(0.35, 0.65)
        overdue_at = until + MAJORITY_GRACE
        while True:
            now = time.time()
            majority_due = self.majority_wanted and now >= majority_at
            if now >= until and not majority_due:
                break
            self.run_due_actions()
            self.check_processes()
            now = time.time()
            if majority_due:
                # Nothing else until it happened: a member still down from an earlier
                # kill (or restarting) is back first, however late that makes it.
                if self.cluster.whole:
                    self.majority_done = True
                    self.zk_majority()
                    next_fault = time.time() + self.rng.uniform(lo, hi)
                elif now >= overdue_at:
                    self.majority_skipped = True
                    log(f"[{self.rel(now)}] the ensemble was not whole for "
                        f"{MAJORITY_GRACE:g}s after the window: no majority outage")
            elif now >= next_fault:
                self.inject()
                next_fault = time.time() + self.rng.uniform(lo, hi)
            time.sleep(POLL)

    @property
    def majority_wanted(self) -> bool:
        """The run's majority outage is still to come."""
        return (self.cluster.size >= 3 and not self.args.no_majority and not self.args.no_zk
                and not self.majority_done and not self.majority_skipped)

    def settle(self) -> None:
        """After the window: let scheduled SIGCONTs and restarts happen, then insist on a
        whole ensemble and at least one running worker."""
        deadline = time.time() + SETTLE_DEADLINE
        while self.actions and time.time() < deadline:
            self.run_due_actions()
            self.check_processes()
            time.sleep(POLL)
        self.run_due_actions(force=True)
        for index in list(self.cluster.down):
            self.cluster.restart(index)
        self.cluster.wait_serving(max(5.0, deadline - time.time()))
        self.run_due_actions()
        self.check_processes()
        for proc in self.procs:
            if proc.state == "paused":
                proc.resume()
        if not any(p.usable for p in self.procs):
            self.start_worker()

    # -- faults

    KINDS = {"kill_worker": 3, "kill_leader": 2, "pause_worker": 2, "pause_leader": 1,
             "zk_kill": 2}

    def inject(self) -> None:
        kinds = dict(self.KINDS)
        if self.args.no_zk:
            kinds.pop("zk_kill")
        if self.todo is None:
            # Every kind once first, in a seeded order, so that even a short run covers
            # them all; then at random by weight.
            self.todo = self.rng.sample(sorted(kinds), len(kinds))
        for kind in list(self.todo):
            if getattr(self, kind)():
                self.todo.remove(kind)
                return
        for _ in range(8):
            kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
            if getattr(self, kind)():
                return
            self.run_due_actions()  # a refused choice may have cost a ZooKeeper round trip

    def _fault(self, kind: str, target: str, **kw) -> Fault:
        fault = Fault(n=len(self.faults) + 1, kind=kind, at=time.time(), target=target, **kw)
        self.faults.append(fault)
        return fault

    def _leader_id(self) -> str | None:
        # Without a quorum nobody can tell (and asking would stall the injector).
        return self.monitor.leader_id() if self.cluster.quorum else None

    def _leader_proc(self) -> tuple[WorkerProc | None, str | None]:
        leader_id = self._leader_id()
        if leader_id is None:
            return None, None
        proc = self.proc_named(owner_name(leader_id))
        if proc is None or not proc.usable:
            return None, leader_id   # a dead or paused leader's znode, not gone yet
        return proc, leader_id

    def _victim(self) -> tuple[WorkerProc, str | None, bool] | None:
        usable = [p for p in self.usable() if p.registered]
        if not usable:
            return None
        proc = self.rng.choice(usable)
        leader = self._leader_id()
        return proc, self._current_id(proc), bool(leader and owner_name(leader) == proc.name)

    def _current_id(self, proc: WorkerProc) -> str | None:
        live = (self.monitor.worker_ids() if self.cluster.quorum else None) or []
        live = [w for w in live if owner_name(w) == proc.name]
        return live[0] if len(live) == 1 else proc.identity_at(time.time())

    def _held(self, worker_id: str | None) -> int | None:
        if worker_id is None or not self.cluster.quorum:
            return None
        return self.monitor.assigned(worker_id)

    def _kill(self, kind: str, proc: WorkerProc, worker_id: str | None, was_leader: bool):
        held = self._held(worker_id)
        fault = self._fault(kind, proc.name, worker_id=worker_id, pid=proc.pid,
                            was_leader=was_leader, held=held)
        proc.kill()
        replacement = self.start_worker()
        fault.detail = f"replaced by {replacement.name}"
        self.schedule(3.0, "leftovers", (proc, fault))
        log(f"[{self.rel(fault.at)}] #{fault.n} {kind}: SIGKILL {proc.name} (pid {proc.pid}, "
            f"{worker_id}{', the leader' if was_leader else ''}); {fault.detail}")
        return True

    def kill_worker(self) -> bool:
        victim = self._victim()
        return victim is not None and self._kill("kill_worker", *victim)

    def kill_leader(self) -> bool:
        proc, leader_id = self._leader_proc()
        return proc is not None and self._kill("kill_leader", proc, leader_id, True)

    def _pause(self, kind: str, proc: WorkerProc, worker_id: str | None, was_leader: bool):
        if sum(p.state == "paused" for p in self.procs) >= max(1, self.args.workers - 1):
            return False
        hold = self.args.session_timeout + self.rng.uniform(1.0, 2.5)
        held = self._held(worker_id)
        fault = self._fault(kind, proc.name, worker_id=worker_id, pid=proc.pid,
                            was_leader=was_leader, held=held, detail=f"stopped {hold:.1f}s")
        proc.pause()
        self.schedule(hold, "resume", (proc, fault))
        log(f"[{self.rel(fault.at)}] #{fault.n} {kind}: SIGSTOP {proc.name} (pid {proc.pid}, "
            f"{worker_id}{', the leader' if was_leader else ''}) for {hold:.1f}s")
        return True

    def pause_worker(self) -> bool:
        victim = self._victim()
        return victim is not None and self._pause("pause_worker", *victim)

    def pause_leader(self) -> bool:
        proc, leader_id = self._leader_proc()
        return proc is not None and self._pause("pause_leader", proc, leader_id, True)

    def zk_kill(self) -> bool:
        if not self.cluster.whole:
            return False  # never more than a minority (one member of three) at once
        index = None
        if self.cluster.size > 1 and self.rng.random() < 0.4:
            index = self.cluster.zk_leader_index()
        if index is None:
            index = self.rng.randrange(self.cluster.size)
        role = self.cluster.members[index].mode(timeout=0.5) or "?"
        down_for = self.rng.uniform(2.0, 5.0) if self.cluster.size > 1 \
            else self.rng.uniform(1.5, 3.0)
        fault = self._fault("zk_kill", str(index + 1), detail=f"{role}, down {down_for:.1f}s")
        self.cluster.kill(index)
        self.schedule(down_for, "zk_restart", (index, fault))
        log(f"[{self.rel(fault.at)}] #{fault.n} zk_kill: SIGKILL {self.cluster.label(index)} "
            f"({role}) for {down_for:.1f}s")
        return True

    def zk_majority(self) -> bool:
        indexes = sorted(self.rng.sample(range(self.cluster.size), self.cluster.size // 2 + 1))
        down_for = self.rng.uniform(3.0, 5.0)
        fault = self._fault("zk_majority", ",".join(str(i + 1) for i in indexes),
                            detail=f"quorum lost {down_for:.1f}s")
        for index in indexes:
            self.cluster.kill(index)
        for index in indexes:
            self.schedule(down_for, "zk_restart", (index, fault))
        log(f"[{self.rel(fault.at)}] #{fault.n} zk_majority: SIGKILL "
            f"{', '.join(self.cluster.label(i) for i in indexes)} for {down_for:.1f}s")
        return True


# --------------------------------------------------------------------------- checking


@dataclass
class Run:
    """One line of the side-effect file."""

    mark: str      # S (started) or E (side effect done)
    job_id: str
    seq: int
    attempt: int
    worker_id: str
    worker_pid: int
    task_pid: int
    at: float


def read_effects(path: Path) -> tuple[list[Run], list[str]]:
    runs, bad = [], []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            parts = line.split()
            try:
                runs.append(Run(parts[0], parts[1], int(parts[2]), int(parts[3]), parts[4],
                                int(parts[5]), int(parts[6]), float(parts[7])))
            except (IndexError, ValueError):
                bad.append(line)
    return runs, bad


def wait_all(submissions: list[Submission], deadline: float) -> None:
    """result.wait() each job until the deadline; what is unfinished then stays so."""
    for sub in submissions:
        if sub.result is None:
            continue
        while True:
            remaining = deadline - time.time()
            try:
                sub.result.wait(timeout=max(remaining, 0.01))
                break
            except TimeoutError:
                break
            except Exception:  # a blip while reading: try again until the deadline
                if remaining <= 0:
                    break
                time.sleep(0.2)


def locate(monitor: Monitor, root: str, job_id: str) -> list[str]:
    """Where a job sits in the tree (pending, delayed, assigned), for the lost-job report."""
    places = []
    with contextlib.suppress(Exception):
        # Both are sharded two levels deep (zktasks/tree.py: jobs/{queue}/{shard}/{node},
        # delayed/{minute}/{second}/{name}); a name directly below is from an older tree.
        for top in ("jobs", "delayed"):
            for first in monitor.children(f"{root}/{top}"):
                if job_id in first:
                    places.append(f"{top}/{first}")
                    continue
                for second in monitor.children(f"{root}/{top}/{first}"):
                    if job_id in second:
                        places.append(f"{top}/{first}/{second}")
                        continue
                    for node in monitor.children(f"{root}/{top}/{first}/{second}"):
                        if job_id in node:
                            places.append(f"{top}/{first}/{second}/{node}")
        live = set(monitor.children(f"{root}/workers"))
        for owner in monitor.children(f"{root}/assignments"):
            if job_id in monitor.children(f"{root}/assignments/{owner}"):
                places.append(f"assignments/{owner}/{job_id} "
                              f"({'live' if owner in live else 'GONE'} worker)")
    return places or ["nowhere but status/"]


def analyze(chaos: Chaos, submitter: Submitter, monitor: Monitor, root: str,
            effects: Path, window_end: float, ignore: set[str]) -> dict:
    from zktasks.tree import is_job_id

    t0 = chaos.t0
    runs, bad_lines = read_effects(effects)
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)

    submitted = {s.job_id: s for s in submitter.submissions if s.job_id}
    all_ids = [j for j in monitor.children(f"{root}/status", timeout=30.0) if is_job_id(j)]
    raw = monitor.get_many([f"{root}/status/{j}" for j in all_ids])
    status = {}
    for path, data in raw.items():
        with contextlib.suppress(Exception):
            status[path.rsplit("/", 1)[1]] = json.loads(data)
    orphans = sorted(set(status) - set(submitted) - ignore)  # landed, yet submit() raised

    violations: list[dict] = []
    lost: list[dict] = []
    never_submitted = [s.seq for s in submitter.submissions if not s.job_id]
    for seq in never_submitted:
        lost.append({"seq": seq, "job_id": None, "state": "never submitted",
                     "why": "submit() kept failing until the deadline"})

    finishes = []
    per_job = {}
    capped: list[dict] = []
    for job_id in list(submitted) + orphans:
        record = status.get(job_id)
        seq = submitted[job_id].seq if job_id in submitted else None
        job_runs = by_job.get(job_id, [])
        effects_done = [r for r in job_runs if r.mark == "E"]
        starts = [r for r in job_runs if r.mark == "S"]
        per_job[job_id] = (record, effects_done, starts)
        if record is None:
            lost.append({"seq": seq, "job_id": job_id, "state": "no status record",
                         "where": locate(monitor, root, job_id)})
            continue
        if record.get("finished_at"):
            finishes.append(datetime.fromisoformat(record["finished_at"]).timestamp())
        if record["state"] == "FAILED" and gave_up(chaos, record, starts):
            # Failed by zktasks' cap on lost workers (a "poison job" verdict): every loss
            # was one of our faults, so it is reported, not counted as lost.
            capped.append({
                "seq": seq, "job_id": job_id, "attempts": record.get("attempts"),
                "worker_ids": record.get("worker_ids"),
                "errors": [f"{e['exception_class_path'].rsplit('.', 1)[1]}"
                           f"({e.get('worker_id')}, attempt {e.get('attempt')})"
                           for e in record.get("errors", [])],
                "runs": [f"{r.mark} attempt {r.attempt} on {r.worker_id} at {r.at - t0:+.2f}s"
                         for r in job_runs]})
            continue
        if record["state"] != "SUCCESSFUL":
            lost.append({
                "seq": seq, "job_id": job_id, "state": record["state"],
                "attempts": record.get("attempts"), "worker_ids": record.get("worker_ids"),
                "errors": [f"{e['exception_class_path']} attempt {e.get('attempt')} on "
                           f"{e.get('worker_id')}: {e.get('message', '')[:160]}"
                           for e in record.get("errors", [])],
                "runs": [f"{r.mark} attempt {r.attempt} on {r.worker_id} at {r.at - t0:+.2f}s"
                         for r in job_runs],
                "where": locate(monitor, root, job_id)})
            continue
        # SUCCESSFUL: its result must come from a run that happened, by the last attempt.
        if not effects_done:
            violations.append({"job_id": job_id, "seq": seq,
                               "problem": "SUCCESSFUL with no execution line"})
        sub = submitted.get(job_id)
        value = None
        if sub is not None and sub.result is not None:
            with contextlib.suppress(Exception):
                value = sub.result.return_value
        if value is None:  # an orphan, or finished just after its wait() gave up
            with contextlib.suppress(Exception):
                from django.tasks import task_backends

                value = task_backends["default"].get_result(job_id).return_value
        worker_ids = record.get("worker_ids") or []
        if value is None:
            violations.append({"job_id": job_id, "seq": seq,
                               "problem": "SUCCESSFUL but its return value is unreadable"})
        else:
            if not worker_ids or value.get("worker_id") != worker_ids[-1] or \
                    value.get("attempt") != record.get("attempts"):
                violations.append({
                    "job_id": job_id, "seq": seq,
                    "problem": f"result from attempt {value.get('attempt')} on "
                               f"{value.get('worker_id')}, but the record's last attempt is "
                               f"{record.get('attempts')} on "
                               f"{worker_ids[-1] if worker_ids else None}"})
            if not any(r.worker_id == value.get("worker_id") and r.attempt == value.get("attempt")
                       for r in effects_done):
                violations.append({"job_id": job_id, "seq": seq,
                                   "problem": "the recorded result's run left no E line"})
        attempts_seen = Counter(r.attempt for r in effects_done)
        for attempt, count in attempts_seen.items():
            if count > 1:
                violations.append({"job_id": job_id, "seq": seq,
                                   "problem": f"attempt {attempt} ran {count} times"})
        if len(starts) > (record.get("attempts") or 0):
            violations.append({"job_id": job_id, "seq": seq,
                               "problem": f"{len(starts)} runs started but only "
                                          f"{record.get('attempts')} attempts recorded"})

    # One submission, one job: a submit retried after a refusal (same unique key) must
    # find the job it may have made, not make a second one whose effect counts as once.
    jobs_of_seq: dict[int, set[str]] = defaultdict(set)
    for run in runs:
        if run.mark == "E" and run.job_id not in ignore:
            jobs_of_seq[run.seq].add(run.job_id)
    for seq, job_ids in sorted(jobs_of_seq.items()):
        if len(job_ids) > 1:
            violations.append({"seq": seq, "problem": f"submission {seq} ran as "
                               f"{len(job_ids)} jobs: {sorted(job_ids)}"})

    unknown_runs = sorted({r.job_id for r in runs} - set(status) - ignore)
    for job_id in unknown_runs:
        violations.append({"job_id": job_id, "problem": "ran, but no status record exists"})

    duplicates = []
    for job_id, (record, effects_done, starts) in per_job.items():
        if record is None or len(effects_done) < 2:
            continue
        duplicates.append(explain_duplicate(chaos, job_id, record, effects_done, starts))

    all_elections = leader_elections(chaos)
    elections = [e for e in all_elections if e[0] < chaos.stopping_at]
    rate_limit = None
    if getattr(chaos.args, "rate_limit", None):
        rate_limit, over = check_rate_limit(chaos.args.rate_limit, submitter, runs,
                                            all_elections, t0)
        violations += over
    finishes.sort()
    fault_rows = [recovery(chaos, fault, finishes, status, elections, i)
                  for i, fault in enumerate(chaos.faults)]

    # The longest stretch in which no job finished, while jobs were still coming (the
    # submitter stops at 90% of the window).
    last_submit = max((s.submitted_at for s in submitter.submissions if s.submitted_at),
                      default=window_end)
    stall, stall_at = 0.0, None
    marks = [t0] + [f for f in finishes if t0 <= f <= last_submit] + [last_submit]
    for a, b in zip(marks, marks[1:], strict=False):
        if b - a > stall:
            stall, stall_at = b - a, a

    executions = Counter(len(e) for (_, e, _) in per_job.values())
    interrupted = sum(1 for (_, e, s) in per_job.values() if len(s) > len(e))
    submit_errors = Counter(err[1] for s in submitter.submissions for err in s.errors)
    log_findings = scan_logs(chaos)
    identities = {p.name: [w for _, w in p.identities()] for p in chaos.procs}

    summary = {
        "jobs_submitted": sum(1 for s in submitter.submissions if s.job_id),
        "jobs_planned": len(submitter.submissions),
        "orphan_jobs": len(orphans),
        "successful": sum(1 for j in per_job if (per_job[j][0] or {}).get("state")
                          == "SUCCESSFUL"),
        "lost": len(lost),
        "failed_by_loss_cap": len(capped),
        "executed_once": executions.get(1, 0),
        "executed_more_than_once": len(duplicates),
        "extra_executions": sum(len(e) - 1 for (_, e, _) in per_job.values() if len(e) > 1),
        "never_executed": executions.get(0, 0),
        "runs_cut_before_effect": interrupted,
        "violations": len(violations),
        "submit_retries": dict(submit_errors),
        "submit_calls_refused": sum(submit_errors.values()),
        "submit_call_max_s": round(max((s.call_s for s in submitter.submissions
                                        if s.call_s is not None), default=0.0), 2),
        "submit_call_max_at": max(((s.call_s, round(s.submitted_at - s.call_s - t0, 2))
                                   for s in submitter.submissions if s.call_s is not None),
                                  default=(0.0, None))[1],
        "leader_elections": len(elections),
        "leader_changes": max(0, len(elections) - 1),
        "taken_back": dict(zip(("batches", "jobs"), taken_back(chaos), strict=True)),
        "faults": dict(Counter(f.kind for f in chaos.faults)),
        "majority_skipped": chaos.majority_skipped,
        "worker_processes": len(chaos.procs),
        "worker_identities": sum(len(v) for v in identities.values()),
        "longest_stall_s": round(stall, 2),
        "longest_stall_at": None if stall_at is None else round(stall_at - t0, 2),
        "worker_crashes": sum(1 for a in chaos.anomalies
                              if a["kind"] == "worker exited on its own"),
        "worker_thread_deaths": len(log_findings["thread_deaths"]),
        "bad_effect_lines": len(bad_lines),
    }
    return {
        "summary": summary,
        "faults": fault_rows,
        "duplicates": duplicates,
        "lost": lost,
        "failed_by_loss_cap": capped,
        "violations": violations,
        "orphans": orphans,
        "elections": [{"at": round(t - t0, 3), "worker_id": w} for t, w in elections],
        "elections_while_stopping": [{"at": round(t - t0, 3), "worker_id": w}
                                     for t, w in all_elections if t >= chaos.stopping_at],
        "anomalies": chaos.anomalies + [{"kind": "unexpected submit error", "detail": u}
                                        for u in submitter.unexpected],
        "worker_log_findings": log_findings,
        "identities": identities,
        "bad_effect_lines": bad_lines[:20],
        "rate_limit": rate_limit,
    }


def check_rate_limit(rate: str, submitter: Submitter, runs: list[Run],
                     elections: list[tuple[float, str]], t0: float) -> tuple[dict, list[dict]]:
    """--rate-limit: did the cluster start more limited jobs than the leaders' buckets allow?

    Every start, a rerun's too, follows its own hand-out, and the leader hands out no more
    than its bucket holds: full (one burst) when a term begins, then refilled at the rate.
    The hand-outs come after the first limited submit (T0), and leader terms follow one
    another (the fence refuses a deposed leader's multis). So by any time t there can
    have been at most burst x (the terms alive in [T0, t]) + rate x (t - T0) starts;
    checked at every start. A start that lags its hand-out (a paused worker) only lowers
    the count. A bucket refilled by failovers beyond one burst, or kept per worker as
    Celery keeps rate_limit, exceeds it once a backlog builds (the submitter sends the
    queue more than the limit whenever RATE is under 3/s).

    The most starts in one second is a figure, not a check: a worker in a pause or a
    reconnection starts what it was handed late, closer together than the rate.
    """
    from zktasks.ratelimit import parse_rate

    limit = parse_rate(rate, "--rate-limit")
    limited = {s.job_id for s in submitter.submissions if s.queue == LIMITED_QUEUE and s.job_id}
    first_submit = min((s.submitted_at - (s.call_s or 0) for s in submitter.submissions
                        if s.queue == LIMITED_QUEUE and s.submitted_at), default=None)
    starts = sorted(r.at for r in runs if r.mark == "S" and r.job_id in limited)
    figures = {"limit": limit.text, "per_second": limit.per_second, "burst": limit.burst,
               "jobs": len(limited), "starts": len(starts)}
    if not starts or first_submit is None:
        return figures, []
    over = []
    allowed = 0.0
    for count, at in enumerate(starts, 1):
        terms = 1 + sum(1 for t, _ in elections if first_submit < t <= at)
        allowed = limit.burst * terms + limit.per_second * (at - first_submit)
        if count > allowed + 1e-6 and not over:  # the first breach says it; the rest follow
            over.append({"problem": f"rate limit {limit.text}: {count} limited jobs started "
                                    f"by {at - t0:+.2f}s, the buckets allow {allowed:.1f} "
                                    f"({terms} leader terms since the first limited submit)"})
    span = starts[-1] - starts[0]
    figures |= {
        "achieved_per_second": round((len(starts) - 1) / span, 3) if span else None,
        "most_in_1s": max(bisect.bisect_left(starts, s + 1.0) - i
                          for i, s in enumerate(starts)),
        "allowed_by_last_start": round(allowed, 1),
        "leader_terms": 1 + sum(1 for t, _ in elections if first_submit < t <= starts[-1]),
    }
    return figures, over


def gave_up(chaos: Chaos, record: dict, starts: list[Run]) -> bool:
    """Whether a FAILED job was failed by zktasks' cap on lost workers, each loss being one
    of the harness's faults (its worker killed or paused, or ZooKeeper down meanwhile)."""
    errors = record.get("errors") or []
    if not errors or not errors[-1].get("exception_class_path", "").endswith(".WorkerLost"):
        return False
    finished = record.get("finished_at")
    finished = datetime.fromisoformat(finished).timestamp() if finished else float("inf")
    for error in errors:
        if not error.get("exception_class_path", "").endswith(".WorkerLost"):
            return False
        worker_id = error.get("worker_id") or ""
        attempt = error.get("attempt") or 0
        began = min((r.at for r in starts if r.attempt == attempt
                     and r.worker_id == worker_id), default=chaos.t0)
        # The loss was noticed before the next attempt started (or the job was failed).
        until = min((r.at for r in starts if r.attempt > attempt), default=finished)
        proc = chaos.proc_named(owner_name(worker_id))
        crashed = proc is not None and proc.state == "crashed"
        if not crashed and not faults_for(chaos, worker_id, began, until):
            return False
    return True


def explain_duplicate(chaos: Chaos, job_id: str, record: dict, effects_done: list[Run],
                      starts: list[Run]) -> dict:
    """Why a job's side effect happened more than once: errors, worker ids, the faults."""
    t0 = chaos.t0
    errors = record.get("errors", [])
    worker_ids = record.get("worker_ids") or []
    final = (worker_ids[-1] if worker_ids else None, record.get("attempts"))
    causes = []
    explained = True
    for run in sorted(effects_done, key=lambda r: r.at):
        if (run.worker_id, run.attempt) == final:
            continue
        began = min((r.at for r in starts if r.attempt == run.attempt
                     and r.worker_id == run.worker_id), default=run.at)
        until = min((r.at for r in starts if r.attempt > run.attempt), default=float("inf"))
        error = next((e for e in errors if e.get("attempt") == run.attempt
                      and e.get("worker_id") == run.worker_id), None)
        what = error["exception_class_path"].rsplit(".", 1)[1] if error else "NO ERROR RECORDED"
        text = f"attempt {run.attempt} on {run.worker_id}: effect at {run.at - t0:+.2f}s"
        hits = []
        faults = faults_for(chaos, run.worker_id, began, until)
        if error is None or not faults:
            # A repeat with no fault on its worker would be zktasks declaring a healthy
            # worker lost: that is a finding, not at-least-once.
            explained = False
        for fault in faults:
            hit = f"#{fault.n} {fault.kind}@{fault.at - t0:+.2f}s"
            if fault.kind.startswith("pause") and fault.ended_at and run.at > fault.ended_at:
                hit += " (effect after SIGCONT; its completion was refused)"
            hits.append(hit)
        text += ", then " + ", ".join(hits) if hits else ", NO FAULT FOUND"
        if until != float("inf"):
            text += f"; {what}, rerun from {until - t0:+.2f}s"
        causes.append(text)
    return {
        "job_id": job_id,
        "seq": next((r.seq for r in effects_done), None),
        "executions": len(effects_done),
        "attempts": record.get("attempts"),
        "worker_ids": worker_ids,
        "errors": [f"{e['exception_class_path'].rsplit('.', 1)[1]}({e.get('worker_id')}, "
                   f"attempt {e.get('attempt')})" for e in errors],
        "cause": "; ".join(causes),
        "explained": explained,
    }


def faults_for(chaos: Chaos, worker_id: str, began: float, until: float) -> list[Fault]:
    """Faults that could have kept a run from recording its outcome: those on its worker's
    process, active between the run's start and the next attempt's, and ZooKeeper's
    when the worker's log shows its connection suspended or its session expired then (a
    member down does not touch a worker connected to another one)."""
    name = owner_name(worker_id)
    found = []
    troubled = None
    for fault in chaos.faults:
        if fault.target != name and not fault.kind.startswith("zk_"):
            continue
        ended = fault.ended_at or fault.at
        if not (fault.at <= until and ended >= began - 0.5):
            continue
        if fault.target != name:
            if troubled is None:
                troubled = session_trouble(chaos, worker_id, began - 0.5, until)
            if not troubled:
                continue
        found.append(fault)
    return found


def session_trouble(chaos: Chaos, worker_id: str, began: float, until: float) -> bool:
    """Whether `worker_id`'s log says its connection was suspended or its session expired
    between `began` and `until`."""
    proc = chaos.proc_named(owner_name(worker_id))
    if proc is None:
        return False
    marks = (f"ZooKeeper connection suspended worker={worker_id}",
             f"ZooKeeper session expired worker={worker_id}")
    return any(began <= t <= until and message.startswith(marks)
               for t, _, _, message in proc.log_lines())


def leader_elections(chaos: Chaos) -> list[tuple[float, str]]:
    found = []
    for proc in chaos.procs:
        for t, _, _, message in proc.log_lines():
            if m := re.match(r"leader elected worker=(\S+)", message):
                found.append((t, m[1]))
    return sorted(found)


def taken_back(chaos: Chaos) -> tuple[int, int]:
    """(batches, jobs) taken back from task processes held up by a long job, by the
    worker logs (zktasks.executor.ProcessRunner.run_many)."""
    batches = jobs = 0
    for proc in chaos.procs:
        for _, _, _, message in proc.log_lines():
            if m := re.search(r"with (\d+) job\(s\) of its batch waiting behind it", message):
                batches, jobs = batches + 1, jobs + int(m[1])
    return batches, jobs


def leader_from_logs(chaos: Chaos, when: float) -> str | None:
    """Who led at `when` by the worker logs: elected, not yet stepped down or killed.

    Used when the election znodes could not be read at the fault (no quorum)."""
    events = []
    for proc in chaos.procs:
        for t, _, _, message in proc.log_lines():
            if m := re.match(r"leader elected worker=(\S+)", message):
                events.append((t, "in", m[1]))
            elif m := re.match(r"(?:leader stepped down|leadership lost) worker=(\S+)",
                               message):
                events.append((t, "out", m[1]))
        if proc.ended_at is not None:
            for _, worker_id in proc.identities():
                events.append((proc.ended_at, "out", worker_id))
    current = None
    for t, what, worker_id in sorted(events):
        if t > when:
            break
        if what == "in":
            current = worker_id
        elif worker_id == current:
            current = None
    return current


def recovery(chaos: Chaos, fault: Fault, finishes: list[float], status: dict,
             elections: list[tuple[float, str]], index: int) -> dict:
    """Time to recover after one fault.

    next_finish: from the fault to the next job finishing anywhere.
    held: jobs assigned to the victim at the fault; handed_back: jobs whose record names the
    victim in a WorkerLost error (it was running them); back_done: from the fault until
    every one of those had finished elsewhere.
    new_leader: from the fault to the next "leader elected" (when the victim led, or for
    ZooKeeper faults if an election followed before the next fault).
    """
    t = fault.at
    if not fault.was_leader and fault.worker_id and \
            leader_from_logs(chaos, t - 0.01) == fault.worker_id:
        fault.was_leader = True
    next_finish = next((f - t for f in finishes if f > t), None)
    handed_back, back_done = 0, None
    if fault.worker_id:
        done = []
        same = [f for f in chaos.faults if f.worker_id == fault.worker_id]
        for record in status.values():
            if not any(e.get("worker_id") == fault.worker_id and
                       e.get("exception_class_path", "").endswith("WorkerLost")
                       for e in record.get("errors", [])):
                continue
            finished = record.get("finished_at")
            finished = datetime.fromisoformat(finished).timestamp() if finished else None
            # One identity can be hit twice (paused, then killed): the job belongs to the
            # last fault on it before the job finished.
            before = [f for f in same if finished is None or f.at < finished]
            if not before or before[-1] is not fault:
                continue
            handed_back += 1
            if finished is not None:
                done.append(finished)
        if done:
            back_done = max(done) - t
    new_leader = None
    following = chaos.faults[index + 1].at if index + 1 < len(chaos.faults) else float("inf")
    if fault.was_leader or fault.kind.startswith("zk_"):
        after = [e for e, _ in elections if e > t and e < chaos.stopping_at]
        if after and (fault.was_leader or after[0] < following):
            new_leader = after[0] - t
    detail = fault.detail
    if fault.served_after is not None:
        detail += f", served {fault.served_after:.1f}s after restart"
    return {
        "n": fault.n, "at": round(t - chaos.t0, 2), "kind": fault.kind, "target": fault.target,
        "worker_id": fault.worker_id, "was_leader": fault.was_leader, "detail": detail,
        "ended_after": None if fault.ended_at is None else round(fault.ended_at - t, 2),
        "zk_served_after_restart": None if fault.served_after is None
        else round(fault.served_after, 2),
        "next_finish_s": None if next_finish is None else round(next_finish, 3),
        "held": fault.held,
        "handed_back": handed_back,
        "back_done_s": None if back_done is None else round(back_done, 2),
        "new_leader_s": None if new_leader is None else round(new_leader, 2),
    }


# Worker log lines that a fault explains: counted, not reported one by one.
EXPECTED = (
    "ZooKeeper connection suspended", "ZooKeeper session expired", "ZooKeeper connection",
    "leadership lost", "job handed back", "requeue skipped", "Connection dropped",
    "Connection time-out", "Session has expired", "Failed connecting", "Closing connection",
    "Zookeeper session", "Transition to CONNECTING", "leader stepped down",
)


def scan_logs(chaos: Chaos) -> dict:
    """Count WARNING/ERROR lines of the worker logs; quote tracebacks and unknown errors.

    A thread that died ("Exception in thread ...") is reported apart: a worker whose
    leader or runner thread is gone looks alive but no longer does its part.
    """
    counts: Counter = Counter()
    excerpts, thread_deaths = [], []
    for proc in chaos.procs:
        numbered = []
        with contextlib.suppress(OSError):
            # kazoo's connection chatter (printed by logging's last resort) is left out.
            numbered = [(n, line) for n, line in enumerate(
                proc.log_path.read_text(errors="replace").splitlines(), 1)
                if not line.startswith(("Connection dropped", "Transition to"))]
        lines = [line for _, line in numbered]
        for i, line in enumerate(lines):
            m = _LOG_LINE.match(line)
            if m and m[2] in ("WARNING", "ERROR", "CRITICAL"):
                key = re.sub(r"(\w+=)\S+", r"\1…", m[4])[:90]
                counts[f"{m[2]} {key}"] += 1
                if m[2] != "WARNING" and not any(x in m[4] for x in EXPECTED):
                    excerpts.append({"worker": proc.name, "line": numbered[i][0],
                                     "text": "\n".join(lines[i:i + 40])})
            elif line.startswith("Exception in thread"):
                before = next((lines[j] for j in range(i - 1, -1, -1)
                               if _LOG_LINE.match(lines[j])), "")
                thread_deaths.append({
                    "worker": proc.name, "line": numbered[i][0],
                    "thread": line.split()[3].rstrip(":"),
                    "last_log_line_before": before,
                    "text": "\n".join(lines[i:i + 60])})
            elif line.startswith("Traceback") and not any(
                    x.startswith("Exception in thread") or " ERROR " in x[:40]
                    or " CRITICAL " in x[:40] for x in lines[max(0, i - 60):i]):
                # Logged by something else (kazoo, Django) without a timestamp.
                excerpts.append({"worker": proc.name, "line": numbered[i][0],
                                 "text": "\n".join(lines[max(0, i - 3):i + 40])})
    return {"counts": dict(counts.most_common()), "excerpts": excerpts[:30],
            "thread_deaths": thread_deaths}


# --------------------------------------------------------------------------- output


def table(rows: list[list[str]], header: list[str], right: set[int] = frozenset()) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths),
                      *[line(r) for r in rows]])


def fmt(value, spec="{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def task_kwargs(args) -> dict:
    """record_side_effect's keyword arguments for the command line's choices."""
    kwargs: dict = {}
    if args.cooperative:
        kwargs["cooperative"] = True
    if tuple(args.job_ms) != (10.0, 200.0):
        kwargs["min_ms"], kwargs["max_ms"] = args.job_ms
    if args.stalls:
        kwargs["stall_share"], kwargs["stall_ms"] = args.stalls
    if getattr(args, "no_fsync", False):
        kwargs["durable"] = False
    return kwargs


def _job_mix(args) -> str:
    """The report's words for --job-ms and --stalls, when not the defaults."""
    words = ""
    job_ms = tuple(getattr(args, "job_ms", (10.0, 200.0)))
    if job_ms != (10.0, 200.0):
        words += f", jobs of {job_ms[0]:g}-{job_ms[1]:g} ms"
    stalls = getattr(args, "stalls", None)
    if stalls:
        words += f", {stalls[0]:g} of runs stall {stalls[1]:g} ms"
    if getattr(args, "no_fsync", False):
        words += ", effects not fsync'd"
    return words


def report(result: dict, args, seed: int, elapsed: float) -> str:
    s = result["summary"]
    limited = getattr(args, "rate_limit", None)
    out = [f"chaos: seed {seed}, {args.duration:g}s of faults, {s['jobs_planned']} jobs, "
           f"{'ensemble of ' + str(args.ensemble) if args.ensemble > 1 else 'one ZooKeeper'}"
           f"{' over TLS' if getattr(args, 'tls', False) else ''}, "
           f"{args.workers} workers x {args.concurrency} "
           f"{'task processes' if args.pool == 'process' else 'threads'}, session timeout "
           f"{args.session_timeout:g}s"
           f"{', cooperative task' if args.cooperative else ''}"
           f"{_job_mix(args)}"
           f"{', every other job limited to ' + limited if limited else ''}"
           f"; {elapsed:.0f}s in all", ""]
    rows = [
        ["jobs submitted", s["jobs_submitted"]],
        ["jobs SUCCESSFUL", s["successful"]],
        ["jobs lost (must be 0)", s["lost"]],
        ["failed by the lost-worker cap", s["failed_by_loss_cap"]],
        ["executed exactly once", s["executed_once"]],
        ["executed more than once", f"{s['executed_more_than_once']} "
                                    f"({s['extra_executions']} extra runs)"],
        ["runs cut before their effect", s["runs_cut_before_effect"]],
        ["invariant violations", s["violations"]],
        ["orphan jobs (submit raised, landed)", s["orphan_jobs"]],
        ["submit calls refused, retried", f"{s['submit_calls_refused']} "
                                          f"{s['submit_retries'] or ''}".rstrip()],
        ["longest submit() call", f"{s['submit_call_max_s']:.2f}s (called at "
                                  f"{fmt(s['submit_call_max_at'], '{:+.2f}')}s)"],
        ["leader elections", f"{s['leader_elections']} ({s['leader_changes']} changes)"],
        ["jobs taken back from held-up batches", f"{s['taken_back']['jobs']} (from "
                                                 f"{s['taken_back']['batches']} batches)"],
        ["worker processes / identities", f"{s['worker_processes']} / "
                                          f"{s['worker_identities']}"],
        ["worker crashes / threads died", f"{s['worker_crashes']} / "
                                          f"{s['worker_thread_deaths']}"],
        ["longest stretch with no job finishing",
         f"{s['longest_stall_s']:.2f}s (from {fmt(s['longest_stall_at'], '{:+.2f}')}s)"],
        ["faults", ", ".join(f"{k} {v}" for k, v in sorted(s["faults"].items()))
         + ("; no majority outage (the ensemble was never whole)"
            if s["majority_skipped"] else "")],
    ]
    if (rl := result.get("rate_limit")) and rl.get("achieved_per_second") is not None:
        rows.append(["rate-limited queue", f"{rl['starts']} starts of {rl['jobs']} jobs at "
                     f"{rl['achieved_per_second']:g}/s (limit {rl['limit']}, burst "
                     f"{rl['burst']}); most in 1 s: {rl['most_in_1s']}; the buckets of "
                     f"{rl['leader_terms']} leader terms allowed "
                     f"{rl['allowed_by_last_start']:g} by the last start"])
    out.append(table([[k, str(v)] for k, v in rows], ["", ""]))
    out += ["", "faults (times from the start of the fault window; recovery in seconds after "
            "the fault):"]
    frows = []
    for f in result["faults"]:
        frows.append([
            f["n"], f"{f['at']:+.2f}", f["kind"],
            f["target"] + (f" ({f['worker_id']})" if f["worker_id"] else ""),
            "yes" if f["was_leader"] else "",
            f["detail"], fmt(f["ended_after"], "{:.1f}"), fmt(f["held"], "{}"),
            f["handed_back"] or "", fmt(f["next_finish_s"], "{:.3f}"),
            fmt(f["back_done_s"]), fmt(f["new_leader_s"]),
        ])
    out.append(table(frows, ["#", "at s", "fault", "target", "leader", "detail", "ended",
                             "held", "lost", "next finish", "lost done", "new leader"],
                     right={0, 1, 6, 7, 8, 9, 10, 11}))
    out += ["", "seconds after the fault: ended = SIGCONT or restart; next finish = the first "
            "job to finish anywhere;", "lost done = every job the victim was running (a "
            "WorkerLost error names it) finished elsewhere;", "new leader = the next "
            "\"leader elected\" in the worker logs. held = jobs assigned to the victim at "
            "the fault."]
    out += ["", "recovery by fault kind (seconds after the fault; median / max):"]
    krows = []
    for kind in sorted({f["kind"] for f in result["faults"]}):
        rows_k = [f for f in result["faults"] if f["kind"] == kind]

        def stat(key, rows_k=rows_k):
            values = sorted(f[key] for f in rows_k if f[key] is not None)
            if not values:
                return "-"
            return f"{values[len(values) // 2]:.2f} / {values[-1]:.2f} ({len(values)})"

        krows.append([kind, len(rows_k), stat("next_finish_s"), stat("back_done_s"),
                      stat("new_leader_s")])
    out.append(table(krows, ["fault", "count", "next finish", "lost done", "new leader"],
                     right={1}))
    if result["elections"]:
        out += ["", "leader elections (s, worker): " + ", ".join(
            f"{e['at']:+.2f} {e['worker_id']}" for e in result["elections"])]
    if result["duplicates"]:
        out += ["", f"jobs executed more than once ({len(result['duplicates'])}; expected "
                "under at-least-once, each with its cause):"]
        drows = [[d["seq"], d["job_id"], d["executions"], d["attempts"], d["cause"]]
                 for d in sorted(result["duplicates"], key=lambda d: d["seq"] or 0)]
        out.append(table(drows, ["seq", "job", "runs", "attempts", "cause"], right={0, 2, 3}))
    if result["failed_by_loss_cap"]:
        out += ["", f"jobs failed by zktasks' cap on lost workers "
                f"({len(result['failed_by_loss_cap'])}; every loss was one of our faults):"]
        for item in result["failed_by_loss_cap"]:
            out.append("  " + json.dumps(item))
    if result["lost"]:
        out += ["", f"LOST JOBS ({len(result['lost'])}):"]
        for item in result["lost"]:
            out.append("  " + json.dumps(item))
    if result["violations"]:
        out += ["", f"INVARIANT VIOLATIONS ({len(result['violations'])}):"]
        for item in result["violations"]:
            out.append("  " + json.dumps(item))
    if result["anomalies"]:
        out += ["", f"ANOMALIES ({len(result['anomalies'])}):"]
        for item in result["anomalies"]:
            item = dict(item)
            tail = item.pop("log_tail", None)
            out.append("  " + json.dumps(item))
            if tail:
                out.append("    " + tail.replace("\n", "\n    "))
    findings = result["worker_log_findings"]
    if findings["counts"]:
        out += ["", "worker log warnings and errors (count, message):"]
        out += [f"  {n:5d}  {k}" for k, n in findings["counts"].items()]
    if findings["thread_deaths"]:
        out += ["", f"WORKER THREADS THAT DIED ({len(findings['thread_deaths'])}):"]
        for e in findings["thread_deaths"]:
            out.append(f"  -- {e['worker']} line {e['line']}, thread {e['thread']}; last log "
                       f"line before: {e['last_log_line_before']}")
            out.append("    " + e["text"].replace("\n", "\n    "))
    if findings["excerpts"]:
        out += ["", f"worker log excerpts to look at ({len(findings['excerpts'])}):"]
        for e in findings["excerpts"][:10]:
            out.append(f"  -- {e['worker']} line {e['line']}:")
            out.append("    " + e["text"].replace("\n", "\n    "))
    return "\n".join(out)


def failed(result: dict) -> list[str]:
    """Why the run fails (empty: it passes)."""
    s = result["summary"]
    reasons = []
    if s["lost"]:
        reasons.append(f"{s['lost']} job(s) lost")
    if s["violations"]:
        reasons.append(f"{s['violations']} invariant violation(s)")
    if s["worker_crashes"]:
        reasons.append(f"{s['worker_crashes']} worker crash(es)")
    if s["worker_thread_deaths"]:
        reasons.append(f"{s['worker_thread_deaths']} worker thread(s) died")
    unexplained = [d for d in result["duplicates"] if not d["explained"]]
    if unexplained:
        reasons.append(f"{len(unexplained)} duplicate(s) with no recorded cause")
    return reasons


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="bench/chaos.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of fault injection (default 60)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs submitted over the window (default 6 per second)")
    parser.add_argument("--seed", type=int, default=None, help="RNG seed (default: random)")
    parser.add_argument("--ensemble", type=int, default=3, choices=[1, 3, 5],
                        help="ZooKeeper members (default 3)")
    parser.add_argument("--workers", type=int, default=3, help="runworker processes")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="task processes (or threads) per worker (default 2)")
    parser.add_argument("--pool", choices=["process", "thread"], default="process",
                        help="runworker --pool (default process)")
    parser.add_argument("--session-timeout", type=float, default=3.0,
                        help="zktasks SESSION_TIMEOUT in seconds (default 3)")
    parser.add_argument("--gap", type=lambda v: tuple(float(x) for x in v.split(",")),
                        default=(1.0, 3.0), metavar="MIN,MAX",
                        help="seconds between faults (default 1,3)")
    parser.add_argument("--drain-deadline", type=float, default=90.0,
                        help="seconds to wait for every job after the window (default 90; "
                             "with --rate-limit, plus the limited jobs over the rate)")
    parser.add_argument("--no-majority", action="store_true",
                        help="skip the one majority outage of the ensemble")
    parser.add_argument("--no-zk", action="store_true", help="no ZooKeeper member faults")
    parser.add_argument("--cooperative", action="store_true",
                        help="the task checks zktasks.cancel_requested() before its effect "
                             "and stops when asked, as a task written for it would")
    parser.add_argument("--job-ms", type=lambda v: tuple(float(x) for x in v.split(",")),
                        default=(10.0, 200.0), metavar="MIN,MAX",
                        help="milliseconds each job sleeps (default 10,200); with 0,1 the "
                             "workers batch the jobs of a backlog")
    parser.add_argument("--stalls", type=lambda v: tuple(float(x) for x in v.split(",")),
                        default=None, metavar="SHARE,MS",
                        help="a SHARE of the runs sleep MS milliseconds instead (such as "
                             "0.01,800: with --job-ms 0,1, jobs batched behind them are "
                             "taken back and run on other task processes)")
    parser.add_argument("--no-fsync", action="store_true",
                        help="the task's side-effect lines are written but not fsync'd "
                             "(processes are killed, never the machine): with --job-ms "
                             "0,1 jobs are then short enough for workers to batch them")
    parser.add_argument("--tls", action="store_true",
                        help="workers and submitter speak mutual TLS to the members' "
                             "secureClientPort (a throw-away CA made in the run directory)")
    parser.add_argument("--rate-limit", metavar="RATE", default=None,
                        help="send every other job to a queue limited to RATE (such as "
                             "3/s) in RATE_LIMITS, and check that the cluster never started "
                             "more of them than the leaders' buckets allow")
    parser.add_argument("--json", metavar="PATH", help="also write the findings as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run directory (logs, side effects, ZooKeeper data)")
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = max(10, int(args.duration * 6))
    if args.jobs < 1 or args.duration <= 0 or args.workers < 1 or args.concurrency < 1:
        parser.error("--jobs, --duration, --workers and --concurrency must be positive")
    if len(args.gap) != 2 or not 0 < args.gap[0] <= args.gap[1]:
        parser.error("--gap takes MIN,MAX seconds with 0 < MIN <= MAX")
    if args.rate_limit is not None:
        from zktasks.exceptions import ConfigurationError
        from zktasks.ratelimit import parse_rate

        try:
            parse_rate(args.rate_limit, "--rate-limit")
        except ConfigurationError as exc:
            parser.error(str(exc))
    return args


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    signal.signal(signal.SIGTERM, _raise_exit)
    started = time.time()
    run_dir = Path(tempfile.mkdtemp(prefix="zktasks-chaos-"))
    log_dir = run_dir / "workers"
    log_dir.mkdir()
    effects = run_dir / "effects.log"
    run_id = secrets.token_hex(4)
    root = f"/chaos-{run_id}"
    log(f"chaos: seed {seed}; run directory {run_dir}; root {root}")
    # This process's own kazoo and zktasks chatter (reconnections...) goes to a file.
    handler = logging.FileHandler(run_dir / "harness.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    for name in ("kazoo", "zktasks"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    from zktasks.testing import ZooKeeperStartError, ZooKeeperUnavailable

    cluster = None
    chaos = None
    monitor = None
    submitter = None
    ok = False
    try:
        tls = None
        if args.tls:
            from zktasks.testing import make_tls_files

            tls = make_tls_files(run_dir / "tls")
            os.environ.update(ZKTASKS_CHAOS_TLS_CA=str(tls.ca),
                              ZKTASKS_CHAOS_TLS_CERTFILE=str(tls.client_cert),
                              ZKTASKS_CHAOS_TLS_KEYFILE=str(tls.client_key))
        cluster = Cluster(args.ensemble, run_dir / "zookeeper", tls)
        os.environ.update(ZKTASKS_CHAOS_HOSTS=cluster.client_hosts, ZKTASKS_CHAOS_ROOT=root,
                          ZKTASKS_CHAOS_SESSION_TIMEOUT=str(args.session_timeout),
                          ZKTASKS_CHAOS_RATE_LIMIT=args.rate_limit or "")
        env = dict(os.environ)
        env.update(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None,
                                                                  [env.get("PYTHONPATH")])]),
                   PYTHONUNBUFFERED="1")
        cluster.spawn()
        # Workers boot Django while the JVMs form their quorum.
        chaos = Chaos(args, rng, cluster, env, log_dir, None)  # monitor set below
        for _ in range(args.workers):
            chaos.start_worker()
        cluster.wait_serving(120.0)
        log(f"ZooKeeper serving at {cluster.hosts} ({time.time() - started:.1f}s)")
        monitor = Monitor(cluster.hosts, root)
        chaos.monitor = monitor

        import django

        django.setup()
        from django.utils.module_loading import import_string

        task = import_string(TASK_PATH)

        deadline = time.time() + REGISTER_DEADLINE
        while len(monitor.worker_ids() or []) < args.workers:
            chaos.check_processes()
            if time.time() > deadline:
                raise HarnessError(f"workers did not register within {REGISTER_DEADLINE:.0f}s:"
                                   "\n" + "\n".join(p.log_tail(20) for p in chaos.procs))
            time.sleep(0.1)
        warmup = task.submit(str(run_dir / "warmup.log"), -1).wait(timeout=60)
        if warmup.status.name != "SUCCESSFUL":
            raise HarnessError(f"the warm-up job did not succeed: {warmup.errors}")
        log(f"{args.workers} workers registered, a warm-up job ran "
            f"({time.time() - started:.1f}s); faults for {args.duration:g}s")

        chaos.t0 = time.time()
        window_end = chaos.t0 + args.duration
        submitter = Submitter(task, effects, args.jobs, chaos.t0, args.duration * 0.9, run_id,
                              deadline=window_end + SETTLE_DEADLINE,
                              task_kwargs=task_kwargs(args),
                              limited=args.rate_limit is not None)
        submitter.start()
        chaos.loop(window_end)
        log(f"[{chaos.rel(time.time())}] fault window over: {len(chaos.faults)} faults; "
            "settling")
        chaos.settle()
        log(f"[{chaos.rel(time.time())}] ensemble whole, "
            f"{sum(p.usable for p in chaos.procs)} workers running; waiting for every job")
        submitter.join(SETTLE_DEADLINE)
        submitter.stop_event.set()
        drain_deadline = time.time() + args.drain_deadline
        if args.rate_limit:
            # The limited queue drains no faster than its rate: time for all of it.
            from zktasks.ratelimit import parse_rate

            limited = sum(1 for s in submitter.submissions if s.queue == LIMITED_QUEUE)
            drain_deadline += limited / parse_rate(args.rate_limit, "--rate-limit").per_second
        watching = threading.Event()
        watcher = threading.Thread(target=_watch, args=(chaos, watching), daemon=True)
        watcher.start()
        try:
            wait_all(submitter.submissions, drain_deadline)
        finally:
            watching.set()
            watcher.join(5)
        log(f"[{chaos.rel(time.time())}] jobs waited for; stopping workers")
        chaos.stopping_at = time.time()
        for proc in chaos.procs:
            if proc.state in ("running", "paused"):
                proc.stop()
                if proc.exit_code not in (0, None):
                    chaos.anomalies.append({
                        "kind": "worker did not exit cleanly on SIGTERM", "worker": proc.name,
                        "exit_code": proc.exit_code, "state": proc.state,
                        "log_tail": proc.log_tail(40)})
        result = analyze(chaos, submitter, monitor, root, effects, window_end,
                         ignore={warmup.id})
        elapsed = time.time() - started
        result["seed"] = seed
        result["args"] = {k: v for k, v in vars(args).items()}
        result["run_dir"] = str(run_dir)
        result["elapsed_s"] = round(elapsed, 1)
        result["raw_faults"] = [asdict(f) | {"at": round(f.at - chaos.t0, 3)}
                                for f in chaos.faults]
        reasons = failed(result)
        result["failed"] = reasons
        log("")
        log(report(result, args, seed, elapsed))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
            log(f"\nwrote {args.json}")
        log("")
        if reasons:
            log(f"CHAOS FAILED: {'; '.join(reasons)}. Logs kept in {run_dir}")
            return 1
        log("CHAOS PASSED: no job lost, every duplicate explained, no invariant broken.")
        ok = True
        return 0
    except (ZooKeeperUnavailable, ZooKeeperStartError, HarnessError) as exc:
        print(f"chaos harness could not run: {exc}", file=sys.stderr)
        return 2
    finally:
        if submitter is not None:
            submitter.stop_event.set()
        if chaos is not None:
            for proc in chaos.procs:
                proc.close()
        if monitor is not None:
            monitor.close()
        if cluster is not None:
            cluster.close()
        if ok and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif not ok:
            print(f"run directory kept: {run_dir}", file=sys.stderr)


def _watch(chaos: Chaos, done: threading.Event) -> None:
    """Keep noticing crashed workers (and replacing them) while the harness waits."""
    while not done.wait(0.5):
        with contextlib.suppress(Exception):
            chaos.check_processes()


if __name__ == "__main__":
    sys.exit(main())
