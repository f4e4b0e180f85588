"""The peers' servers on loopback: a throwaway Redis and a throwaway PostgreSQL.

Each one runs from a temp dir on a free port, in its own process group, and is stopped
(then killed) by `stop()`, which bench/run.py calls in a `finally`; a watchdog
(zktasks.testing.start_watchdog) kills the group if the bench dies without that (SIGKILL).
Both report their own counters, so that requests and bytes per job come from the server,
as ZooKeeper's do for zktasks.
"""

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

START_DEADLINE = 30.0


class ServerMissing(Exception):
    """A server binary is not installed; the message says how to install it."""


class ServerStartError(ServerMissing):
    """A server is installed but did not start; the message has its output and log."""


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def watchdog(pgid: int) -> subprocess.Popen | None:
    """Kill process group `pgid` if this interpreter dies without stopping it."""
    from zktasks.testing import start_watchdog

    # In the server's group, so that the group id stays ours while the watchdog lives
    # and a terminal's Ctrl-C or hang-up, sent to the bench's group, spares it.
    return start_watchdog(pgid)


def end_watchdog(dog: subprocess.Popen | None) -> None:
    """Once the group is gone: end the watchdog without letting it signal the group id
    (closing its stdin would; the id could be reused)."""
    if dog is None:
        return
    with contextlib.suppress(ProcessLookupError):
        dog.kill()
    dog.wait()
    with contextlib.suppress(OSError):
        dog.stdin.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pss_mb(pids: list[int]) -> float:
    """Proportional set size of these processes together (shared pages counted once)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
    return total / 1024


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    pids.append(int(entry.name))
    return pids


def _kill_group(popen: subprocess.Popen, dog: subprocess.Popen | None,
                deadline: float = 10.0) -> None:
    try:
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(deadline)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(10)
    finally:
        sweep_group(popen.pid, dog)


def sweep_group(pgid: int, dog: subprocess.Popen | None) -> None:
    """SIGKILL what is left of process group `pgid` (task processes, a child that outlived
    its parent), then end its watchdog. The watchdog is a member, and while it lives the
    group id cannot be reused, so the kill cannot reach another group."""
    if [pid for pid in group_pids(pgid) if dog is None or pid != dog.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    end_watchdog(dog)


class RedisServer:
    """redis-server with no persistence (no RDB, no AOF), on 127.0.0.1 and a free port."""

    name = "redis"

    def __init__(self, work_dir: Path):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise ServerMissing(
                "the Redis peers need redis-server: apt-get install -y redis-server "
                "(as root; Debian/Ubuntu), or put one on PATH")
        self.dir = work_dir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.popen: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None

    def start(self) -> None:
        self._log = open(self.dir / "redis.log", "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
             "--protected-mode", "yes"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            process_group=0)
        self.watchdog = watchdog(self.popen.pid)
        import redis

        self.client = redis.Redis.from_url(self.url)
        limit = time.monotonic() + START_DEADLINE
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if self.popen.poll() is not None or time.monotonic() > limit:
                    log = self.dir / "redis.log"
                    raise ServerStartError(
                        f"redis-server did not start within {START_DEADLINE:.0f}s (exit "
                        f"code {self.popen.poll()}); fix what its log says and run again; "
                        f"log {log}:\n{log_tail(log)}") from None
                time.sleep(0.05)
        self.version = self.client.info("server")["redis_version"]

    @property
    def pids(self) -> list[int]:
        return [self.popen.pid] if self.popen else []

    def reset(self) -> None:
        self.client.flushall()

    def counters(self) -> dict:
        stats = self.client.info("stats")
        return {"requests": stats["total_commands_processed"],
                "bytes_in": stats["total_net_input_bytes"],
                "bytes_out": stats["total_net_output_bytes"]}

    @staticmethod
    def own_requests(before: dict, after: dict) -> dict:
        # The INFO call that read `after` counts as one command; its reply as bytes out.
        return {"requests": after["requests"] - before["requests"] - 1,
                "bytes_in": after["bytes_in"] - before["bytes_in"],
                "bytes_out": after["bytes_out"] - before["bytes_out"]}

    def stop(self) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(Exception):
            self.client.close()
        _kill_group(self.popen, self.watchdog)
        self._log.close()
        self.popen = self.watchdog = None


class PostgresServer:
    """A throwaway PostgreSQL cluster (initdb, trust auth, fsync on) on a free port.

    PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres`
    user that Debian's package creates.
    """

    name = "postgres"

    def __init__(self, work_dir: Path):
        self.bin = self._find_bin()
        self.dir = work_dir / "postgres"
        self.data = self.dir / "data"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.user = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ServerMissing("running as root needs the `postgres` user "
                                    "(apt-get install -y postgresql)") from exc
            self.user = "postgres"
            shutil.chown(self.dir, "postgres")
            # The bench's temp dir (mode 0700) must be traversable by that user.
            os.chmod(work_dir, os.stat(work_dir).st_mode | 0o711)
        self.popen: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None

    @staticmethod
    def _find_bin() -> Path:
        for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
            if (root / "initdb").exists():
                return root
        found = shutil.which("initdb")
        if found:
            return Path(found).parent
        raise ServerMissing("the django-tasks-db peer needs PostgreSQL: apt-get install -y "
                            "postgresql (as root; Debian/Ubuntu)")

    def _as_owner(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", self.user, "--", *cmd] if self.user else cmd

    def _initdb(self) -> None:
        """Make the cluster; a failure says what initdb said and where its log is."""
        log = self.dir / "initdb.log"
        cmd = self._as_owner([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                              "-U", "bench", "-E", "UTF8", "--no-locale"])
        try:
            with open(log, "wb") as out:
                done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServerStartError(
                f"the django-tasks-db peer could not run {cmd[0]!r}: {exc}; install "
                f"PostgreSQL (apt-get install -y postgresql, as root) or leave the peer out "
                f"with --only; log {log}") from exc
        if done.returncode:
            raise ServerStartError(
                f"initdb exited with code {done.returncode}; fix what it says (a broken "
                f"PostgreSQL install: apt-get install --reinstall postgresql) or leave the "
                f"django-tasks-db peer out with --only; log {log}:\n{log_tail(log)}")

    def start(self) -> None:
        self._initdb()
        self._log = open(self.dir / "postgres.log", "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self._as_owner([str(self.bin / "postgres"), "-D", str(self.data),
                            "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
                            "-c", f"unix_socket_directories={self.dir}",
                            "-c", "max_connections=50"]),
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            process_group=0)
        self.watchdog = watchdog(self.popen.pid)
        limit = time.monotonic() + START_DEADLINE
        while True:
            ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p",
                                    str(self.port)], capture_output=True)
            if ready.returncode == 0:
                break
            if self.popen.poll() is not None or time.monotonic() > limit:
                log = self.dir / "postgres.log"
                raise ServerStartError(
                    f"postgres did not start within {START_DEADLINE:.0f}s (exit code "
                    f"{self.popen.poll()}); fix what its log says and run again; log "
                    f"{log}:\n{log_tail(log)}")
            time.sleep(0.1)
        self.version = subprocess.run([str(self.bin / "postgres"), "--version"],
                                      capture_output=True, text=True).stdout.strip()

    @property
    def pids(self) -> list[int]:
        return group_pids(self.popen.pid) if self.popen else []

    def stop(self) -> None:
        if self.popen is None:
            return
        # SIGINT is PostgreSQL's "fast shutdown": it ends the sessions and exits. Sent to
        # each member (runuser forwards no SIGINT), but not to the watchdog, which it
        # would end before its time.
        if self.popen.poll() is None:
            for pid in group_pids(self.popen.pid):
                if self.watchdog is None or pid != self.watchdog.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGINT)
        _kill_group(self.popen, self.watchdog)
        self._log.close()
        self.popen = self.watchdog = None
