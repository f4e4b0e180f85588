"""Benchmark zktasks end to end against its own ZooKeeper: one command, one table.

    .venv/bin/python bench/run.py [--jobs N] [--quick] [--json PATH]

Starts a standalone ZooKeeper (zktasks.testing, fsync on) in a temp dir, then for each
scenario starts `python -m django runworker` processes on a fresh root, and measures:

* submit/s: N no-op jobs submitted back to back from this process (zktasks' API), by
  one loop or, with --submitters, by that many threads at once (a web server's request
  threads; --submitters 1,4,16 runs every scenario once per count, ratios paired by it);
* end-to-end jobs/s: N / (last job's finished_at - first submit);
* latency p50/p99: submit one job, wait for its result, repeat (idle cluster);
* ZooKeeper requests and write transactions per job, from the server's own counters
  ("srvr": Received, Zxid) read before and after the throughput phase;
* the memory of each worker: peak RSS (VmHWM) of its main process, and the peak of its
  whole tree's PSS (the main process and its children, sampled every 0.5 s), which
  counts a page shared by forked children once, as it is in RAM.

A row runs the same pipeline on raw kazoo (bench/peer.py) for comparison, and the peer
matrix runs the same two workloads (noop, 10 ms sleep) with 1 and 2 worker processes
through zktasks, Celery (default and reliable settings), RQ, Huey, Dramatiq and
django-tasks-db (bench/peers/, the `bench` extra), each on its own loopback server, and
prints the ratios zktasks / each peer. See bench/README.md.
"""

import argparse
import contextlib
import fnmatch
import json
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

START_DEADLINE = 90.0   # seconds for workers to register
DRAIN_DEADLINE = 300.0  # seconds for a throughput run to finish after the last submit
WAIT_TIMEOUT = 30.0     # seconds for any single job's result
SCALE_JOBS = 1_000_000  # issue 6: a million pending jobs submitted and drained
QUICK_SCALE_JOBS = 20_000
SCALE_GB_PER_MILLION = 8  # ZooKeeper heap a million pending jobs took (bench/README, Scale)
SCALE_SPARE_GB = 3        # memory left for the workers, the bench and the system
STOP_DEADLINE = 45.0    # seconds for a worker to drain and exit after SIGTERM (drain 30s)
POLL = 0.02
PSS_INTERVAL = 0.5      # seconds between samples of the worker trees' PSS


class BenchError(Exception):
    """Something the bench cannot go on from; the message says what."""


# --------------------------------------------------------------------------- machine


def machine_info(zk) -> dict:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    java = "unknown"
    with contextlib.suppress(Exception):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        java = (out.stderr or out.stdout).splitlines()[0]
    srvr = zk.four_letter_word("srvr")
    zk_version = re.search(r"Zookeeper version: ([^,\s]+)", srvr)
    import django
    import kazoo

    fs = "unknown"
    with contextlib.suppress(Exception):
        fs = subprocess.run(["df", "--output=fstype", str(zk.data_dir)], capture_output=True,
                            text=True, timeout=10).stdout.split()[-1]
    commit = "unknown"
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "zktasks"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
        if dirty:
            commit += f" + {len(dirty)} uncommitted file(s) in zktasks/"
    mem_kb = 0
    with contextlib.suppress(OSError):
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "kazoo": getattr(kazoo, "__version__", None) or _dist_version("kazoo"),
        "zookeeper": zk_version[1] if zk_version else "unknown",
        "java": java,
        "zk_data_fs": fs,
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
        "zktasks_commit": commit,
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return "unknown"


# --------------------------------------------------------------------------- ZooKeeper


@dataclass
class Counters:
    received: int
    sent: int
    zxid: int
    fsyncs: int
    bytes_in: int = -1


def zk_counters(zk) -> Counters:
    """The server's packet counters and last zxid (one 4lw connection each)."""
    srvr = zk.four_letter_word("srvr")
    mntr = zk.four_letter_word("mntr")
    try:
        received = int(re.search(r"^Received: (\d+)", srvr, re.M)[1])
        sent = int(re.search(r"^Sent: (\d+)", srvr, re.M)[1])
        zxid = int(re.search(r"^Zxid: (0x[0-9a-fA-F]+)", srvr, re.M)[1], 16)
        fsync = re.search(r"^zk_cnt_fsynctime\s+(\d+)", mntr, re.M)
        bytes_in = re.search(r"^zk_bytes_received_count\s+(\d+)", mntr, re.M)
    except (TypeError, ValueError) as exc:
        raise BenchError(f"cannot parse ZooKeeper counters from:\n{srvr}") from exc
    return Counters(received, sent, zxid, int(fsync[1]) if fsync else -1,
                    int(bytes_in[1]) if bytes_in else -1)


def counter_delta(before: Counters, after: Counters, own_requests: int) -> dict:
    # The 4lw commands between the snapshots count as packets too (srvr + mntr = 2
    # received, 2 sent); so do the bench's own completion polls (1 each way).
    return {
        "received": after.received - before.received - 2 - own_requests,
        "sent": after.sent - before.sent - 2 - own_requests,
        "txns": (after.zxid & 0xFFFFFFFF) - (before.zxid & 0xFFFFFFFF),
        "fsyncs": after.fsyncs - before.fsyncs if before.fsyncs >= 0 else None,
        # Includes the bench's own polls (a get_children request is ~40 bytes).
        "bytes_in": after.bytes_in - before.bytes_in if before.bytes_in >= 0 else None,
    }


class Monitor:
    """A kazoo session of the bench's own, for polling the tree (requests are counted)."""

    def __init__(self, hosts: str):
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=hosts, timeout=10.0)
        self.client.start(timeout=15.0)
        self.requests = 0

    def children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        self.requests += 1
        try:
            return self.client.get_children(path)
        except NoNodeError:
            return []

    def wait_workers(self, path: str, count: int, procs: list, deadline: float,
                     interval: float = 0.1) -> list[str]:
        limit = time.monotonic() + deadline
        while True:
            for proc in procs:
                proc.check_alive()
            found = self.children(path)
            if len(found) >= count:
                return found
            if time.monotonic() > limit:
                raise BenchError(f"only {len(found)} of {count} workers registered under "
                                 f"{path} within {deadline:.0f}s")
            time.sleep(interval)

    def waiting(self, queue_path: str) -> int:
        """Jobs waiting in a queue: its job nodes, or the jobs in its shards (zktasks
        shards jobs/{queue}; an emptied shard lingers a few seconds before the leader
        deletes it, and must not count as work left)."""
        from zktasks.tree import parse_shard

        count = 0
        for name in self.children(queue_path):
            if not parse_shard(name):
                count += 1
                continue
            self.requests += 1
            stat = self.client.exists(f"{queue_path}/{name}")
            count += stat.numChildren if stat is not None else 0
        return count

    def wait_drained(self, queue_path: str, assignments_path: str, procs: list,
                     deadline: float) -> float:
        """Poll until no job is pending or assigned; return when that was seen."""
        limit = time.monotonic() + deadline
        while True:
            if not self.waiting(queue_path):
                owners = self.children(assignments_path)
                if not any(self.children(f"{assignments_path}/{o}") for o in owners):
                    return time.time()
            if time.monotonic() > limit:
                left = self.waiting(queue_path)
                raise BenchError(f"jobs still pending ({left} unassigned) {deadline:.0f}s "
                                 "after the last submit")
            for proc in procs:
                proc.check_alive()
            time.sleep(POLL)

    def warm_zookeeper(self, count: int) -> float:
        """Give the server's JIT some work before anything is timed; return seconds."""
        started = time.monotonic()
        root = f"/bench-warmup-{secrets.token_hex(4)}"
        self.client.ensure_path(root)
        window = []
        for i in range(count):
            txn = self.client.transaction()
            txn.create(f"{root}/n{i}", b"x" * 300)
            txn.check(root, -1)
            window.append(txn.commit_async())
            window.append(self.client.get_children_async(root))
            if len(window) >= 200:
                for pending in window:
                    pending.get(timeout=WAIT_TIMEOUT)
                window = []
        for pending in window:
            pending.get(timeout=WAIT_TIMEOUT)
        self.client.delete(root, recursive=True)
        return time.monotonic() - started

    def delete_tree(self, root: str) -> int:
        """Delete a finished scenario's tree; return how many znodes it had.

        The peers' servers are emptied before each scenario (Redis FLUSHALL, the
        database's rows deleted); without this ZooKeeper kept every earlier row's jobs,
        about 4,000 status records a row, and a full run left its heap (the test
        fixture's -Xmx512m) 80-98 % full with full GCs under the later rows, and
        snapshots of an ever larger tree. kazoo's delete(recursive=True) sends one
        request at a time (about 10 s for a row's tree): testing.delete_tree pipelines
        the listing and deletes in multis of testing.DELETE_BATCH."""
        from zktasks.testing import delete_tree

        return delete_tree(self.client, root, timeout=WAIT_TIMEOUT)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop()
            self.client.close()


# --------------------------------------------------------------------------- processes


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after it.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _hwm_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    return int(match[1]) / 1024 if match else None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


