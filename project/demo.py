"""Run the whole zktasks demo on this machine: what `make demo` starts.

It starts (or reuses) a ZooKeeper server, migrates the demo database, makes an
`admin` superuser with a fresh random password, starts two `manage.py runworker`
processes and `manage.py runserver`, submits the sample tasks of project/tasks.py,
prints where everything is, and waits. Ctrl-C (or SIGTERM) stops everything: the
site, then the workers (they drain: running jobs finish), then the ZooKeeper it
started. No child outlives it.

    .venv/bin/python project/demo.py [--no-wait]

--no-wait does everything, prints the summary, then shuts down and exits (0 when
every sample task ended as expected); the end-to-end test uses it.

Environment:
    ZKTASKS_DEMO_PORT     the site's port (default 8000, or a free one if taken)
    ZKTASKS_DEMO_ZK_PORT  ZooKeeper's client port (default 2181, or a free one if
                          taken by something else); a ZooKeeper already serving
                          there is reused
    ZKTASKS_DEMO_VAR      directory for the database, ZooKeeper data and logs
                          (default: var/ in the repository)
    DATABASE_URL          the database (default: SQLite in that directory)
"""

import argparse
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

if __name__ == "__main__" and not __package__:
    # Run as a script (python project/demo.py): import from the repository, not
    # from project/, whose settings.py and tasks.py would shadow other modules.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _here]
    sys.path.insert(0, str(REPO))

ZK_ROOT = "/zktasks-demo"
QUEUES = "default,emails"
WORKERS = ("worker-1", "worker-2")
ADMIN_USER = "admin"
DEFAULT_SITE_PORT = 8000
DEFAULT_ZK_PORT = 2181
SITE_TIMEOUT = 60.0
TASK_TIMEOUT = 30.0
DRAIN_TIMEOUT = 45.0  # runworker drains for up to 30 s by default

# The sample tasks: (label, task name, args, expected status).
SAMPLES = (
    ("add(2, 3)", "add", (2, 3), "SUCCESSFUL"),
    ("fibonacci(30)", "fibonacci", (30,), "SUCCESSFUL"),
    ("divide(1, 0)", "divide", (1, 0), "FAILED"),
    ("send_welcome('ada@example.com')", "send_welcome", ("ada@example.com",), "SUCCESSFUL"),
    ("slow(5)", "slow", (5,), None),  # not waited for: watch it in the dashboard
)


class Stop(Exception):
    """Ctrl-C or SIGTERM: shut everything down and exit 0."""


class DemoError(Exception):
    """The demo cannot go on; the message says why and where to look."""


def say(message: str = "") -> None:
    print(message, flush=True)


def shown(path: Path) -> str:
    """A path relative to the current directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the servers themselves: a port in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def zookeeper_serves(port: int) -> bool:
    """Whether a ZooKeeper answers on 127.0.0.1:port ("ruok", or "srvr" when only
    that four-letter word is whitelisted, as by default)."""
    from zktasks.testing import four_letter_word

    for word, answer in (("ruok", "imok"), ("srvr", "Zookeeper version")):
        try:
            if four_letter_word("127.0.0.1", port, word, timeout=1.0).startswith(answer):
                return True
        except OSError:
            return False
    return False


def env_port(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise DemoError(f"{name}={value!r} is not a TCP port number.")
    return int(value)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc (Linux)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


# Children die with the demo even when it is SIGKILLed (Linux: PR_SET_PDEATHSIG).
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int = os.getpid()) -> None:  # runs in the forked child
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the demo died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


class Child:
    """A manage.py subprocess in its own process group, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        try:
            # Own process group: a terminal's Ctrl-C reaches only the demo, which
            # then signals each child once (a second SIGTERM would stop a worker
            # without draining).
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (the worker's task processes too)."""
        if self.running() or group_members(self.proc.pid):
            # Safe after the leader is reaped: a group id is not reused while the
            # group has members.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def wait_for_group(self, timeout: float) -> None:
        """Give what the child started (task processes, multiprocessing's resource
        tracker) `timeout` seconds to exit after it, then kill what is left."""
        deadline = time.monotonic() + timeout
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill()

    def close(self) -> None:
        self._log.close()


class Demo:
    def __init__(self, *, no_wait: bool) -> None:
        self.no_wait = no_wait
        self.var = Path(os.environ.get("ZKTASKS_DEMO_VAR") or REPO / "var").resolve()
        self.log_dir = self.var / "logs"
        self.zk_dir = self.var / "zookeeper"
        self.zk_server = None  # a ZooKeeperServer when this demo started one
        self.zk_hosts = ""
        self.site_port = 0
        self.password = secrets.token_urlsafe(12)
        self.env: dict[str, str] = {}
        self.children: list[Child] = []
        self.django_ready = False
        self.problems: list[str] = []
        self.hurry = False

    # ---- start

    def start(self) -> None:
        self.var.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.start_zookeeper()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DEBUG": "1",
            "ZOOKEEPER_HOSTS": self.zk_hosts,
            "ZKTASKS_ROOT": ZK_ROOT,
            "PYTHONUNBUFFERED": "1",
        }
        self.env.setdefault("DATABASE_URL", f"sqlite:///{self.var / 'demo.sqlite3'}")
        self.migrate()
        self.site_port = self.pick_site_port()
        for name in WORKERS:
            self.spawn(name, "runworker", "--queues", QUEUES, "--concurrency", "2",
                       "--name", name)
        self.spawn("runserver", "runserver", f"127.0.0.1:{self.site_port}", "--noreload")
        say(f"==> Started {', '.join(WORKERS)} and the site "
            f"(logs in {shown(self.log_dir)}/)")
        self.setup_django()
        self.create_admin()
        self.wait_for_site()
        self.run_samples()

    def start_zookeeper(self) -> None:
        from zktasks.testing import (
            ZooKeeperServer,
            ZooKeeperStartError,
            ZooKeeperUnavailable,
            free_port,
        )

        requested = env_port("ZKTASKS_DEMO_ZK_PORT")
        port = requested or DEFAULT_ZK_PORT
        if zookeeper_serves(port):
            self.zk_hosts = f"127.0.0.1:{port}"
            say(f"==> Reusing the ZooKeeper that already serves {self.zk_hosts}")
            return
        if not port_free(port):
            if requested:
                raise DemoError(
                    f"ZKTASKS_DEMO_ZK_PORT={port} is taken by something that is not ZooKeeper."
                )
            port = free_port()
        say(f"==> Starting ZooKeeper on 127.0.0.1:{port} (data in {shown(self.zk_dir)})")
        began = time.monotonic()
        server = ZooKeeperServer(data_dir=self.zk_dir, client_port=port)
        self.zk_server = server
        try:
            server.start(timeout=60.0)
        except ZooKeeperUnavailable as exc:
            raise DemoError(f"ZooKeeper is not installed.\n{exc}") from None
        except ZooKeeperStartError as exc:
            raise DemoError(str(exc)) from None
        self.zk_hosts = server.hosts
        say(f"    ZooKeeper serves {self.zk_hosts} ({time.monotonic() - began:.1f}s)")

    def migrate(self) -> None:
        say("==> Migrating the database")
        log_path = self.log_dir / "migrate.log"
        with open(log_path, "wb") as log:
            done = subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, check=False,
            )
        if done.returncode != 0:
            raise DemoError(
                f"manage.py migrate failed (exit code {done.returncode}); "
                f"{shown(log_path)}:\n{log_tail(log_path)}"
            )

    def pick_site_port(self) -> int:
        from zktasks.testing import free_port

        requested = env_port("ZKTASKS_DEMO_PORT")
        if requested:
            if not port_free(requested):
                raise DemoError(f"ZKTASKS_DEMO_PORT={requested} is taken.")
            return requested
        return DEFAULT_SITE_PORT if port_free(DEFAULT_SITE_PORT) else free_port()

    def spawn(self, name: str, *args: str) -> None:
        child = Child(name, list(args), self.env, self.log_dir)
        self.children.append(child)

    def setup_django(self) -> None:
        os.environ.update(self.env)
        # This process only submits and reads jobs: keep its zktasks log quiet.
        os.environ.setdefault("ZKTASKS_LOG_LEVEL", "WARNING")
        import django

        django.setup()
        self.django_ready = True

    def create_admin(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db import connections

        try:
            user_model = get_user_model()
            user, _ = user_model.objects.get_or_create(
                username=ADMIN_USER, defaults={"email": "admin@example.com"}
            )
            user.is_staff = user.is_superuser = user.is_active = True
            user.set_password(self.password)
            user.save()
        finally:
            connections.close_all()

    def wait_for_site(self) -> None:
        url = f"http://127.0.0.1:{self.site_port}/"
        # No proxy: http_proxy in the environment must not capture 127.0.0.1.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + SITE_TIMEOUT
        runserver = self.child("runserver")
        last = "no answer"
        while True:
            self.check_children()
            try:
                with opener.open(url, timeout=5) as response:
                    if response.status == 200:
                        say(f"==> The site answers at {url}")
                        return
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            if time.monotonic() >= deadline:
                raise DemoError(
                    f"{url} did not answer 200 within {SITE_TIMEOUT:.0f}s (last: {last}); "
                    f"{shown(runserver.log_path)}:\n{log_tail(runserver.log_path)}"
                )
            time.sleep(0.25)

    def run_samples(self) -> None:
        from project import tasks
        from zktasks import ZkTasksError

        say("==> Submitting the sample tasks (project/tasks.py)")
        width = max(len(label) for label, *_ in SAMPLES)
        submitted = []
        try:
            for label, name, args, expected in SAMPLES:
                submitted.append((label, getattr(tasks, name).submit(*args), expected))
        except ZkTasksError as exc:
            raise DemoError(f"cannot submit tasks to ZooKeeper {self.zk_hosts}: {exc}") from exc
        for label, result, expected in submitted:
            if expected is None:
                say(f"    {label:<{width}}  {result.status.name:<10}  submitted; it takes a "
                    "while: watch it in the dashboard")
                continue
            try:
                result.wait(timeout=TASK_TIMEOUT)
            except TimeoutError:
                self.problems.append(f"{label} did not finish within {TASK_TIMEOUT:.0f}s")
                say(f"    {label:<{width}}  {result.status.name:<10}  did not finish within "
                    f"{TASK_TIMEOUT:.0f}s: see {shown(self.log_dir)}/worker-*.log")
                continue
            except ZkTasksError as exc:
                self.problems.append(f"{label}: {exc}")
                say(f"    {label:<{width}}  ERROR       {exc}")
                continue
            status = result.status.name
            say(f"    {label:<{width}}  {status:<10}  {self.outcome(result)}")
            if status != expected:
                self.problems.append(f"{label} ended {status}, expected {expected}")

    @staticmethod
    def outcome(result) -> str:
        where = ""
        if result.worker_ids:
            where = f" on {result.worker_ids[-1]}"
        if result.started_at and result.finished_at:
            seconds = (result.finished_at - result.started_at).total_seconds()
            where += f" in {seconds:.2f}s"
        if result.status.name == "SUCCESSFUL":
            return f"-> {result.return_value!r}  ({where.strip()})"
        if result.errors:
            error = result.errors[-1]
            lines = [line for line in error.traceback.strip().splitlines() if line.strip()]
            last = lines[-1] if lines else error.exception_class_path
            expected = " (fails on purpose)" if "ZeroDivisionError" in last else ""
            return f"{last}{expected}  ({where.strip()})"
        return f"({where.strip()})"

    # ---- run

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def check_children(self) -> None:
        for child in self.children:
            if not child.running():
                raise DemoError(
                    f"{child.name} exited with code {child.proc.returncode}; "
                    f"{shown(child.log_path)}:\n{log_tail(child.log_path)}"
                )
        server = self.zk_server
        if server is not None and not server.is_running:
            raise DemoError(f"ZooKeeper exited; {shown(server.log_path)}:\n{server.log_tail()}")

    def print_box(self) -> None:
        site = f"http://127.0.0.1:{self.site_port}/"
        if self.zk_server is not None:
            zk = f"{self.zk_hosts} (started by the demo, data in {shown(self.zk_dir)})"
        else:
            zk = f"{self.zk_hosts} (already running; reused)"
        logs = f"{shown(self.log_dir)}/*.log ({', '.join(c.name for c in self.children)})"
        # The demo's own settings: DEBUG=1 gives project/settings.py its demo SECRET_KEY
        # (so the signing key matches the workers'), and a port other than the default.
        shell = "DEBUG=1 .venv/bin/python manage.py zktasks status"
        if self.zk_hosts != "127.0.0.1:2181":  # project/settings.py's default
            shell = f"ZOOKEEPER_HOSTS={self.zk_hosts} {shell}"
        rows = [
            "zktasks demo is running",
            "",
            f"Site:       {site}",
            f"Dashboard:  {site}admin/zktasks/",
            f"Schedules:  {site}admin/zktasks/schedules/ (heartbeat, every 30 s)",
            f"Shell:      {shell}",
            f"Admin:      user {ADMIN_USER}, password {self.password}",
            f"ZooKeeper:  {zk}",
            f"Tree root:  {ZK_ROOT}",
            f"Logs:       {logs}",
        ]
        if self.zk_server is not None:
            rows.append(f"            ZooKeeper: {shown(self.zk_server.log_path)}")
        rows += ["", "Ctrl-C stops everything."]
        width = max(len(row) for row in rows)
        say()
        say("+" + "-" * (width + 2) + "+")
        for row in rows:
            say(f"| {row:<{width}} |")
        say("+" + "-" * (width + 2) + "+")
        say()

    def wait(self) -> None:
        while True:
            self.check_children()
            time.sleep(1.0)

    # ---- stop

    def on_signal_while_stopping(self, signum, frame) -> None:
        if not self.hurry:
            self.hurry = True
            print("\nStopping at once (the workers stop without draining).", flush=True)

    def shutdown(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.on_signal_while_stopping)
        try:
            self._shutdown()
        finally:
            # Whatever happened above: no child outlives the demo.
            for child in self.children:
                child.kill()
                child.close()
            if self.zk_server is not None:
                self.zk_server.kill()

    def _shutdown(self) -> None:
        if not self.children and self.zk_server is None:
            return
        say("==> Stopping")
        if self.django_ready:
            from zktasks.client import close_clients

            # Our own ZooKeeper session first, so it does not retry against a
            # server that is going away.
            with contextlib.suppress(Exception):
                close_clients()
        site = [c for c in self.children if c.name == "runserver"]
        workers = [c for c in self.children if c.name != "runserver"]
        for child in site:
            child.signal(signal.SIGINT)  # runserver's own Ctrl-C: exits 0
        self.wait_for(site, 10.0)
        for child in workers:
            child.signal(signal.SIGTERM)
        if workers:
            say(f"    {', '.join(c.name for c in workers)} draining (running jobs finish; "
                "Ctrl-C again to stop at once)")
        self.wait_for(workers, DRAIN_TIMEOUT, hurry_signal=signal.SIGTERM)
        for child in self.children:
            if child.running():
                say(f"    {child.name} did not stop; killing it")
            child.wait_for_group(0.0 if self.hurry else 5.0)
            code = child.proc.returncode
            if code is None:
                how = "still running after SIGKILL"
            elif code < 0:
                how = f"killed by {signal.Signals(-code).name}"
            else:
                how = f"exit code {code}"
            say(f"    stopped {child.name} (pid {child.pid}), {how}")
        if self.zk_server is not None:
            self.zk_server.stop()
            say(f"    stopped ZooKeeper {self.zk_hosts}")
        elif self.zk_hosts:
            say(f"    left the reused ZooKeeper {self.zk_hosts} running")

    def wait_for(self, children: list[Child], timeout: float, hurry_signal=None) -> None:
        deadline = time.monotonic() + timeout
        hurried = False
        while any(c.running() for c in children) and time.monotonic() < deadline:
            if self.hurry and not hurried:
                hurried = True
                if hurry_signal is not None:
                    for child in children:
                        child.signal(hurry_signal)  # the second signal: stop now
                deadline = min(deadline, time.monotonic() + 5.0)
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="demo.py", description="Run the zktasks demo (ZooKeeper, workers, site)."
    )
    parser.add_argument("--no-wait", action="store_true",
                        help="shut down and exit once everything ran, instead of waiting "
                             "for Ctrl-C")
    args = parser.parse_args(argv)

    def on_signal(signum, frame):
        raise Stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    demo = Demo(no_wait=args.no_wait)
    code = 0
    try:
        demo.start()
        demo.print_box()
        if args.no_wait:
            say("--no-wait: stopping everything now.")
        else:
            demo.wait()
    except Stop as exc:
        say(f"\n{exc}: stopping everything.")
    except DemoError as exc:
        print(f"\ndemo: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        demo.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0 and args.no_wait and demo.problems:
        print("demo: " + "; ".join(demo.problems), file=sys.stderr, flush=True)
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