_TICK = os.sysconf("SC_CLK_TCK")


def _per_thread(pid: int, name: str, read) -> float:
    """The sum of `read(text)` over /proc/PID/task/TID/`name` of a process's live threads;
    a thread that ended meanwhile (or a file this kernel lacks) counts nothing."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    total = 0
    for tid in tids:
        try:
            total += read(Path(f"/proc/{pid}/task/{tid}/{name}").read_text())
        except (OSError, IndexError, ValueError):
            continue
    return total


def _context_switches(pid: int) -> int:
    """Voluntary plus involuntary context switches of a process's live threads.

    A thread hand-off (a runner waking for its job, a reply waking its caller) is a
    switch, so this counts what CPU seconds on a noisy VM cannot show reliably.
    """
    return _per_thread(pid, "status", lambda text: sum(
        int(n) for n in re.findall(r"ctxt_switches:\s+(\d+)", text)))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _runq_wait_seconds(pid: int) -> float:
    """Seconds a process's live threads spent runnable but waiting for a CPU so far
    (/proc/PID/task/TID/schedstat, its second field, in ns; needs schedstats, on in
    every kernel that has /proc/PID/schedstat). A hand-off that waits here is paid in
    latency and throughput but not in CPU seconds, so a row whose CPUs stood half idle
    while each job cost more can be told from one that waited its turn for a CPU."""
    return _per_thread(pid, "schedstat", lambda text: int(text.split()[1])) / 1e9


def _host_cpu() -> dict:
    """Idle (with iowait), stolen and total CPU seconds of the whole machine so far, all
    CPUs (/proc/stat). Steal is time the hypervisor gave this VM's vCPUs to others:
    figures of a row that ran while it was high are not the software's alone."""
    try:
        fields = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return {"host_idle": 0.0, "host_steal": 0.0, "host_total": 0.0}
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    return {"host_idle": (fields[3] + fields[4]) / _TICK, "host_steal": fields[7] / _TICK,
            "host_total": sum(fields[:8]) / _TICK}


def host_pct(cpu_ms_per_job: dict, key: str) -> float | None:
    """`key` (host_idle, host_steal) of a phase as a percentage of all CPUs' time in it,
    from the phase's per-job figures (CpuMeter.per_job_ms)."""
    total = cpu_ms_per_job.get("host_total")
    if not total or key not in cpu_ms_per_job:
        return None
    return 100 * cpu_ms_per_job[key] / total


class CpuMeter:
    """CPU seconds used by the bench process, the worker trees and ZooKeeper; the
    worker trees' run-queue wait; the machine's idle and stolen time."""

    def __init__(self, server_pids: list[int], procs: list["Proc"],
                 sampler: "MemorySampler | None" = None):
        self.server_pids = server_pids
        self.procs = procs
        self.sampler = sampler

    def sample(self) -> dict:
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        # The memory sampler's thread is the bench's, not the submitter's work.
        sampler = self.sampler.cpu_seconds if self.sampler is not None else 0.0
        children = [pid for proc in self.procs for pid in _descendants(proc.pid)]
        mains = sum(_cpu_seconds(proc.pid) for proc in self.procs)
        tasks = sum(_cpu_seconds(pid) for pid in children)
        # "workers" counts the whole tree; "task_processes" is the part of it spent in
        # the pool's task processes (zero with --pool thread).
        trees = [proc.pid for proc in self.procs] + children
        return {"submitter": own.ru_utime + own.ru_stime - sampler, "workers": mains + tasks,
                "task_processes": tasks,
                "zookeeper": sum(_cpu_seconds(pid) for pid in self.server_pids),
                "runq_wait": sum(_runq_wait_seconds(pid) for pid in trees),
                **_host_cpu()}

    def switches(self) -> int:
        """Context switches of the worker trees so far (their live threads)."""
        return sum(_context_switches(pid) for proc in self.procs
                   for pid in (proc.pid, *_descendants(proc.pid)))

    @staticmethod
    def per_job_ms(before: dict, after: dict, jobs: int) -> dict:
        return {k: round((after[k] - before[k]) * 1000 / jobs, 3) for k in before}


def _tree(pid: int) -> list[int]:
    """A process and its descendants, from /proc/PID/task/TID/children: cheaper than the
    scan of /proc in _descendants, for the sampler that runs during the timed phases."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tids = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{current}/task/{tid}/children").read_text()
                todo.extend(int(child) for child in children.split())
    return found


class Proc:
    """A worker subprocess in its own process group, with its log file, and a watchdog
    that kills the group if the bench dies without stopping it (SIGKILL)."""

    running: list["Proc"] = []

    def __init__(self, name: str, cmd: list[str], env: dict, log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT,
                                      process_group=0)
        from bench.peers.servers import watchdog

        self.watchdog = watchdog(self.popen.pid)
        self.stop_seconds: float | None = None
        self.pss_peak_mb = 0.0
        Proc.running.append(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return "(no log)"

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(f"{self.name} exited with code {self.popen.returncode}; "
                             f"log {self.log_path}:\n{self.log_tail()}")

    def sample_pss(self) -> None:
        """Note the PSS of the whole tree now, if it is the largest seen."""
        self.pss_peak_mb = max(self.pss_peak_mb, pss_mb(_tree(self.pid)))

    def rss(self) -> dict:
        """Peak RSS of the process and of each descendant (task processes)."""
        children = {pid: (_hwm_mb(pid), _cmdline(pid)) for pid in _descendants(self.pid)}
        children = {pid: v for pid, v in children.items() if v[0] is not None}
        return {
            "main_mb": round(_hwm_mb(self.pid) or 0.0, 1),
            "children_mb": [round(mb, 1) for mb, _ in children.values()],
            "children": [cmd for _, cmd in children.values()],
        }

    def stop(self) -> None:
        """SIGTERM (the worker drains), then SIGKILL after a deadline; reap the group."""
        if self not in Proc.running:
            return
        started = time.monotonic()
        try:
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(STOP_DEADLINE)
                except subprocess.TimeoutExpired:
                    print(f"  ! {self.name} did not exit {STOP_DEADLINE:.0f}s after SIGTERM; "
                          "killing it", file=sys.stderr)
                    self.popen.kill()
                    self.popen.wait(10)
            self.stop_seconds = round(time.monotonic() - started, 2)
        finally:
            # Task processes die with their parent (PDEATHSIG); anything else left in
            # the group goes now. The watchdog is a member (so the group id stays ours).
            from bench.peers.servers import end_watchdog

            dog = self.watchdog.pid if self.watchdog is not None else None
            if [pid for pid in _group_members(self.pid) if pid != dog]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
            end_watchdog(self.watchdog)
            self._log.close()
            Proc.running.remove(self)


class MemorySampler:
    """Samples the PSS of each worker tree every PSS_INTERVAL seconds, in a thread, from
    the workers' start to the end of their scenario; each Proc keeps its peak.

    PSS (smaps_rollup) divides a page shared by n processes by n, so a forked child's
    copy-on-write pages count once for the tree, as they are in RAM; peak RSS (VmHWM)
    summed over a tree would count them in every child.
    """

    def __init__(self, procs: list["Proc"]):
        self.procs = procs
        self.cpu_seconds = 0.0   # this thread's CPU, left out of the submitter's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PSS_INTERVAL):
            for proc in list(self.procs):
                proc.sample_pss()
            self.cpu_seconds = time.thread_time()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":  # zombies need no kill
                    members.append(int(entry.name))
    return members


def stop_all() -> None:
    for proc in list(Proc.running):
        try:
            proc.stop()
        except Exception as exc:
            print(f"  ! stopping {proc.name} failed: {exc!r}", file=sys.stderr)


def worker_env(hosts: str, root: str) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.settings",
        ZKTASKS_BENCH_HOSTS=hosts,
        ZKTASKS_BENCH_ROOT=root,
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
        PYTHONUNBUFFERED="1",
    )
    return env


# --------------------------------------------------------------------------- drivers


@dataclass
class Done:
    """When one job was enqueued, started and finished (epoch seconds), and which worker
    ran it (its worker id)."""

    enqueued: float
    started: float
    finished: float
    worker: str | None = None


class ZkTasksDriver:
    """Submit and wait through zktasks' public API (bench.tasks.noop or .sleep10)."""

    def __init__(self, root: str, workload: str = "noop", pipelined: bool = False):
        from django.tasks import task_backends

        from zktasks.tree import Layout

        backend = task_backends["default"]
        if backend.conf.root != root:
            raise BenchError(f"backend root is {backend.conf.root}, expected {root}")
        layout = Layout(root)
        self.queue_path = layout.queue("default")
        self.assignments_path = layout.assignments
        self.workers_path = layout.workers
        self.leader_path = layout.leader
        from bench import tasks

        self.task = getattr(tasks, workload)
        self.pipelined = pipelined

    def batch(self):
        """Where a run of submits happens: `zktasks.pipelined()` for the -pipelined rows
        (each job durable when the block ends, not when submit() returns)."""
        if not self.pipelined:
            return contextlib.nullcontext()
        import zktasks

        return zktasks.pipelined()

    def submit(self):
        return self.task.enqueue()

    def wait(self, result, timeout: float) -> Done:
        result.wait(timeout=timeout)
        if result.status.name != "SUCCESSFUL":
            raise BenchError(f"job {result.id} ended {result.status.name}: {result.errors}")
        return Done(result.enqueued_at.timestamp(), result.started_at.timestamp(),
                    result.finished_at.timestamp(),
                    result.worker_ids[-1] if result.worker_ids else None)

    def close(self) -> None:
        pass


class PeerDriver:
    def __init__(self, hosts: str, root: str):
        from bench.peer import PeerClient

        self.peer = PeerClient(hosts, root)
        self.queue_path = self.peer.queue_path
        self.assignments_path = self.peer.assignments_path
        self.workers_path = self.peer.paths["workers"]

    def batch(self):
        return contextlib.nullcontext()

    def submit(self):
        return self.peer.submit()

    def wait(self, job_id, timeout: float) -> Done:
        record = self.peer.wait(job_id, timeout)
        return Done(record["enqueued_at"], record["started_at"], record["finished_at"],
                    record.get("worker"))

    def close(self) -> None:
        self.peer.close()


# --------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    name: str
    kind: str          # "zktasks", "peer" (raw kazoo) or "queue" (a system in bench/peers)
    workers: int
    pool: str
    concurrency: int
    workload: str = "noop"
    system: str = "zktasks"
    matrix: bool = False   # a row of the peer matrix


@dataclass
class Row:
    scenario: str
    workers: int
    pool: str
    concurrency: int
    jobs: int
    submit_idle_per_s: float = 0.0
    submit_zk_requests_per_job: float = 0.0
    submit_cpu_ms_per_job: float = 0.0
    drain_per_s: float | None = 0.0   # None: too few jobs after every worker ran one
    drain_zk_requests_per_job: float = 0.0
    drain_zk_txns_per_job: float = 0.0
    submit_per_s: float = 0.0
    e2e_per_s: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_samples: int = 0
    latency_breakdown_ms: dict = field(default_factory=dict)
    zk_requests_per_job: float = 0.0
    zk_sent_per_job: float = 0.0
    zk_txns_per_job: float = 0.0
    zk_fsyncs_per_job: float | None = None
    cpu_ms_per_job: dict = field(default_factory=dict)
    drain_cpu_ms_per_job: dict = field(default_factory=dict)
    worker_switches_per_job: float | None = None  # context switches, streaming phase
    zk_raw: dict = field(default_factory=dict)
    rss: list = field(default_factory=list)
    rss_main_mb: float = 0.0
    rss_tree_mb: float = 0.0
    stop_seconds: list = field(default_factory=list)
    system: str = "zktasks"
    workload: str = "noop"
    # Comparable across systems (the peer matrix): streaming phase, counted until every
    # result has been read once, from the server's own counters (ZooKeeper or Redis).
    server_requests_per_job: float | None = None
    server_bytes_in_per_job: float | None = None
    rss_leader_mb: float | None = None   # zktasks: the worker tree that leads (VmHWM sum)
    pss_tree_mb: float = 0.0             # peak PSS of a worker tree, the largest
    pss_leader_mb: float | None = None   # zktasks: the same for the worker that leads
    drain_window: dict = field(default_factory=dict)   # what the drain rate was timed on
    server_mb: float | None = None       # PSS of ZooKeeper / Redis / PostgreSQL afterwards
    matrix: bool = False
    submitters: int = 1                  # threads submitting the streaming phase's jobs
    latency_zk_txns_per_job: float | None = None  # zktasks: one job at a time, idle cluster
    sparse_zk_txns_per_job: float | None = None  # zktasks: one job a second (--sparse)


def record_memory(row: "Row", procs) -> None:
    """Check every worker process is alive and note its memory, with its children's."""
    for proc in procs:
        proc.check_alive()
        proc.sample_pss()
        row.rss.append({**proc.rss(), "pss_peak_mb": round(proc.pss_peak_mb, 1)})
    row.rss_main_mb = max(r["main_mb"] for r in row.rss)
    # The sum of VmHWM over a tree, kept in the JSON to compare with older runs: it
    # counts the pages a forked child shares with its parent twice.
    row.rss_tree_mb = max(r["main_mb"] + sum(r["children_mb"]) for r in row.rss)
    row.pss_tree_mb = max(r["pss_peak_mb"] for r in row.rss)


def drain_window(finishes: list[tuple[float, str | None]], workers: list[str]) -> dict:
    """Time a backlog's drain from the moment every worker has finished a job to the
    last finish: by then all of them are running, so their start-up is left out.

    `finishes` are (finish time, the worker that ran the job: one of `workers`, or None
    when that is unknown). A worker that finished none of the backlog leaves the window
    to start at the others' first finishes; it is named in the result. When fewer than
    a tenth of the jobs (or 10) finish inside the window, the backlog was nearly gone
    before the last worker got going: there is no rate ("per_s" None).
    """
    first: dict[str, float] = {}
    for at, worker in finishes:
        if worker is not None:
            first[worker] = min(at, first.get(worker, at))
    earliest = min(at for at, _ in finishes)
    start = max(first.values()) if first else earliest
    last = max(at for at, _ in finishes)
    timed = sum(1 for at, _ in finishes if at > start)
    enough = timed >= max(10, len(finishes) // 10) and last > start
    return {
        "per_s": timed / (last - start) if enough else None,
        "jobs_timed": timed, "seconds": round(last - start, 4),
        "after_first_finish_s": round(start - earliest, 4),
        "first_finish_s": {w: round(at - earliest, 4) for w, at in sorted(first.items())},
        "workers_without_a_job": [w for w in workers if w not in first],
        "unattributed_jobs": sum(1 for _, worker in finishes if worker is None),
    }


def note_drain(row: "Row", window: dict) -> None:
    row.drain_window = window
    row.drain_per_s = window["per_s"]
    if window["workers_without_a_job"] or window["unattributed_jobs"]:
        print(f"   ! drain timed without knowing every worker was running: workers "
              f"without a job {window['workers_without_a_job']}, jobs of no known worker "
              f"{window['unattributed_jobs']}", flush=True)
    if window["per_s"] is None:
        print(f"   ! no drain rate: only {window['jobs_timed']} jobs finished after every "
              f"worker had finished one ({window['after_first_finish_s']:.2f}s after the "
              "first finish); more --jobs would give one", flush=True)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class Phase:
    """ZooKeeper counters and CPU meters between two instants of one scenario."""

    def __init__(self, zk, monitor: Monitor, procs: list["Proc"],
                 sampler: MemorySampler | None = None):
        self.zk = zk
        self.monitor = monitor
        self.meter = CpuMeter([zk.pid] if zk.pid else [], procs, sampler)
        self.cpu = self.meter.sample()
        self.switches = self.meter.switches()
        self.counters = zk_counters(zk)
        self.polls = monitor.requests

    def end(self, jobs: int) -> dict:
        after = zk_counters(self.zk)
        delta = counter_delta(self.counters, after, self.monitor.requests - self.polls)
        delta["cpu_ms_per_job"] = CpuMeter.per_job_ms(self.cpu, self.meter.sample(), jobs)
        delta["worker_switches_per_job"] = round(
            (self.meter.switches() - self.switches) / jobs, 2)
        return delta


def start_workers(sc: Scenario, zk, root: str, log_dir: Path) -> list["Proc"]:
    env = worker_env(zk.hosts, root)
    if sc.kind == "peer":
        cmd = [sys.executable, "-m", "bench.peer", "serve", "--hosts", zk.hosts,
               "--root", root, "--threads", str(sc.concurrency)]
        return [Proc(f"{sc.name}-0", cmd, env, log_dir)]
    procs = []
    for i in range(sc.workers):
        cmd = [sys.executable, "-m", "django", "runworker", "--queues", "default",
               "--concurrency", str(sc.concurrency), "--pool", sc.pool,
               "--name", f"{sc.name}-{i}", "-v", "1"]
        procs.append(Proc(f"{sc.name}-{i}", cmd, env, log_dir))
    return procs


def run_scenario(sc: Scenario, zk, monitor: Monitor, args, log_dir: Path,
                 submitters: int = 1) -> Row:
    root = f"/bench-{sc.name}-{secrets.token_hex(4)}"
    row = Row(sc.name, sc.workers, sc.pool, sc.concurrency, args.jobs, system=sc.system,
              workload=sc.workload, matrix=sc.matrix, submitters=submitters)
    print(f"-- {sc.name}: {sc.workers} worker(s), pool={sc.pool}, concurrency="
          f"{sc.concurrency}, root={root}", flush=True)
    procs: list[Proc] = []
    profilers: list[Profiler] = []
    sampler = None
    settings_cm = None
    driver = None
    try:
        if sc.kind == "zktasks":
            from django.test import override_settings

            settings_cm = override_settings(TASKS=tasks_setting(zk.hosts, root))
            settings_cm.enable()
            driver = ZkTasksDriver(root, sc.workload,
                                   pipelined=sc.system in (PIPELINED, PIPELINED_THREAD))
        else:
            driver = PeerDriver(zk.hosts, root)

        # 1. Backlog: submit with no worker running (nothing competes for the CPUs), then
        # start the workers and time how fast they drain it: the workers' own capacity,
        # which the streaming phase below cannot show when the submitter is slower.
        phase = Phase(zk, monitor, [])
        p0 = time.perf_counter()
        with driver.batch():
            backlog = [driver.submit() for _ in range(args.jobs)]
        row.submit_idle_per_s = args.jobs / (time.perf_counter() - p0)
        delta = phase.end(args.jobs)
        row.zk_raw["submit"] = delta
        row.submit_zk_requests_per_job = delta["received"] / args.jobs
        row.submit_cpu_ms_per_job = delta["cpu_ms_per_job"]["submitter"]
        started = time.monotonic()
        procs = start_workers(sc, zk, root, log_dir)
        sampler = MemorySampler(procs)
        if args.profile:
            profilers = [Profiler(p, args.profile / f"{sc.name}-{i}-backlog.txt")
                         for i, p in enumerate(procs)]
        # Poll finely: counting starts at registration, and the leader assigns nothing
        # before the worker registers (the peer's assigner starts after, too).
        monitor.wait_workers(driver.workers_path, sc.workers, procs, START_DEADLINE,
                             interval=0.005)
        phase = Phase(zk, monitor, procs, sampler)
        print(f"   {sc.workers} worker(s) registered in {time.monotonic() - started:.1f}s; "
              f"draining a backlog of {args.jobs}", flush=True)
        monitor.wait_drained(driver.queue_path, driver.assignments_path, procs, DRAIN_DEADLINE)
        delta = phase.end(args.jobs)
        for profiler in profilers:
            profiler.stop()
        done = [driver.wait(h, WAIT_TIMEOUT) for h in backlog]
        note_drain(row, drain_window([(d.finished, _zk_worker(d.worker, procs)) for d in done],
                                     [p.name for p in procs]))
        row.drain_zk_requests_per_job = delta["received"] / args.jobs
        row.drain_zk_txns_per_job = delta["txns"] / args.jobs
        row.zk_raw["backlog"] = delta
        row.drain_cpu_ms_per_job = delta["cpu_ms_per_job"]
        print(f"   backlog: submit (no workers) {row.submit_idle_per_s:.0f}/s, drained at "
              f"{_rate(row.drain_per_s)} jobs/s", flush=True)

        # 2. Streaming: submit while the (warm) workers run, until all are finished.
        if args.profile:
            profilers = [Profiler(p, args.profile / f"{sc.name}-{i}-stream.txt")
                         for i, p in enumerate(procs)]
        phase = Phase(zk, monitor, procs, sampler)
        t0 = time.time()
        p0 = time.perf_counter()
        # The submit rate counts until every job is written.
        handles = submit_all(driver.submit, args.jobs, submitters, driver.batch)
        submit_s = time.perf_counter() - p0
        monitor.wait_drained(driver.queue_path, driver.assignments_path, procs, DRAIN_DEADLINE)
        delta = phase.end(args.jobs)
        for profiler in profilers:
            profiler.stop()
        last = max(driver.wait(h, WAIT_TIMEOUT).finished for h in handles)
        # The same counters once every result has been read: what the peers' rows count.
        after = counter_delta(phase.counters, zk_counters(zk),
                              monitor.requests - phase.polls)
        row.server_requests_per_job = (after["received"] - 2) / args.jobs
        if after["bytes_in"] is not None:
            row.server_bytes_in_per_job = after["bytes_in"] / args.jobs
        row.submit_per_s = args.jobs / submit_s
        row.e2e_per_s = args.jobs / (last - t0)
        row.zk_raw["stream"] = delta
        row.cpu_ms_per_job = delta["cpu_ms_per_job"]
        row.worker_switches_per_job = delta["worker_switches_per_job"]
        row.zk_requests_per_job = delta["received"] / args.jobs
        row.zk_sent_per_job = delta["sent"] / args.jobs
        row.zk_txns_per_job = delta["txns"] / args.jobs
        if delta["fsyncs"] is not None:
            row.zk_fsyncs_per_job = delta["fsyncs"] / args.jobs
        print(f"   streaming: submit {row.submit_per_s:.0f}/s, end-to-end "
              f"{row.e2e_per_s:.0f} jobs/s, {row.zk_requests_per_job:.2f} ZK requests/job",
              flush=True)

        # 3. Latency on an idle cluster (and the write transactions of a job alone).
        latencies, queued, running, notified = [], [], [], []
        phase = Phase(zk, monitor, procs, sampler)
        for _ in range(args.latency):
            p0 = time.perf_counter()
            handle = driver.submit()
            done = driver.wait(handle, WAIT_TIMEOUT)
            latencies.append(time.perf_counter() - p0)
            woke = time.time()
            queued.append(done.started - done.enqueued)
            running.append(done.finished - done.started)
            notified.append(woke - done.finished)
        row.latency_zk_txns_per_job = round(phase.end(args.latency)["txns"] / args.latency, 2)
        row.latency_samples = len(latencies)
        row.latency_p50_ms = _pct(latencies, 0.50) * 1000
        row.latency_p99_ms = _pct(latencies, 0.99) * 1000
        row.latency_breakdown_ms = {
            "enqueued_to_started_p50": round(statistics.median(queued) * 1000, 2),
            "started_to_finished_p50": round(statistics.median(running) * 1000, 2),
            "finished_to_waiter_p50": round(statistics.median(notified) * 1000, 2),
        }
        print(f"   latency: p50 {row.latency_p50_ms:.1f} ms, p99 {row.latency_p99_ms:.1f} ms",
              flush=True)

        # 4. One job a second: at low load nearly every job opens a new second's shard
        # and finished-index bucket, which back-to-back jobs share; what that costs in
        # write transactions (per job, housekeeping included) shows only here. Paced by
        # the clock on purpose: the rate is what is measured.
        if args.sparse:
            phase = Phase(zk, monitor, procs, sampler)
            for _ in range(args.sparse):
                time.sleep(1.05 - time.time() % 1.0)  # just past the next whole second
                driver.wait(driver.submit(), WAIT_TIMEOUT)
            row.sparse_zk_txns_per_job = round(
                phase.end(args.sparse)["txns"] / args.sparse, 2)
            print(f"   one job a second: {row.sparse_zk_txns_per_job:.2f} write txns/job",
                  flush=True)

        record_memory(row, procs)
        if sc.kind == "zktasks":
            leads = leader_index(monitor, driver.leader_path, procs)
            if leads is not None:
                r = row.rss[leads]
                row.rss_leader_mb = round(r["main_mb"] + sum(r["children_mb"]), 1)
                row.pss_leader_mb = r["pss_peak_mb"]
        row.server_mb = round(pss_mb([zk.pid]), 1)
    finally:
        for profiler in profilers:
            profiler.stop()
        if sampler is not None:
            sampler.stop()
        for proc in procs:
            proc.stop()
            row.stop_seconds.append(proc.stop_seconds)
        if driver is not None:
            driver.close()
        if settings_cm is not None:
            settings_cm.disable()
    print(f"   workers stopped in {row.stop_seconds} s", flush=True)
    forget_tree(monitor, root)
    return row


def forget_tree(monitor: Monitor, root: str) -> None:
    """Delete a scenario's tree once its row is done (untimed), as the peers' servers
    are emptied before theirs; a failure is reported, never the bench's end."""
    p0 = time.perf_counter()
    try:
        count = monitor.delete_tree(root)
    except Exception as exc:  # cleanup between rows, never a figure: report and go on
        print(f"   could not delete {root}: {exc!r} (later rows share a larger tree)",
              flush=True)
        return
    print(f"   deleted its {count:,} znodes in {time.perf_counter() - p0:.1f}s (untimed)",
          flush=True)


WARM_UP_JOBS = 1000


def warm_up_with_zktasks(zk, monitor: "Monitor", args, log_dir: Path) -> None:
    """An untimed zktasks scenario before the first timed one, its figures thrown away.

    The multis and listings of Monitor.warm_zookeeper() do not warm every path a zktasks
    cluster takes through ZooKeeper (sessions and ephemeral nodes, sequential election
    nodes, multiRead, persistent recursive watches, ...): without this, the first zktasks
    row of a run paid ZooKeeper 1.2-1.5 ms of CPU per job, against 0.8-1.0 ms for the
    same scenario run second, and a partial run (`--only`) ranked zktasks lower."""
    started = time.monotonic()
    print("-- warm-up (untimed): a zktasks scenario whose figures are not kept", flush=True)
    brief = argparse.Namespace(**{**vars(args), "jobs": min(args.jobs, WARM_UP_JOBS),
                                  "latency": 20, "profile": None})
    run_scenario(Scenario("zktasks-warmup", "zktasks", 2, "process", 2), zk, monitor, brief,
                 log_dir)
    print(f"   warm-up done in {time.monotonic() - started:.1f}s", flush=True)


def pss_mb(pids: list[int]) -> float:
    from bench.peers.servers import pss_mb as pss

    return pss(pids)


def leader_index(monitor: Monitor, leader_path: str, procs: list["Proc"]) -> int | None:
    """Which of `procs` leads: the data of the lowest-sequence election znode is its
    worker id, which starts with its --name."""
    try:
        nodes = monitor.client.get_children(leader_path)
        first = min(nodes, key=lambda n: n[-10:])
        leader_id = monitor.client.get(f"{leader_path}/{first}")[0].decode()
    except Exception:
        return None
    for i, proc in enumerate(procs):
        if leader_id.startswith(f"{proc.name}-"):
            return i
    return None


def _zk_worker(worker_id: str | None, procs: list["Proc"]) -> str | None:
    """The Proc name of a zktasks worker id (it starts with the worker's --name); the raw
    kazoo peer's ids do not, but it runs one worker process."""
    if len(procs) == 1:
        return procs[0].name
    for proc in procs:
        if worker_id is not None and worker_id.startswith(f"{proc.name}-"):
            return proc.name
    return None


def _peer_worker(result: dict, trees: dict[str, set[int]]) -> str | None:
    """The worker (Proc name) that ran a peer's job: the one that recorded its name
    (django-tasks-db), or whose process tree holds the process that ran it or that
    process's parent (an RQ work horse has exited by now, its parent has not)."""
    if result.get("worker") in trees:
        return result["worker"]
    for name, pids in trees.items():
        if result.get("pid") in pids or result.get("ppid") in pids:
            return name
    return None


def run_queue_scenario(sc: Scenario, drv, args, log_dir: Path, submitters: int = 1) -> Row:
    """The same three phases through a peer system (bench/peers): its own API to submit
    and to wait, its own worker command, its server's counters."""
    row = Row(sc.name, sc.workers, sc.pool, sc.concurrency, args.jobs, system=sc.system,
              workload=sc.workload, matrix=sc.matrix, submitters=submitters)
    each = ("at default concurrency" if os.environ.get("BENCH_PEER_DEFAULTS")
            else "one job at a time each")
    print(f"-- {sc.name}: {sc.workers} worker process(es), {each}, workload {sc.workload}",
          flush=True)
    server = drv.server
    counters = getattr(server, "counters", None)
    procs: list[Proc] = []
    sampler = None
    env = worker_env(os.environ["ZKTASKS_BENCH_HOSTS"], "/bench-unused")
    env.update(DJANGO_SETTINGS_MODULE=drv.settings_module, **drv.worker_env())
    drv.reset()
    try:
        # 1. Backlog, then the workers start and drain it.
        meter = CpuMeter(server.pids, [])
        cpu0 = meter.sample()
        c0 = counters() if counters else None
        p0 = time.perf_counter()
        backlog = [drv.submit(sc.workload) for _ in range(args.jobs)]
        row.submit_idle_per_s = args.jobs / (time.perf_counter() - p0)
        row.submit_cpu_ms_per_job = CpuMeter.per_job_ms(cpu0, meter.sample(),
                                                        args.jobs)["submitter"]
        if counters:
            row.submit_zk_requests_per_job = \
                server.own_requests(c0, counters())["requests"] / args.jobs
        for i in range(sc.workers):
            name = f"{sc.name}-{i}"
            procs.append(Proc(name, drv.worker_cmd(name), env, log_dir))
        sampler = MemorySampler(procs)
        meter = CpuMeter(server.pids, procs, sampler)
        cpu0 = meter.sample()
        results = _wait_all(drv, backlog, procs)
        row.drain_cpu_ms_per_job = CpuMeter.per_job_ms(cpu0, meter.sample(), args.jobs)
        trees = {proc.name: set(_tree(proc.pid)) for proc in procs}
        note_drain(row, drain_window([(r["at"], _peer_worker(r, trees)) for r in results],
                                     [p.name for p in procs]))
        print(f"   backlog: submit (no workers) {row.submit_idle_per_s:.0f}/s, drained at "
              f"{_rate(row.drain_per_s)} jobs/s", flush=True)

        # 2. Streaming: submit while the warm workers run; wait for every result.
        cpu0 = meter.sample()
        c0 = counters() if counters else None
        t0 = time.time()
        p0 = time.perf_counter()
        handles = submit_all(lambda: drv.submit(sc.workload), args.jobs, submitters,
                             contextlib.nullcontext)
        submit_s = time.perf_counter() - p0
        last = max(r["at"] for r in _wait_all(drv, handles, procs))
        row.cpu_ms_per_job = CpuMeter.per_job_ms(cpu0, meter.sample(), args.jobs)
        if counters:
            delta = server.own_requests(c0, counters())
            row.zk_raw["stream"] = delta
            row.server_requests_per_job = delta["requests"] / args.jobs
            row.server_bytes_in_per_job = delta["bytes_in"] / args.jobs
        row.submit_per_s = args.jobs / submit_s
        row.e2e_per_s = args.jobs / (last - t0)
        print(f"   streaming: submit {row.submit_per_s:.0f}/s, end-to-end "
              f"{row.e2e_per_s:.0f} jobs/s", flush=True)

        # 3. Latency on the idle system.
        latencies = []
        for _ in range(args.latency):
            p0 = time.perf_counter()
            drv.wait(drv.submit(sc.workload), WAIT_TIMEOUT)
            latencies.append(time.perf_counter() - p0)
        row.latency_samples = len(latencies)
        row.latency_p50_ms = _pct(latencies, 0.50) * 1000
        row.latency_p99_ms = _pct(latencies, 0.99) * 1000
        print(f"   latency: p50 {row.latency_p50_ms:.1f} ms, p99 {row.latency_p99_ms:.1f} ms",
              flush=True)
        record_memory(row, procs)
        row.server_mb = round(pss_mb(server.pids), 1)
    finally:
        if sampler is not None:
            sampler.stop()
        for proc in procs:
            proc.stop()
            row.stop_seconds.append(proc.stop_seconds)
    print(f"   workers stopped in {row.stop_seconds} s", flush=True)
    return row


def submit_all(submit, jobs: int, submitters: int, batch) -> list:
    """`jobs` submits from `submitters` threads at once (each inside its own `batch()`,
    as a pipelined block is per thread), like the request threads of a web server; the
    handles in no particular order. One submitter submits on the calling thread."""
    if submitters == 1:
        with batch():
            return [submit() for _ in range(jobs)]
    shares = [jobs // submitters + (i < jobs % submitters) for i in range(submitters)]
    handles: list = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    go = threading.Barrier(submitters)

    def run(share: int) -> None:
        go.wait()
        try:
            with batch():
                mine = [submit() for _ in range(share)]
        except BaseException as exc:  # reported below, on the calling thread
            errors.append(exc)
            return
        with lock:
            handles.extend(mine)

    threads = [threading.Thread(target=run, args=(share,), name=f"submitter-{i}")
               for i, share in enumerate(shares)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"{len(errors)} of {submitters} submitter threads failed: "
                         f"{errors[0]!r}") from errors[0]
    return handles


def _wait_all(drv, handles: list, procs: list["Proc"]) -> list[dict]:
    """Every job's result (work.stamp(): its finish time and process ids); a worker that
    died is reported with its log."""
    try:
        return drv.wait_all(handles, WAIT_TIMEOUT if len(handles) == 1 else DRAIN_DEADLINE)
    except Exception as exc:
        for proc in procs:
            proc.check_alive()
        raise BenchError(f"waiting for {drv.system} results failed: {exc!r}; worker log "
                         f"{procs[0].log_path}:\n{procs[0].log_tail()}") from exc


class Profiler:
    """py-spy sampling one worker and its task processes (only with --profile)."""

    def __init__(self, proc: "Proc", out: Path):
        exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or \
            shutil.which("py-spy")
        if exe is None:
            raise BenchError("--profile needs py-spy: .venv/bin/pip install py-spy")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out
        self._log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115
        self.popen = subprocess.Popen(
            [exe, "record", "--pid", str(proc.pid), "--subprocesses", "--rate", "250", "--gil",
             "--format", "raw", "--output", str(out), "--nonblocking"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        time.sleep(0.5)  # let it attach

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


def tasks_setting(hosts: str, root: str) -> dict:
    from django.conf import settings

    tasks = json.loads(json.dumps(settings.TASKS))
    tasks["default"]["OPTIONS"].update(HOSTS=hosts, ROOT=root)
    return tasks


# --------------------------------------------------------------------------- output


COLUMNS = (
    ("scenario", "scenario", "{}"),
    ("workers", "workers", "{}"),
    ("pool", "pool", "{}"),
    ("jobs", "jobs", "{}"),
    ("submit/s", "submit_per_s", "{:.0f}"),
    ("e2e jobs/s", "e2e_per_s", "{:.0f}"),
    ("drain jobs/s", "drain_per_s", "{:.0f}"),
    ("p50 ms", "latency_p50_ms", "{:.1f}"),
    ("p99 ms", "latency_p99_ms", "{:.1f}"),
    ("ZK req/job", "zk_requests_per_job", "{:.2f}"),
    ("ZK txn/job", "zk_txns_per_job", "{:.2f}"),
    ("fsync/job", "zk_fsyncs_per_job", "{:.2f}"),
    ("RSS MB main", "rss_main_mb", "{:.0f}"),
    ("PSS MB tree", "pss_tree_mb", "{:.0f}"),
)


DETAIL_COLUMNS = (
    ("scenario", lambda r: r.scenario, "{}"),
    ("submit/s idle", lambda r: r.submit_idle_per_s, "{:.0f}"),
    ("req/submit", lambda r: r.submit_zk_requests_per_job, "{:.2f}"),
    ("CPU ms/submit", lambda r: r.submit_cpu_ms_per_job, "{:.2f}"),
    ("drain req/job", lambda r: r.drain_zk_requests_per_job, "{:.2f}"),
    ("drain txn/job", lambda r: r.drain_zk_txns_per_job, "{:.2f}"),
    ("CPU ms/job stream: submitter", lambda r: r.cpu_ms_per_job.get("submitter"), "{:.2f}"),
    ("workers", lambda r: r.cpu_ms_per_job.get("workers"), "{:.2f}"),
    ("(tasks)", lambda r: r.cpu_ms_per_job.get("task_processes"), "{:.2f}"),
    ("switches", lambda r: r.worker_switches_per_job, "{:.1f}"),
    ("ZK", lambda r: r.cpu_ms_per_job.get("zookeeper"), "{:.2f}"),
    ("runq wait", lambda r: r.cpu_ms_per_job.get("runq_wait"), "{:.2f}"),
    ("idle %", lambda r: host_pct(r.cpu_ms_per_job, "host_idle"), "{:.0f}"),
    ("steal %", lambda r: host_pct(r.cpu_ms_per_job, "host_steal"), "{:.1f}"),
    ("drain: workers", lambda r: r.drain_cpu_ms_per_job.get("workers"), "{:.2f}"),
    ("ZK", lambda r: r.drain_cpu_ms_per_job.get("zookeeper"), "{:.2f}"),
    ("lat p50 ms: queued", lambda r: r.latency_breakdown_ms.get("enqueued_to_started_p50"),
     "{:.1f}"),
    ("running", lambda r: r.latency_breakdown_ms.get("started_to_finished_p50"), "{:.1f}"),
    ("notify", lambda r: r.latency_breakdown_ms.get("finished_to_waiter_p50"), "{:.1f}"),
)


MATRIX_COLUMNS = (
    ("scenario", lambda r: r.scenario, "{}"),
    ("workers", lambda r: r.workers, "{}"),
    ("jobs", lambda r: r.jobs, "{}"),
    ("submit/s", lambda r: r.submit_per_s, "{:.0f}"),
    ("e2e jobs/s", lambda r: r.e2e_per_s, "{:.0f}"),
    ("drain jobs/s", lambda r: r.drain_per_s, "{:.0f}"),
    ("p50 ms", lambda r: r.latency_p50_ms, "{:.1f}"),
    ("p99 ms", lambda r: r.latency_p99_ms, "{:.1f}"),
    ("srv req/job", lambda r: r.server_requests_per_job, "{:.2f}"),
    ("srv B in/job", lambda r: r.server_bytes_in_per_job, "{:.0f}"),
    ("PSS MB worker", lambda r: r.pss_tree_mb, "{:.0f}"),
    ("PSS MB leader", lambda r: r.pss_leader_mb, "{:.0f}"),
    ("server MB", lambda r: r.server_mb, "{:.0f}"),
    ("idle %", lambda r: host_pct(r.cpu_ms_per_job, "host_idle"), "{:.0f}"),
    ("steal %", lambda r: host_pct(r.cpu_ms_per_job, "host_steal"), "{:.1f}"),
)

# zktasks / peer, per (workload, workers): above 1 means zktasks has more of it.
RATIO_FIGURES = (
    ("submit/s", "submit_per_s"),
    ("e2e jobs/s", "e2e_per_s"),
    ("drain jobs/s", "drain_per_s"),
    ("p50 ms", "latency_p50_ms"),
    ("p99 ms", "latency_p99_ms"),
    ("PSS MB worker", "pss_tree_mb"),
)


def ratio_rows(rows: list[Row]) -> list[dict]:
    """zktasks / each peer of the same workload, worker count and submitter threads; the
    -pipelined rows get their own lines ("zktasks" names which row was the numerator)."""
    out = []
    for system in ("zktasks", PIPELINED, PIPELINED_THREAD):
        ours = {(r.workload, r.workers, r.submitters): r for r in rows
                if r.system == system and r.matrix}
        for r in rows:
            base = ours.get((r.workload, r.workers, r.submitters))
            if base is None or r.system in OURS:
                continue
            ratios = {}
            for title, attr in RATIO_FIGURES:
                mine, theirs = getattr(base, attr), getattr(r, attr)
                ratios[title] = mine / theirs if mine and theirs else None
            out.append({"workload": r.workload, "workers": r.workers,
                        "submitters": r.submitters, "peer": r.system,
                        "zktasks": base.system, **ratios})
    return out


def format_ratios(ratios: list[dict], sweep: bool = False) -> str:
    columns = [("workload", lambda d: d["workload"], "{}"),
               ("workers", lambda d: d["workers"], "{}"),
               ("zktasks", lambda d: d["zktasks"], "{}"),
               ("/ peer", lambda d: d["peer"], "{}")]
    if sweep:
        columns.insert(2, ("submitters", lambda d: d["submitters"], "{}"))
    columns += [(title, (lambda d, t=title: d[t]), "{:.2f}") for title, _ in RATIO_FIGURES]
    return format_table(ratios, columns, left=len(columns) - len(RATIO_FIGURES))


def with_submitters(columns) -> list:
    """`columns` with the row's submitter threads after its scenario (a --submitters
    sweep runs each scenario once per count)."""
    return [columns[0], ("submitters", "submitters", "{}"), *columns[1:]]


def format_table(rows: list, columns=None, left: int = 3) -> str:
    """`columns`: (title, the row's attribute name or a function of the row, format)."""
    columns = [(title, (lambda r, a=get: getattr(r, a)) if isinstance(get, str) else get, fmt)
               for title, get, fmt in (COLUMNS if columns is None else columns)]
    header = [title for title, _, _ in columns]
    body = []
    for row in rows:
        cells = []
        for _, get, fmt in columns:
            value = get(row)
            cells.append("-" if value is None else fmt.format(value))
        body.append(cells)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(cells) for cells in body]
    return "\n".join(out)


def format_machine(info: dict) -> str:
    load = f"load avg at start {' '.join(info['loadavg_start'])}"
    if "loadavg_end" in info:
        load += f", at end {' '.join(info['loadavg_end'])}"
    fsync = ""
    if "zk_avg_fsynctime" in info:
        fsync = (f" (fsync avg {info['zk_avg_fsynctime']:g} ms, max "
                 f"{info['zk_max_fsynctime']:g} ms over the run)")
    return "\n".join([
        f"machine:   {info['nproc']} CPUs ({info['cpu']}), {info['memory_gb']} GB RAM, "
        f"Linux {info['kernel']}, {load}",
        f"software:  Python {info['python']}, Django {info['django']}, kazoo {info['kazoo']}, "
        f"ZooKeeper {info['zookeeper']} ({info['java']}); zktasks at {info['zktasks_commit']}",
        f"zookeeper: standalone, data on {info['zk_data_fs']}, fsync on{fsync}",
    ])


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs per throughput run (default 2000; 300 with --quick)")
    parser.add_argument("--latency", type=int, default=None, metavar="N",
                        help="sequential submit+wait samples (default 200; 50 with --quick)")
    parser.add_argument("--sparse", type=int, default=None, metavar="N",
                        help="zktasks rows: N jobs one a second after the latency phase, "
                             "for the write transactions of a job at low load (default "
                             "10; 3 with --quick; 0 skips it)")
    parser.add_argument("--quick", action="store_true", help="fewer jobs, for a smoke run")
    mode = parser.add_mutually_exclusive_group()
    # Issue 6 states its targets against the peers' default configurations, so that is
    # what a bare run compares; --defaults stays accepted for the commands in the docs.
    mode.add_argument("--defaults", action="store_true",
                      help="peer matrix at each system's default concurrency (Celery: a "
                           "child per CPU; Dramatiq: a process per CPU x 8 threads; "
                           "zktasks: a runner per CPU), plus the zktasks row tuned for "
                           "short jobs; the default")
    mode.add_argument("--one-at-a-time", action="store_true",
                      help="peer matrix with every worker process running one job at a "
                           "time (concurrency 1), instead of each system's defaults")
    parser.add_argument("--submitters", type=_counts, default=(1,), metavar="N[,N...]",
                        help="submit the streaming phase's jobs from N threads at once, "
                             "as a web server's request threads do (default 1: one "
                             "loop); the backlog and latency phases stay one loop. A "
                             "list (1,4,16) runs every scenario once per count, and "
                             "pairs the ratios by it")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated scenario names to run (default: all)")
    parser.add_argument("--profile", metavar="DIR", type=Path,
                        help="sample each worker (and its task processes) with py-spy "
                             "during the backlog and streaming phases; raw stacks to DIR")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the temp dir (ZooKeeper data, worker logs) afterwards")
    parser.add_argument("--failover-trials", type=int, default=None, metavar="N",
                        help="after the matrix, run bench/failover.py with N trials per "
                             "scenario (default 5; 2 with --quick; 0 skips it, and so does "
                             "--only unless this is given)")
    parser.add_argument("--scale-jobs", type=int, default=None, metavar="N",
                        help="after the matrix, run bench/scale.py with N pending jobs "
                             f"(default {SCALE_JOBS:,}; {QUICK_SCALE_JOBS:,} with --quick; "
                             "0 skips it, and so does --only unless this is given); its "
                             "ZooKeeper heap is sized from N, and N is lowered to what "
                             "this machine's free memory holds")
    args = parser.parse_args(argv)
    args.defaults = not args.one_at_a_time
    if args.jobs is None:
        args.jobs = 300 if args.quick else 2000
    if args.latency is None:
        args.latency = 50 if args.quick else 200
    if args.sparse is None:
        args.sparse = 3 if args.quick else 10
    if args.sparse < 0:
        parser.error("--sparse must be 0 (skip) or more")
    if args.jobs < 1 or args.latency < 1:
        parser.error("--jobs and --latency must be at least 1")
    if not all(1 <= n <= args.jobs for n in args.submitters):
        parser.error("--submitters must be between 1 and --jobs")
    # The whole benchmark (no --only) also times failover and drains a large backlog,
    # issue 6's other targets; a partial run does only when asked.
    if args.failover_trials is None:
        args.failover_trials = 0 if args.only else (2 if args.quick else 5)
    if args.scale_jobs is None:
        args.scale_jobs = 0 if args.only else (QUICK_SCALE_JOBS if args.quick else SCALE_JOBS)
    if args.failover_trials < 0 or args.scale_jobs < 0:
        parser.error("--failover-trials and --scale-jobs must be 0 (skip) or more")
    return args


def _counts(text: str) -> tuple[int, ...]:
    """`4` or `1,4,16`: the submitter thread counts, in the order given, once each."""
    try:
        counts = tuple(dict.fromkeys(int(part) for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count or a comma-separated list of counts (4, or 1,4,16)"
        ) from None
    return counts


WORKLOADS = ("noop", "sleep10")
# zktasks-pipelined: the same zktasks, each run of submits inside `zktasks.pipelined()`.
PIPELINED = "zktasks-pipelined"
# zktasks-pipelined-thread: that, with workers tuned for short jobs (`--pool thread
# --concurrency 16`, like Dramatiq's default of 8 threads per process) instead of the
# default (task processes, one slot per CPU). Never counted as the default's figures.
PIPELINED_THREAD = "zktasks-pipelined-thread"
THREAD_CONCURRENCY = 16
OURS = ("zktasks", PIPELINED, PIPELINED_THREAD, "raw-kazoo")
MATRIX_SYSTEMS = ("zktasks", PIPELINED, PIPELINED_THREAD, "celery", "celery-reliable", "rq",
                  "huey", "dramatiq", "django-tasks-db")

SCENARIOS = (
    Scenario("zktasks-1w", "zktasks", 1, "process", 2),
    Scenario("zktasks-2w", "zktasks", 2, "process", 2),
    Scenario("zktasks-1w-thread", "zktasks", 1, "thread", 2),
    Scenario("peer-raw-kazoo", "peer", 1, "thread", 2, system="raw-kazoo"),
    # The peer matrix: every worker process runs one job at a time (see bench/README.md).
    *(Scenario(f"{system}-{workload}-{n}w", "zktasks" if system in OURS else "queue", n,
               "thread" if system == PIPELINED_THREAD else "process" if system in OURS else "-",
               THREAD_CONCURRENCY if system == PIPELINED_THREAD else 1, workload, system, True)
      for system in MATRIX_SYSTEMS for workload in WORKLOADS for n in (1, 2)),
)


def select(only: str | None) -> tuple[Scenario, ...]:
    """Scenarios named in --only: names or shell patterns (celery*, *-sleep10-*)."""
    if not only:
        return SCENARIOS
    chosen = []
    for pattern in (p.strip() for p in only.split(",") if p.strip()):
        found = [s for s in SCENARIOS if fnmatch.fnmatchcase(s.name, pattern)]
        if not found:
            raise BenchError(f"--only: no scenario matches {pattern!r}; have "
                             f"{', '.join(s.name for s in SCENARIOS)}")
        chosen += [s for s in found if s not in chosen]
    return tuple(s for s in SCENARIOS if s in chosen)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        scenarios = select(args.only)
    except BenchError as exc:
        print(exc, file=sys.stderr)
        return 2
    from bench import peers

    if args.defaults:
        # Each system at its own default concurrency (the peers read this variable).
        os.environ["BENCH_PEER_DEFAULTS"] = "1"
        scenarios = tuple(replace(s, concurrency=os.cpu_count() or 1)
                          if s.matrix and s.system in OURS and s.system != PIPELINED_THREAD
                          else s for s in scenarios)
    elif not args.only:
        # With --one-at-a-time every worker process runs one job at a time; a row tuned
        # to run 16 would break that premise. It runs when named in --only.
        scenarios = tuple(s for s in scenarios if s.system != PIPELINED_THREAD)
    systems = list(dict.fromkeys(s.system for s in scenarios if s.kind == "queue"))
    if missing := peers.missing(systems):
        print(f"bench: the peers need Python packages that are not installed ({', '.join(missing)}"
              f"):\n  {peers.INSTALL_HINT}\nor leave them out with --only 'zktasks*'",
              file=sys.stderr)
        return 2
    # SIGTERM and a hang-up (a closed terminal or SSH session) stop the run as Ctrl-C
    # does: through the finally below, which stops everything it started.
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)

    from bench.peers.servers import PostgresServer, RedisServer, ServerMissing
    from zktasks.testing import (
        ZooKeeperServer,
        ZooKeeperStartError,
        ZooKeeperUnavailable,
        free_port,
    )

    tmp = Path(tempfile.mkdtemp(prefix="zktasks-bench-"))
    log_dir = tmp / "logs"
    log_dir.mkdir()
    zk = None
    monitor = None
    servers: dict[str, object] = {}
    drivers: dict[str, object] = {}
    ok = False
    try:
        zk = ZooKeeperServer(data_dir=tmp / "zookeeper", client_port=free_port())
        zk.start(timeout=60)
        os.environ["ZKTASKS_BENCH_HOSTS"] = zk.hosts
        os.environ["ZKTASKS_BENCH_ROOT"] = "/bench-unused"
        # The peers' servers start before Django: the database peer's settings need
        # PostgreSQL's port, and the Redis peers read their URL when imported.
        for kind in dict.fromkeys(peers.SYSTEMS[system][1] for system in systems):
            server = RedisServer(tmp) if kind == "redis" else PostgresServer(tmp)
            servers[kind] = server
            server.start()
            print(f"{kind} ({server.version}) on 127.0.0.1:{server.port}", flush=True)
        if "redis" in servers:
            os.environ["BENCH_REDIS_URL"] = servers["redis"].url
        if "postgres" in servers:
            os.environ["BENCH_PG_PORT"] = str(servers["postgres"].port)
            os.environ["DJANGO_SETTINGS_MODULE"] = "bench.peers.dbtasks_settings"
        import django

        django.setup()
        info = machine_info(zk)
        print(format_machine(info), flush=True)
        print(f"ZooKeeper at {zk.hosts}, data and logs in {tmp}", flush=True)
        print(f"jobs per throughput run: {args.jobs}; latency samples: {args.latency}",
              flush=True)
        monitor = Monitor(zk.hosts)
        warm = monitor.warm_zookeeper(2000 if args.quick else 5000)
        print(f"ZooKeeper warmed up in {warm:.1f}s", flush=True)
        if any(sc.kind == "zktasks" for sc in scenarios):
            warm_up_with_zktasks(zk, monitor, args, log_dir)
        rows = []
        sweep = len(args.submitters) > 1
        # A sweep runs the whole list once per count, so the systems of one count run
        # side by side in the same minutes.
        for submitters in args.submitters:
            if sweep:
                print(f"== {submitters} submitter thread(s)", flush=True)
            for sc in scenarios:
                if sc.kind != "queue":
                    rows.append(run_scenario(sc, zk, monitor, args, log_dir, submitters))
                    continue
                if sc.system not in drivers:
                    server = servers[peers.SYSTEMS[sc.system][1]]
                    drivers[sc.system] = peers.driver(sc.system, server)
                    info.setdefault("peers", {})[sc.system] = \
                        f"{drivers[sc.system].versions()}; {server.name} {server.version}"
                rows.append(run_queue_scenario(sc, drivers[sc.system], args, log_dir,
                                               submitters))
        info["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        mntr = zk.four_letter_word("mntr")
        for key in ("avg_fsynctime", "max_fsynctime", "cnt_fsynctime"):
            if found := re.search(rf"^zk_{key}\s+(\S+)", mntr, re.M):
                info[f"zk_{key}"] = float(found[1])
        print()
        print(format_machine(info))
        print(f"command:   .venv/bin/python bench/run.py {' '.join(sys.argv[1:])}".rstrip())
        if args.submitters != (1,):
            print(f"submitters: {', '.join(map(str, args.submitters))} threads in the "
                  "streaming phase (submit/s and e2e); backlog and latency from one loop")
        if info.get("peers"):
            print("peers:     " + "\n           ".join(
                f"{name}: {versions}" for name, versions in info["peers"].items()))
        zk_rows = [r for r in rows if r.system in OURS]
        matrix = [r for r in rows if r.matrix]
        print()
        if zk_rows:
            print(format_table(zk_rows, with_submitters(COLUMNS), left=4) if sweep
                  else format_table(zk_rows))
        if any(r.scenario.startswith("peer") for r in rows):
            print("\npeer-raw-kazoo = raw kazoo, batched multis, no task execution "
                  "(bench/peer.py): the ZooKeeper floor for the same transitions.")
        print("\ndetails: submit/s, ZooKeeper requests and CPU per submit with no worker "
              "running; requests and\nwrite txns per job while draining that backlog; CPU ms "
              "per job by process (streaming\nphase, then backlog drain); switches = context "
              "switches of the worker processes per\njob (streaming); runq wait = ms per job "
              "the worker processes' threads were\n"
              "runnable but waited for a CPU (streaming); idle % and steal % = the machine's "
              "idle CPU time\nand time its hypervisor gave to others, of all CPUs' time in "
              "the streaming phase; median\nlatency split into enqueued->started, "
              "started->finished, finished->waiter woke.")
        if zk_rows:
            print(format_table(zk_rows, with_submitters(DETAIL_COLUMNS) if sweep
                               else DETAIL_COLUMNS, left=1))
        ratios = ratio_rows(rows)
        if matrix:
            each = ("each at its system's default concurrency"
                    if args.defaults else "each running one job at a time (--one-at-a-time)")
            print(f"\npeer matrix: N worker processes, {each};\n"
                  "srv req/job and srv B in/job\n= requests and bytes received by the "
                  "server (ZooKeeper or Redis) per job in the streaming\nphase, until "
                  "every result was read once; PSS MB worker = peak PSS of one worker "
                  "process\nwith its children (task processes, prefork children, work "
                  "horses), sampled every\n0.5 s, the largest worker; server MB = PSS of "
                  "ZooKeeper, Redis or PostgreSQL after the\nscenario; idle % and steal % "
                  "as in the details above, for this row's streaming phase.")
            print(format_table(matrix, with_submitters(MATRIX_COLUMNS) if sweep
                               else MATRIX_COLUMNS, left=1))
        if ratios:
            print("\nzktasks / peer, same workload and worker count, same run (throughput: "
                  "above 1 = zktasks\nfaster; p50, p99, PSS: above 1 = zktasks slower or "
                  "bigger):")
            print(format_ratios(ratios, sweep))
        if args.profile:
            from bench.profile_summary import report

            for path in sorted(args.profile.glob("*.txt")):
                report(path, top=12)
        payload = {"machine": info, "jobs": args.jobs, "latency_samples": args.latency,
                   "submitters": list(args.submitters),
                   "rows": [asdict(r) for r in rows], "ratios": ratios}
        ok = True
    except ZooKeeperUnavailable as exc:
        print(f"bench: no ZooKeeper: {exc}", file=sys.stderr)
        return 2
    except ZooKeeperStartError as exc:
        # The message has the server's log path and tail.
        print(f"bench: {exc}\nbench: ZooKeeper did not start: fix what its log says (the "
              "Java or ZooKeeper install, memory, the temp dir's disk) and run again",
              file=sys.stderr)
        return 2
    except ServerMissing as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except peers.PeerMissing as exc:
        print(f"bench: {exc}; or leave the peer out with --only", file=sys.stderr)
        return 2
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        print("bench interrupted", file=sys.stderr)
        return 130
    finally:
        # A second Ctrl-C, SIGTERM or hang-up must not cut the cleanup short: Redis and
        # PostgreSQL would be left running (their watchdogs act only if this process
        # dies), and so would the workers until theirs noticed.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        stop_all()
        for drv in drivers.values():
            with contextlib.suppress(Exception):
                drv.close()
        for server in servers.values():
            try:
                server.stop()
            except Exception as exc:
                print(f"  ! stopping {server.name} failed: {exc!r}", file=sys.stderr)
        if monitor is not None:
            monitor.close()
        with contextlib.suppress(Exception):
            from zktasks.client import close_clients

            close_clients()
        if zk is not None:
            zk.stop()
        if ok and not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"bench: logs and ZooKeeper data kept in {tmp}", file=sys.stderr)
    # The matrix's servers are gone: failover and scale start their own. The cleanup
    # above ignored the signals; a harness started so would inherit SIG_IGN (exec keeps
    # it) and could not be stopped: put the handlers back first.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    try:
        code = finish(args, payload)
    except (KeyboardInterrupt, SystemExit):
        print("bench interrupted", file=sys.stderr)
        return 130
    return code


def finish(args, payload: dict) -> int:
    """Failover and scale (each its own harness and ZooKeeper), the targets table, the
    JSON; 1 if a harness reported a finding."""
    from bench import targets

    problems = []
    extra = Path(tempfile.mkdtemp(prefix="zktasks-bench-extra-"))
    try:
        if args.failover_trials:
            payload["failover"] = run_harness(
                "failover", [str(REPO / "bench" / "failover.py"), "--trials",
                             str(args.failover_trials)], extra / "failover.json", problems)
        if args.scale_jobs:
            jobs, heap_gb, note = scale_size(args.scale_jobs)
            if note:
                print(f"\n-- scale: {note}", flush=True)
            if jobs:
                payload["scale"] = run_harness(
                    "scale", ["-m", "bench.scale", "--jobs", str(jobs), "--heap",
                              f"{heap_gb}g", "--every", "30"], extra / "scale.json",
                    problems, out_flag="--out")
    finally:
        shutil.rmtree(extra, ignore_errors=True)
    found = targets.lines(payload["rows"], scale=payload.get("scale"),
                          failover=payload.get("failover"),
                          submitters=min(args.submitters))
    payload["targets"] = [asdict(line) for line in found]
    print("\nissue 6's targets, figures of this run (no-op jobs, 2 worker processes; "
          "scale and failover from\ntheir own harnesses after the matrix):")
    print(targets.format_lines(found))
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    for problem in problems:
        print(f"bench: {problem}", file=sys.stderr)
    return 1 if problems else 0


def run_harness(name: str, argv: list[str], out: Path, problems: list[str], *,
                out_flag: str = "--json") -> dict | None:
    """Run a bench harness in the foreground (its output goes on the bench's); its JSON.
    Ctrl-C reaches it with the bench (one process group): wait for it to clean up."""
    command = [sys.executable, *argv, out_flag, str(out)]
    shown = " ".join(a.removeprefix(f"{REPO}{os.sep}") for a in argv)
    print(f"\n-- {name}: python {shown}", flush=True)
    proc = subprocess.Popen(command, cwd=REPO)
    try:
        code = proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # SIGTERM to us: pass it on
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        raise
    if code:
        problems.append(f"{name} harness exited {code} (its output is above)")
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        problems.append(f"{name} harness wrote no figures")
        return None


def scale_size(jobs: int) -> tuple[int, int, str]:
    """(jobs, ZooKeeper heap in GB, a note) for a scale run this machine's memory holds:
    about SCALE_GB_PER_MILLION GB of heap per million pending jobs, plus SCALE_SPARE_GB."""
    def heap_for(n: int) -> int:
        return max(1, -(-n * SCALE_GB_PER_MILLION // 1_000_000))

    try:
        meminfo = Path("/proc/meminfo").read_text()
        free_gb = int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M)[1]) / 2**20
    except (OSError, TypeError):
        return jobs, heap_for(jobs), ""
    if heap_for(jobs) + SCALE_SPARE_GB <= free_gb:
        return jobs, heap_for(jobs), ""
    fits = int((free_gb - SCALE_SPARE_GB) / SCALE_GB_PER_MILLION * 1_000_000) // 10_000 * 10_000
    if fits < 10_000:
        return 0, 0, (f"skipped: {free_gb:.1f} GB of memory free, too little for a "
                      f"ZooKeeper holding a large backlog; run python -m bench.scale on a "
                      "machine with more")
    return fits, heap_for(fits), (f"{jobs:,} pending jobs need about {heap_for(jobs)} GB "
                                  f"of ZooKeeper heap and {free_gb:.1f} GB is free: "
                                  f"{fits:,} jobs instead")


if __name__ == "__main__":
    sys.exit(main())
