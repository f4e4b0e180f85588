"""Start real Apache ZooKeeper servers for tests, the demo and benchmarks.

Run a standalone server (:class:`ZooKeeperServer`) or a loopback quorum
(:class:`ZooKeeperEnsemble`) from a local ZooKeeper install, e.g. Debian's
``zookeeper`` package, or, where a Docker engine answers, the official image via
testcontainers (:func:`start_zookeeper`). Nothing here is a mock: every server
is a JVM that clients reach over TCP, so crashes, restarts and pauses behave the
way they do in production.

Use it as a pytest plugin (``-p zktasks.testing``; installed, it loads itself) for
the fixtures ``zookeeper``, ``zk_hosts``, ``zk_root``, ``zk_client``,
``zk_ensemble``, ``zk_settings`` and ``zk_worker``, or from the command line::

    python -m zktasks.testing serve --port 2181

This module must stay importable on its own: it imports nothing else of zktasks
and no Django settings.
"""

import atexit
import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

log = logging.getLogger(__name__)

__all__ = [
    "DockerZooKeeper",
    "TlsFiles",
    "ZooKeeperEnsemble",
    "ZooKeeperInstall",
    "ZooKeeperPortInUse",
    "ZooKeeperServer",
    "ZooKeeperStartError",
    "ZooKeeperUnavailable",
    "delete_tree",
    "docker_available",
    "find_zookeeper",
    "four_letter_word",
    "free_port",
    "free_ports",
    "main",
    "make_tls_files",
    "start_zookeeper",
]

INSTALL_COMMAND = "apt-get install -y zookeeper"
ENV_JAVA = "ZKTASKS_JAVA"
ENV_CLASSPATH = "ZKTASKS_ZOOKEEPER_CLASSPATH"
ENV_AUTO_INSTALL = "ZKTASKS_ZOOKEEPER_INSTALL"
ENV_DOCKER = "ZKTASKS_TEST_DOCKER"
DEBIAN_JAVA_DIR = Path("/usr/share/java")
DOCKER_IMAGE = "zookeeper:3.9"

# Serial GC keeps each JVM to a handful of threads: fault tests run several
# members on small CI machines, and ZooKeeper's heap needs are tiny.
DEFAULT_JVM_OPTIONS: tuple[str, ...] = ("-Xmx512m", "-XX:+UseSerialGC")

_POLL_INTERVAL = 0.05
_MODE_RE = re.compile(r"^Mode: (\w+)", re.MULTILINE)


class ZooKeeperUnavailable(RuntimeError):
    """No usable ZooKeeper install (jars or Java) on this machine."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"{reason}\n"
            f"Install ZooKeeper with: {INSTALL_COMMAND}   (Debian/Ubuntu, as root;"
            " it also pulls in a Java runtime). The server needs Java 11 or newer.\n"
            f"Or point {ENV_CLASSPATH} at the ZooKeeper jars (os.pathsep-separated,"
            f" 'dir/*' allowed) and {ENV_JAVA} at a java binary."
        )
        self.reason = reason


class ZooKeeperStartError(RuntimeError):
    """A ZooKeeper process exited or did not serve in time; the message has its log tail."""


class ZooKeeperPortInUse(ZooKeeperStartError):
    """The client port was taken by another process before the server bound it."""


# --------------------------------------------------------------------------- install


@dataclass(frozen=True)
class ZooKeeperInstall:
    """Where ZooKeeper lives: the java binary and the classpath to run it with."""

    java: str
    classpath: tuple[str, ...]
    java_version: int  # major version; 0 when `java -version` was unparsable
    origin: str

    def command(
        self,
        main_class: str,
        config_file: Path,
        *,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        properties: Mapping[str, str] | None = None,
    ) -> list[str]:
        props = [f"-D{key}={value}" for key, value in (properties or {}).items()]
        return [
            self.java,
            *jvm_options,
            *props,
            "-cp",
            os.pathsep.join(self.classpath),
            main_class,
            str(config_file),
        ]


_found: dict[tuple[str | None, ...], ZooKeeperInstall] = {}
_find_lock = threading.Lock()
_apt_attempted = False


def find_zookeeper() -> ZooKeeperInstall:
    """Locate java and the ZooKeeper classpath, installing the Debian package if allowed.

    The install happens only when nothing was configured by hand, we are root on
    Debian/Ubuntu with apt-get, and ZKTASKS_ZOOKEEPER_INSTALL is not "0".
    """
    overrides = (
        os.environ.get(ENV_JAVA),
        os.environ.get(ENV_CLASSPATH),
        os.environ.get("ZOOKEEPER_HOME"),
    )
    global _apt_attempted
    with _find_lock:
        if overrides in _found:
            return _found[overrides]
        try:
            install = _locate()
        except ZooKeeperUnavailable as exc:
            # One attempt per process: every server start would otherwise rerun apt.
            if any(overrides) or _apt_attempted or not _may_apt_install():
                raise
            _apt_attempted = True
            _apt_install(exc.reason)
            install = _locate()
        log.debug("using ZooKeeper from %s with %s", install.origin, install.java)
        _found[overrides] = install
        return install


def _locate() -> ZooKeeperInstall:
    classpath, origin = _find_classpath()
    java = _find_java()
    version = _java_major_version(java)
    if 0 < version < 11:
        raise ZooKeeperUnavailable(f"{java} is Java {version}; ZooKeeper needs Java 11+.")
    return ZooKeeperInstall(java=java, classpath=classpath, java_version=version, origin=origin)


def _find_java() -> str:
    if override := os.environ.get(ENV_JAVA):
        if not os.access(override, os.X_OK):
            raise ZooKeeperUnavailable(f"{ENV_JAVA}={override} is not an executable.")
        return override
    if java_home := os.environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    if found := shutil.which("java"):
        return found
    raise ZooKeeperUnavailable("No java executable found (PATH, JAVA_HOME).")


def _java_major_version(java: str) -> int:
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ZooKeeperUnavailable(f"Cannot run {java} -version: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not match:
        log.warning("cannot tell the Java version from %r", done.stderr[:200])
        return 0
    major = int(match.group(1))
    # Java 8 and older report themselves as 1.x.
    return int(match.group(2) or 0) if major == 1 else major


def _find_classpath() -> tuple[tuple[str, ...], str]:
    if override := os.environ.get(ENV_CLASSPATH):
        entries = tuple(entry for entry in override.split(os.pathsep) if entry)
        missing = [e for e in entries if not e.endswith("*") and not os.path.exists(e)]
        if not entries or missing:
            raise ZooKeeperUnavailable(f"{ENV_CLASSPATH} names missing paths: {missing}")
        return entries, f"${ENV_CLASSPATH}"
    if home := os.environ.get("ZOOKEEPER_HOME"):
        # An upstream binary tarball: every jar, logback included, sits in lib/.
        lib = Path(home) / "lib"
        if not any(lib.glob("zookeeper-*.jar")):
            raise ZooKeeperUnavailable(f"ZOOKEEPER_HOME={home} has no lib/zookeeper-*.jar.")
        return (f"{lib}/*",), f"ZOOKEEPER_HOME={home}"
    jar = DEBIAN_JAVA_DIR / "zookeeper.jar"
    if not jar.is_file():
        raise ZooKeeperUnavailable(f"ZooKeeper is not installed: {jar} does not exist.")
    # Debian's jar names its dependencies in its manifest Class-Path, so the JVM
    # finds them itself. Debian does not install all of them (jline, which only
    # the CLI uses, is absent), so a gap is worth a warning, not a refusal: a
    # server that really lacks a class dies at start with the error in its log.
    missing = [dep for dep in _manifest_class_path(jar) if not os.path.exists(dep)]
    if missing := [dep for dep in missing if not Path(dep).name.startswith("jline")]:
        log.warning("%s lists missing jars in its manifest: %s", jar, ", ".join(missing))
    # The manifest carries no SLF4J binding, so without one the server logs
    # nothing at all; log4j 1.2 is a dependency of Debian's libzookeeper-java.
    classpath = [str(jar)]
    # The manifest also leaves out jars its Netty connection factory (TLS) loads:
    # without netty-codec every TLS connection fails with NoClassDefFoundError
    # io/netty/handler/codec/ByteToMessageDecoder. Debian's libnetty-java has them.
    classpath += [str(p) for p in (DEBIAN_JAVA_DIR / f"netty-{name}.jar"
                                   for name in ("codec", "resolver")) if p.is_file()]
    log4j = [DEBIAN_JAVA_DIR / "slf4j-log4j12.jar", DEBIAN_JAVA_DIR / "log4j-1.2.jar"]
    if all(p.is_file() for p in log4j):
        classpath += map(str, log4j)
    elif (DEBIAN_JAVA_DIR / "slf4j-simple.jar").is_file():
        classpath.append(str(DEBIAN_JAVA_DIR / "slf4j-simple.jar"))
    else:
        log.warning("no SLF4J binding in %s: ZooKeeper server logs will be empty", DEBIAN_JAVA_DIR)
    return tuple(classpath), str(DEBIAN_JAVA_DIR)


def _manifest_class_path(jar: Path) -> list[str]:
    try:
        with zipfile.ZipFile(jar) as archive:
            manifest = archive.read("META-INF/MANIFEST.MF").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return []
    # Manifest lines wrap at 72 bytes with a one-space continuation.
    unwrapped = manifest.replace("\r\n", "\n").replace("\n ", "")
    for line in unwrapped.splitlines():
        if line.startswith("Class-Path:"):
            return line.removeprefix("Class-Path:").split()
    return []


def _may_apt_install() -> bool:
    return (
        os.environ.get(ENV_AUTO_INSTALL, "1") != "0"
        and os.geteuid() == 0
        and Path("/etc/debian_version").exists()
        and shutil.which("apt-get") is not None
    )


def _apt_install(reason: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Parallel test workers may race for the dpkg lock; wait rather than fail.
    lock_wait = ["-o", "DPkg::Lock::Timeout=300"]
    commands = (
        ["apt-get", *lock_wait, "update"],
        ["apt-get", *lock_wait, "install", "-y", "zookeeper"],
    )
    message = f"{reason} Installing it: apt-get update && {INSTALL_COMMAND}"
    log.warning("%s", message)
    print(f"zktasks.testing: {message}", file=sys.stderr, flush=True)
    for command in commands:
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ZooKeeperUnavailable(
                f"{reason} `{' '.join(command)}` failed with exit code {done.returncode}."
            )


# --------------------------------------------------------------------------- ports


_handed_out: set[int] = set()
_ports_lock = threading.Lock()
# Ports handed out are also claimed on disk, one file per port holding the claimant's
# pid, so that processes picking ports at once (`make test` runs two pytest processes;
# the bench's and chaos harness's children pick their own) never hand out the same one:
# a port is free for bind() between its pick and the JVM binding it, and while a server
# that keeps its port is restarted. A claim whose process is gone is taken over.
_CLAIMS_DIR = Path(tempfile.gettempdir()) / f"zktasks-ports-{os.getuid()}"
_claimed: list[Path] = []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _claim(port: int, *, again: bool = True) -> bool:
    """Claim `port` for this process among every process using this module; False if
    a live process (this one included) holds it."""
    path = _CLAIMS_DIR / str(port)
    try:
        _CLAIMS_DIR.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:  # no usable temp dir: this process's own set still applies
        log.debug("cannot claim port %d on disk: %s", port, exc)
        return True
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            owner = int(path.read_text())
        except (OSError, ValueError):  # being written right now, or just removed
            return False
        if owner == os.getpid() or _pid_alive(owner) or not again:
            return False
        with contextlib.suppress(OSError):
            path.unlink()  # a claim left by a process that is gone
        return _claim(port, again=False)
    except OSError as exc:  # no usable temp dir: this process's own set still applies
        log.debug("cannot claim port %d on disk: %s", port, exc)
        return True
    with os.fdopen(fd, "w") as claim:
        claim.write(str(os.getpid()))
    _claimed.append(path)
    return True


@atexit.register
def _release_claims() -> None:
    pid = str(os.getpid())
    for path in _claimed:
        with contextlib.suppress(OSError, ValueError):
            if path.read_text() == pid:  # not a forked child's copy of the list
                path.unlink()


def free_port() -> int:
    """Return a loopback TCP port that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Return `count` distinct free loopback ports, never one handed out before here or
    claimed by another live process using this module."""
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        with _ports_lock:
            # Keeping every probe socket bound until all are picked is what makes
            # the kernel hand out distinct ports; the set stops a port from being
            # reused by a server of ours that has not bound it yet.
            while len(ports) < count:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
                if port not in _handed_out:
                    _handed_out.add(port)
                    if _claim(port):
                        ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def four_letter_word(host: str, port: int, word: str, timeout: float = 2.0) -> str:
    """Send a four-letter command such as "srvr" and return the server's answer."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(word.encode("ascii"))
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _mode(host: str, port: int, timeout: float = 1.0) -> str | None:
    """The server's "Mode:" (standalone/leader/follower), or None while it does not serve."""
    try:
        # "ruok" answers "imok" before the server serves; only "srvr" tells.
        answer = four_letter_word(host, port, "srvr", timeout=timeout)
    except OSError:
        return None
    match = _MODE_RE.search(answer)
    return match.group(1) if match else None


def _wait_until(
    condition: Callable[[], bool], timeout: float, *, check: Callable[[], None] | None = None
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_INTERVAL)


# --------------------------------------------------------------------------- cleanup


_running: set["ZooKeeperServer"] = set()
_owned_dirs: set[Path] = set()
_registry_lock = threading.Lock()


@atexit.register
def _cleanup_at_exit() -> None:
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.kill()
    for path in list(_owned_dirs):
        shutil.rmtree(path, ignore_errors=True)


# If this interpreter dies without running atexit (SIGKILL, a CI timeout), the
# JVM would outlive it and keep its port. A tiny watchdog in the server's process
# group notices our end of its stdin pipe closing and kills the whole group.
_WATCHDOG = (
    "import os, signal, sys\n"
    "sys.stdin.buffer.read()\n"
    "try:\n"
    "    os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "except OSError:\n"
    "    pass\n"
)


def start_watchdog(pgid: int, *, in_group: bool = True) -> subprocess.Popen[bytes] | None:
    """Kill process group `pgid` when this interpreter dies (its stdin pipe closes).

    In the group by default; `in_group=False` keeps it out of reach of signals sent to
    the group (SIGSTOP in fault tests).
    """
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(pgid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **({"process_group": pgid} if in_group else {}),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        # The group vanishes when the JVM died at once; start() reports that.
        log.debug("no watchdog for process group %s: %s", pgid, exc)
        return None


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS on loopback: a CA both sides trust, the server's key and
    certificate in one file (ZooKeeper's PEM key store), and a client's pair."""

    ca: Path
    server: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: str | Path, *, days: int = 2) -> TlsFiles:
    """Make a throw-away CA and certificates for 127.0.0.1 / localhost with openssl.

    The server's and the client's certificates are each good for both ends (TLS server
    and client authentication), which is what ZooKeeper's mutual TLS checks.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is needed to make test certificates: "
                           "apt-get install -y openssl")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        done = subprocess.run([openssl, *args], cwd=d, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", "-days", str(days), "-subj", "/CN=zktasks test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (d / "leaf.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                "extendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN=zktasks test {name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", str(days),
            "-extfile", "leaf.ext")
    (d / "server.pem").write_bytes((d / "server.key").read_bytes()
                                   + (d / "server.crt").read_bytes())
    return TlsFiles(ca=d / "ca.pem", server=d / "server.pem",
                    client_cert=d / "client.crt", client_key=d / "client.key")


# --------------------------------------------------------------------------- server

_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1} - %m%n
"""

_LOGBACK_XML = """\
<configuration>
  <appender name="CONSOLE" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="CONSOLE"/></root>
</configuration>
"""


class ZooKeeperServer:
    """One server process (standalone, or a member of an ensemble).

    The JVM runs in its own process group with stdout/stderr, which carry its
    log, appended to ``data_dir/zookeeper.log``. Port and data dir stay the same
    across stop/start, so data written before a restart is there after it.
    """

    def __init__(
        self,
        *,
        data_dir: str | Path | None = None,
        client_port: int | None = None,
        tick_time_ms: int = 200,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = 60000,
        init_limit: int = 20,
        sync_limit: int = 10,
        server_id: int | None = None,
        peers: Mapping[int, tuple[int, int]] | None = None,
        extra_config: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        install: ZooKeeperInstall | None = None,
        tls: TlsFiles | None = None,
        client_auth: str = "need",
    ) -> None:
        """Configure, but do not start, a server.

        ``peers`` maps each ensemble member's id to its (quorum, election) ports
        on 127.0.0.1; with it, ``server_id`` is this member's id. Session
        timeouts may go down to 2 * ``tick_time_ms`` unless
        ``min_session_timeout_ms`` says otherwise. ``extra_config`` lines go
        into zoo.cfg last and win.

        With ``tls``, the server also listens for TLS clients on ``secure_port``
        (``secure_hosts``), with ``client_auth`` "need" (clients must show a
        certificate the CA signed), "want" or "none". The plain port stays open: the
        readiness probe speaks "srvr" on it.
        """
        if peers and server_id not in peers:
            raise ValueError(f"server_id {server_id!r} is not among peers {sorted(peers)}")
        if data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="zktasks-zk-"))
            self._owns_data_dir = True
            with _registry_lock:
                _owned_dirs.add(self.data_dir)
        else:
            self.data_dir = Path(data_dir).resolve()
            self._owns_data_dir = False
        self._auto_port = client_port is None
        self._port = free_port() if client_port is None else client_port
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.init_limit = init_limit
        self.sync_limit = sync_limit
        self.server_id = server_id
        self.peers = dict(peers or {})
        self.extra_config = dict(extra_config or {})
        self.tls = tls
        self.client_auth = client_auth
        self._secure_port = free_port() if tls else None
        self.jvm_options = tuple(jvm_options)
        self._install = install
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._ever_served = False
        self._paused = False
        self._lock = threading.RLock()

    # ---- addresses and files

    @property
    def port(self) -> int:
        return self._port

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def secure_port(self) -> int | None:
        return self._secure_port

    @property
    def secure_hosts(self) -> str | None:
        """The TLS address (with ``tls``), as a client lists it in HOSTS."""
        return None if self._secure_port is None else f"127.0.0.1:{self._secure_port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """True while the process exists, even if it is paused or not serving yet."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def is_paused(self) -> bool:
        return self._paused and self.is_running

    def mode(self, timeout: float = 1.0) -> str | None:
        """What "srvr" reports: "standalone", "leader", "follower", or None if not serving."""
        return _mode("127.0.0.1", self._port, timeout)

    def four_letter_word(self, word: str, timeout: float = 2.0) -> str:
        return four_letter_word("127.0.0.1", self._port, word, timeout)

    def config(self) -> dict[str, str]:
        """The zoo.cfg settings this server starts with."""
        cfg = {
            "tickTime": str(self.tick_time_ms),
            "initLimit": str(self.init_limit),
            "syncLimit": str(self.sync_limit),
            "dataDir": str(self.data_dir),
            "clientPort": str(self._port),
            "clientPortAddress": "127.0.0.1",
            "maxSessionTimeout": str(self.max_session_timeout_ms),
            # Tests and benchmarks open many sessions from one address; the
            # default cap of 60 per IP would refuse them.
            "maxClientCnxns": "0",
            "4lw.commands.whitelist": "*",
            "admin.enableServer": "false",
            "autopurge.purgeInterval": "0",
        }
        if self.min_session_timeout_ms is not None:
            cfg["minSessionTimeout"] = str(self.min_session_timeout_ms)
        for sid, (quorum_port, election_port) in sorted(self.peers.items()):
            cfg[f"server.{sid}"] = f"127.0.0.1:{quorum_port}:{election_port}"
        if self.tls is not None:
            # ZooKeeper's TLS needs its Netty connection factory; keys it does not know
            # become system properties (zookeeper.ssl.*), as its SSL guide sets them.
            cfg.update({
                "secureClientPort": str(self._secure_port),
                "secureClientPortAddress": "127.0.0.1",
                "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
                "ssl.keyStore.location": str(self.tls.server),
                "ssl.keyStore.type": "PEM",
                "ssl.trustStore.location": str(self.tls.ca),
                "ssl.trustStore.type": "PEM",
                "ssl.clientAuth": self.client_auth,
            })
        cfg.update(self.extra_config)
        return cfg

    def log_tail(self, lines: int = 60) -> str:
        """The last lines the current (or last) run of the process wrote."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # ---- lifecycle

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> Self:
        """Spawn the JVM (if not running) and, with ``wait``, return once it serves.

        An ensemble member serves only once a quorum of its peers runs, so
        :class:`ZooKeeperEnsemble` spawns all members with ``wait=False`` first.
        """
        with self._lock:
            if not self.is_running:
                self._spawn()
        if not wait:
            return self
        try:
            self.wait_until_serving(timeout)
        except ZooKeeperPortInUse:
            self.kill()
            # An auto-picked port can be grabbed by someone else between
            # free_port() and the JVM binding it; pick another on first start.
            if not (self._auto_port and not self._ever_served and not self.peers):
                raise
            log.info("port %s was taken meanwhile; retrying on another", self._port)
            self._port = free_port()
            if self._secure_port is not None:  # either port may have been the one
                self._secure_port = free_port()
            return self.start(timeout, wait=wait)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_until_serving(self, timeout: float = 30.0) -> None:
        """Block until "srvr" reports a mode; raise ZooKeeperStartError if it exits or times out."""

        def check() -> None:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                tail = self.log_tail()
                error = (
                    ZooKeeperPortInUse if "Address already in use" in tail else ZooKeeperStartError
                )
                raise error(
                    f"ZooKeeper {self.hosts} exited (code {code}) before serving. "
                    f"Log {self.log_path}:\n{tail}"
                )

        if not _wait_until(self._serves_here, timeout, check=check):
            raise ZooKeeperStartError(
                f"ZooKeeper {self.hosts} did not serve within {timeout:.0f}s. "
                f"Log {self.log_path}:\n{self.log_tail()}"
            )
        self._ever_served = True

    def _serves_here(self) -> bool:
        if self.mode() is None:
            return False
        # Another server already on our port would answer "srvr" just the same
        # while our JVM fails to bind; its dataDir gives it away.
        try:
            conf = self.four_letter_word("conf", timeout=1.0)
        except OSError:
            return False
        served = re.search(r"^dataDir=(.*)$", conf, re.MULTILINE)
        ours = Path(self.config()["dataDir"])
        if served and ours not in (Path(served.group(1)), Path(served.group(1)).parent):
            raise ZooKeeperPortInUse(
                f"port {self._port} is served by another ZooKeeper (dataDir {served.group(1)})"
            )
        return True

    def _spawn(self) -> None:
        install = self._install or find_zookeeper()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in self.config().items()))
        if self.server_id is not None:
            (self.data_dir / "myid").write_text(f"{self.server_id}\n")
        (self.data_dir / "log4j.properties").write_text(_LOG4J_PROPERTIES)
        (self.data_dir / "logback.xml").write_text(_LOGBACK_XML)
        main_class = (
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            if self.peers
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        )
        command = install.command(
            main_class,
            self.config_path,
            jvm_options=self.jvm_options,
            # Our own logging config so the log lands in data_dir, not in
            # /var/log/zookeeper (Debian's config) or on the test's console.
            properties={
                "log4j.configuration": (self.data_dir / "log4j.properties").as_uri(),
                "logback.configurationFile": str(self.data_dir / "logback.xml"),
                "zookeeper.log.dir": str(self.data_dir),
            },
        )
        with open(self.log_path, "ab") as logfile:
            self._log_offset = logfile.tell()
            logfile.write(f"--- zktasks.testing: {' '.join(command)}\n".encode())
            logfile.flush()
            try:
                # Own process group (same session, so the watchdog may join
                # it): signals reach the JVM and nothing else, and a terminal's
                # Ctrl-C does not hit it behind our back.
                proc = subprocess.Popen(
                    command,
                    cwd=self.data_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    process_group=0,
                )
            except OSError as exc:
                raise ZooKeeperUnavailable(f"Cannot run {install.java}: {exc}") from exc
        self._proc = proc
        self._paused = False
        self._watchdog = start_watchdog(proc.pid)
        with _registry_lock:
            _running.add(self)
        log.info("started ZooKeeper %s (pid %s, dir %s)", self.hosts, proc.pid, self.data_dir)

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        # Only while the JVM is unreaped (or the watchdog still holds the group)
        # is the group id certain to still be ours and not a recycled pid.
        if proc is None:
            return
        watchdog_alive = self._watchdog is not None and self._watchdog.poll() is None
        if proc.poll() is None or watchdog_alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    def _reap(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            with contextlib.suppress(OSError):
                if watchdog.stdin is not None:
                    watchdog.stdin.close()
            try:
                watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()
        self._paused = False
        with _registry_lock:
            _running.discard(self)

    def _begin_stop(self) -> None:
        self._signal(signal.SIGTERM)
        # A paused JVM handles SIGTERM only once it runs again.
        self._signal(signal.SIGCONT)

    def _finish_stop(self, timeout: float) -> None:
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=max(timeout, 0))
            except subprocess.TimeoutExpired:
                log.warning("ZooKeeper %s ignored SIGTERM for %ss; killing", self.hosts, timeout)
                self._signal(signal.SIGKILL)
                proc.wait()
        self._reap()

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down gracefully (SIGTERM), escalating to SIGKILL after ``timeout``."""
        with self._lock:
            if self._proc is None:
                return
            self._begin_stop()
            self._finish_stop(timeout)
            log.info("stopped ZooKeeper %s", self.hosts)

    def kill(self) -> None:
        """Crash the server (SIGKILL) and wait for it to be gone."""
        with self._lock:
            if self._proc is None:
                return
            self._signal(signal.SIGKILL)
            self._proc.wait()
            self._reap()
            log.info("killed ZooKeeper %s", self.hosts)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its sockets but answers nothing."""
        with self._lock:
            if not self.is_running:
                raise RuntimeError(f"ZooKeeper {self.hosts} is not running")
            self._signal(signal.SIGSTOP)
            # Return once it has stopped (the kernel's event, not a sleep): a request
            # sent right after must meet a frozen server, not one still running.
            with contextlib.suppress(ChildProcessError):
                # WEXITED too: a JVM dying meanwhile must not block us (WNOWAIT leaves
                # its status for Popen to reap).
                os.waitid(os.P_PID, self._proc.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
            self._paused = True

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        with self._lock:
            self._signal(signal.SIGCONT)
            self._paused = False

    def restart(self, timeout: float = 30.0) -> Self:
        """Stop and start again on the same port and data dir."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop, and remove the data dir if this object created it."""
        self.stop()
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            with _registry_lock:
                _owned_dirs.discard(self.data_dir)

    def __enter__(self) -> Self:
        if not self.is_running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        member = f" id={self.server_id}" if self.peers else ""
        return f"<ZooKeeperServer {self.hosts}{member} {state} dir={self.data_dir}>"


# --------------------------------------------------------------------------- ensemble


class ZooKeeperEnsemble:
    """N servers on loopback forming a real quorum, each with its myid file.

    Members are ordinary :class:`ZooKeeperServer` objects in ``servers``; stop,
    kill, pause or restart them one by one to inject faults.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        base_dir: str | Path | None = None,
        client_ports: Sequence[int] | None = None,
        tick_time_ms: int = 200,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = 60000,
        init_limit: int = 20,
        sync_limit: int = 10,
        extra_config: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        install: ZooKeeperInstall | None = None,
        tls: TlsFiles | None = None,
        client_auth: str = "need",
    ) -> None:
        """``tls``: every member also serves TLS clients (see :class:`ZooKeeperServer`;
        the quorum's own traffic stays plain)."""
        if size < 1:
            raise ValueError("an ensemble needs at least one member")
        if client_ports is not None and len(client_ports) != size:
            raise ValueError(f"need {size} client ports, got {len(client_ports)}")
        if base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="zktasks-zk-ensemble-"))
            self._owns_base_dir = True
            with _registry_lock:
                _owned_dirs.add(self.base_dir)
        else:
            self.base_dir = Path(base_dir).resolve()
            self._owns_base_dir = False
        # Members pin each other's ports in their configs, so all 3*N must be
        # distinct up front; free_ports guarantees that.
        ports = free_ports(2 * size + (0 if client_ports is not None else size))
        peers = {sid: (ports[2 * i], ports[2 * i + 1]) for i, sid in enumerate(range(1, size + 1))}
        clients = list(client_ports) if client_ports is not None else ports[2 * size :]
        self._install = install
        self.servers: list[ZooKeeperServer] = [
            ZooKeeperServer(
                data_dir=self.base_dir / f"server-{sid}",
                client_port=clients[sid - 1],
                tick_time_ms=tick_time_ms,
                min_session_timeout_ms=min_session_timeout_ms,
                max_session_timeout_ms=max_session_timeout_ms,
                init_limit=init_limit,
                sync_limit=sync_limit,
                server_id=sid,
                peers=peers,
                extra_config=extra_config,
                jvm_options=jvm_options,
                install=install,
                tls=tls,
                client_auth=client_auth,
            )
            for sid in peers
        ]

    @property
    def hosts(self) -> str:
        return ",".join(server.hosts for server in self.servers)

    @property
    def secure_hosts(self) -> str | None:
        """The members' TLS addresses (with ``tls``), as a client lists them in HOSTS."""
        if self.servers[0].secure_hosts is None:
            return None
        return ",".join(server.secure_hosts for server in self.servers)

    def modes(self, timeout: float = 10.0) -> dict[int, str | None]:
        """Each member's id mapped to its "srvr" mode (None when down or not serving).

        One probe per member, each waiting up to ``timeout`` for the answer: a member that
        serves answers in milliseconds, but a busy machine can make that seconds, and a
        short probe would report it as not serving. A member that is down refuses the
        connection at once; a paused one is not asked.
        """
        return {
            s.server_id or 0: (s.mode(timeout) if s.is_running and not s.is_paused else None)
            for s in self.servers
        }

    def start(self, timeout: float = 60.0) -> Self:
        """Start every member and return once each serves as leader or follower."""
        if self._install is None:
            # Look up (or install) once, not once per member.
            self._install = find_zookeeper()
            for server in self.servers:
                server._install = self._install
        try:
            for server in self.servers:
                server.start(wait=False)
            deadline = time.monotonic() + timeout
            for server in self.servers:
                server.wait_until_serving(max(deadline - time.monotonic(), 0.1))
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self, timeout: float = 60.0) -> ZooKeeperServer:
        """The member that reports "Mode: leader", waiting for an election to finish.

        ``timeout`` is a deadline, not a wait: an election on loopback takes well under a
        second, but on a loaded machine it (and each JVM's share of the CPU) can take
        many."""
        found: list[ZooKeeperServer] = []

        def elected() -> bool:
            live = [s for s in self.servers if s.is_running and not s.is_paused]
            found[:] = [s for s in live if s.mode() in ("leader", "standalone")]
            return len(found) == 1

        if not _wait_until(elected, timeout):
            raise ZooKeeperStartError(
                f"no single leader among {self.hosts} within {timeout:.0f}s: {self.modes()}"
            )
        return found[0]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop all members gracefully, in parallel."""
        for server in self.servers:
            with server._lock:
                server._begin_stop()
        deadline = time.monotonic() + timeout
        for server in self.servers:
            with server._lock:
                server._finish_stop(deadline - time.monotonic())

    def close(self) -> None:
        """Stop all members and remove the base dir if this object created it."""
        self.stop()
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            with _registry_lock:
                _owned_dirs.discard(self.base_dir)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.hosts} dir={self.base_dir}>"


# --------------------------------------------------------------------------- docker

_docker_ok: bool | None = None


def docker_available() -> bool:
    """Whether a Docker engine answers a ping within a couple of seconds."""
    global _docker_ok
    if _docker_ok is None:
        if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
            # Skip importing the docker SDK (slow) when no engine can be there.
            _docker_ok = False
        else:
            try:
                import docker

                client = docker.from_env(timeout=3)
                try:
                    _docker_ok = bool(client.ping())
                finally:
                    client.close()
            except Exception as exc:
                log.debug("no Docker engine: %s", exc)
                _docker_ok = False
    return _docker_ok


def _testcontainers_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("testcontainers") is not None


class DockerZooKeeper:
    """The official ZooKeeper image in a container, with ZooKeeperServer's interface."""

    def __init__(
        self,
        *,
        client_port: int | None = None,
        tick_time_ms: int = 200,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = 60000,
        extra_config: Mapping[str, str] | None = None,
        image: str = DOCKER_IMAGE,
    ) -> None:
        from testcontainers.core.container import DockerContainer

        # A fixed host port survives `docker restart`; a random mapping would not.
        self._port = client_port or free_port()
        extra = {"maxSessionTimeout": str(max_session_timeout_ms)}
        if min_session_timeout_ms is not None:
            extra["minSessionTimeout"] = str(min_session_timeout_ms)
        extra.update(extra_config or {})
        self._container = (
            DockerContainer(image)
            .with_env("ZOO_TICK_TIME", str(tick_time_ms))
            .with_env("ZOO_4LW_COMMANDS_WHITELIST", "*")
            .with_env("ZOO_ADMINSERVER_ENABLED", "false")
            .with_env("ZOO_MAX_CLIENT_CNXNS", "0")
            .with_env("ZOO_CFG_EXTRA", " ".join(f"{k}={v}" for k, v in extra.items()))
            .with_bind_ports(2181, self._port)
        )
        self._host = "127.0.0.1"

    @property
    def port(self) -> int:
        return self._port

    @property
    def hosts(self) -> str:
        return f"{self._host}:{self._port}"

    def _status(self) -> str | None:
        """Docker's status of the container, read afresh; None when it cannot be read."""
        try:
            container = self._container.get_wrapped_container()
            container.reload()
        except Exception:
            return None
        return container.status

    @property
    def is_running(self) -> bool:
        return self._status() in ("running", "paused")

    @property
    def is_paused(self) -> bool:
        return self._status() == "paused"

    def mode(self, timeout: float = 1.0) -> str | None:
        return _mode(self._host, self._port, timeout)

    def _wait(self, timeout: float) -> Self:
        if not _wait_until(lambda: self.mode() is not None, timeout):
            logs = b"".join(self._container.get_logs()).decode(errors="replace")
            raise ZooKeeperStartError(
                f"container ZooKeeper {self.hosts} did not serve within {timeout:.0f}s:\n"
                + "\n".join(logs.splitlines()[-60:])
            )
        return self

    def start(self, timeout: float = 60.0) -> Self:
        self._container.start()
        self._host = self._container.get_container_host_ip()
        return self._wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self._container.stop()

    def kill(self) -> None:
        self._container.get_wrapped_container().kill()

    def pause(self) -> None:
        self._container.get_wrapped_container().pause()

    def resume(self) -> None:
        self._container.get_wrapped_container().unpause()

    def restart(self, timeout: float = 60.0) -> Self:
        self._container.get_wrapped_container().restart()
        return self._wait(timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_DOCKER_KWARGS = frozenset(
    {
        "client_port",
        "tick_time_ms",
        "min_session_timeout_ms",
        "max_session_timeout_ms",
        "extra_config",
        "timeout",
    }
)


def start_zookeeper(**kw: Any) -> ZooKeeperServer | DockerZooKeeper:
    """Start one server: in Docker when an engine answers, else from the local install.

    ZKTASKS_TEST_DOCKER=0 forces the local install, =1 forces Docker. Keyword
    arguments go to ZooKeeperServer (``timeout`` to its start()); any that a
    container cannot honour (``data_dir``, ``jvm_options``...) also force local.
    """
    timeout = kw.pop("timeout", None)
    choice = os.environ.get(ENV_DOCKER, "").strip().lower()
    if choice in ("0", "false", "no", "off"):
        use_docker = False
    elif choice in ("1", "true", "yes", "on"):
        if not _testcontainers_installed():
            raise ZooKeeperUnavailable(
                f"{ENV_DOCKER}={os.environ[ENV_DOCKER]} asks for ZooKeeper in Docker, "
                "which needs testcontainers: pip install testcontainers (or unset it to "
                "use a local install).")
        use_docker = True
    else:
        use_docker = set(kw) <= _DOCKER_KWARGS and docker_available()
        if use_docker and not _testcontainers_installed():
            # testcontainers comes with the `test` extra only: a project that installed
            # zktasks alone (and has Docker's SDK) still gets the local install.
            log.warning("a Docker engine answers but testcontainers is not installed: "
                        "using the local ZooKeeper install (pip install testcontainers "
                        "for the container; %s=0 to stop trying Docker)", ENV_DOCKER)
            use_docker = False
    if use_docker:
        container = DockerZooKeeper(**kw)
        try:
            return container.start(60.0 if timeout is None else timeout)
        except BaseException:
            container.close()
            raise
    server = ZooKeeperServer(**kw)
    try:
        return server.start(30.0 if timeout is None else timeout)
    except BaseException:
        server.close()
        raise


# --------------------------------------------------------------------------- pytest


_DELETE_ATTEMPTS = 8


def _new_client(hosts: str, **kwargs: Any) -> Any:
    """A kazoo client that reconnects promptly (as zktasks' own do): kazoo's default
    backoff grows toward an hour between attempts, so a client that lost a server
    restarted by a test would come back long after it serves again."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    return KazooClient(
        hosts=hosts,
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
        **kwargs,
    )


DELETE_BATCH = 200  # znodes per multi, and listings in flight, in delete_tree


def delete_tree(client: Any, root: str, *, batch: int = DELETE_BATCH,
                timeout: float = 30.0) -> int:
    """Delete `root` and everything below it with a started kazoo client; return how many
    znodes there were (0 if `root` did not exist).

    kazoo's ``delete(recursive=True)`` sends one request at a time and waits for each:
    a test's tree of a few thousand jobs took seconds, and a backlog's tens of seconds.
    Here the listing is pipelined level by level, and the deletes go deepest level
    first in multis of `batch`, all of a level in flight at once. A multi refused
    (something changed underneath: a child added by a session still closing, a znode
    deleted by someone else) falls back to kazoo's way for whatever is left, which
    raises NotEmptyError if children keep coming.
    """
    from kazoo.exceptions import NoNodeError

    levels: list[list[str]] = []
    level = [root] if client.exists(root) else []
    while level:
        levels.append(level)
        below: list[str] = []
        for start in range(0, len(level), batch):
            part = level[start:start + batch]
            for path, listing in zip(part, [client.get_children_async(p) for p in part],
                                     strict=True):
                try:
                    below.extend(f"{path}/{name}" for name in listing.get(timeout))
                except NoNodeError:
                    pass
        level = below
    for level in reversed(levels):
        sent = []
        for start in range(0, len(level), batch):
            txn = client.transaction()
            for path in level[start:start + batch]:
                txn.delete(path)
            sent.append(txn.commit_async())
        if not all(result is True for multi in sent for result in multi.get(timeout)):
            with contextlib.suppress(NoNodeError):
                client.delete(root, recursive=True)
            break
    return sum(map(len, levels))


def _delete_tree(hosts: str, path: str) -> None:
    from kazoo.exceptions import NotEmptyError

    client = _new_client(hosts, timeout=30.0)
    try:
        client.start(timeout=30.0)
        # Sessions still closing can add ephemeral children meanwhile: try again, with
        # a short pause growing each time.
        pause = threading.Event()
        for attempt in range(_DELETE_ATTEMPTS):
            try:
                delete_tree(client, path)
                return
            except NotEmptyError:
                if attempt + 1 < _DELETE_ATTEMPTS:
                    pause.wait(0.05 * 2**attempt)  # 6.4 s in all at most
        log.warning("gave up deleting %s on %s: it kept gaining children (%d attempts)",
                    path, hosts, _DELETE_ATTEMPTS)
    except Exception as exc:
        log.warning("could not delete %s on %s: %s", path, hosts, exc)
    finally:
        with contextlib.suppress(Exception):
            client.stop()
        with contextlib.suppress(Exception):
            client.close()


try:
    import pytest
except ImportError:  # the module also runs `make demo`, where pytest may be absent
    pass
else:

    def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
        """Keep this module from being registered twice under two names.

        With the package installed, the "zktasks" pytest11 entry point loads this
        module, and `-p zktasks.testing` loads it again; pluggy refuses the second
        registration and pytest dies with "Plugin already registered under a
        different name". Blocking the other name makes the second load a no-op.
        """
        registered_as = pluginmanager.get_name(sys.modules[__name__])
        for alias in ("zktasks", "zktasks.testing"):
            if alias != registered_as and not pluginmanager.has_plugin(alias):
                pluginmanager.set_blocked(alias)

    @pytest.fixture(scope="session")
    def zookeeper() -> Iterator[ZooKeeperServer | DockerZooKeeper]:
        """A real ZooKeeper server shared by the whole test session."""
        try:
            server = start_zookeeper()
        except ZooKeeperUnavailable as exc:
            unavailable = str(exc)
        else:
            unavailable = None
        if unavailable is not None:
            # Fail loudly: a skipped suite would hide that nothing was tested.
            pytest.fail(unavailable, pytrace=False)
        try:
            yield server
        finally:
            server.close()

    @pytest.fixture(scope="session")
    def zk_hosts(zookeeper: ZooKeeperServer | DockerZooKeeper) -> str:
        """The connection string of the session's server."""
        return zookeeper.hosts

    def _revive(server: ZooKeeperServer | DockerZooKeeper) -> None:
        # A test that crashed or froze the shared server must not fail every
        # test after it.
        if server.is_paused:
            log.warning("resuming the session's ZooKeeper %s, left paused", server.hosts)
            server.resume()
        elif not server.is_running:
            log.warning("restarting the session's ZooKeeper %s, left down", server.hosts)
            if isinstance(server, ZooKeeperServer):
                server.start()
            else:
                server.restart()

    @pytest.fixture
    def zk_root(zookeeper: ZooKeeperServer | DockerZooKeeper, zk_hosts: str) -> Iterator[str]:
        """A unique root path for this test, not yet created (the code under test, or the
        test, makes it); removed with everything below it afterwards. Restarts (or
        resumes) the session's server first if an earlier test left it down (or paused).
        """
        _revive(zookeeper)
        root = f"/zktasks-test-{secrets.token_hex(8)}"
        yield root
        # A test that left the server down or frozen: deleting waited 30 s to connect
        # (and failed); the next test would revive it anyway.
        _revive(zookeeper)
        _delete_tree(zk_hosts, root)

    @pytest.fixture
    def zk_client(zookeeper: ZooKeeperServer | DockerZooKeeper, zk_hosts: str) -> Iterator[Any]:
        """A connected kazoo KazooClient, closed after the test. It reconnects within a
        second of the server serving again (not with kazoo's backoff of up to an hour).
        Restarts (or resumes) the session's server first if an earlier test left it down.
        """
        _revive(zookeeper)
        client = _new_client(zk_hosts)
        client.start(timeout=60.0)
        try:
            yield client
        finally:
            client.stop()
            client.close()

    @pytest.fixture
    def zk_settings(settings: Any, zk_hosts: str, zk_root: str) -> Any:
        """Point TASKS["default"] at the session's server and this test's ROOT, through
        pytest-django's `settings` (put back after the test).

        The project's own QUEUES and OPTIONS (AUTH, SIGNING_KEY, timeouts...) are kept,
        but HOSTS and ROOT are the test's, and TLS (the test server speaks plain TCP)
        and SCHEDULES are dropped. A project whose default backend is not zktasks gets
        zktasks' with default options. Only this process sees the change: a
        `runworker` subprocess or a process-pool worker's task processes load the
        settings module afresh (`zk_worker` runs jobs on threads for that reason).
        """
        tasks = dict(getattr(settings, "TASKS", None) or {})
        default = dict(tasks.get("default") or {})
        if not str(default.get("BACKEND", "")).startswith("zktasks."):
            default = {"BACKEND": "zktasks.backend.ZooKeeperBackend"}
        # Not TLS (the test server has none), nor SCHEDULES: a worker of the test would
        # lead and run them during every test (a test of a schedule puts it back).
        options = {k: v for k, v in dict(default.get("OPTIONS") or {}).items()
                   if k not in ("TLS", "SCHEDULES")}
        options.update(HOSTS=zk_hosts, ROOT=zk_root)
        tasks["default"] = {**default, "OPTIONS": options}
        settings.TASKS = tasks
        return settings

    @pytest.fixture
    def zk_worker(zk_settings: Any) -> Iterator[Callable[..., Any]]:
        """A function that starts a worker in this process, registered when it returns,
        and stops it after the test: ``worker = zk_worker(queues=["emails"])``.

        Keyword arguments go to ``zktasks.worker.Worker`` (those of ``runworker``); the
        defaults here are ``pool="thread"`` and ``concurrency=2``, so that jobs run in
        the test's process and see its settings (``zk_settings``, ``mail.outbox``...).
        A ``pool="process"`` worker's task processes load the settings module instead:
        a job they submit goes where that module says.
        """
        from zktasks.worker import Worker

        started: list[tuple[Any, threading.Thread]] = []

        def start(**kwargs: Any) -> Any:
            kwargs.setdefault("pool", "thread")
            kwargs.setdefault("concurrency", 2)
            worker = Worker(**kwargs)
            thread = threading.Thread(target=worker.run, name="zk-worker", daemon=True)
            thread.start()
            started.append((worker, thread))  # stopped after the test even if it never registers
            # A process-pool worker registers once its task processes have set up Django
            # (seconds on a loaded machine): the bound is for a worker that never does.
            if not worker.registered.wait(60):
                pytest.fail("the worker did not register with ZooKeeper within 60 s")
            return worker

        yield start
        for worker, _ in started:
            worker.stop(graceful=False)
        for worker, thread in started:
            thread.join(60)
            if thread.is_alive():
                pytest.fail(f"worker {worker.worker_id} did not stop within 60 s")

    @pytest.fixture
    def zk_ensemble() -> Iterator[ZooKeeperEnsemble]:
        """A started three-member ensemble of its own, for tests that break it."""
        ensemble = ZooKeeperEnsemble(3)
        unavailable = None
        try:
            ensemble.start()
        except ZooKeeperUnavailable as exc:
            unavailable = str(exc)
        except BaseException:
            ensemble.close()
            raise
        if unavailable is not None:
            ensemble.close()
            pytest.fail(unavailable, pytrace=False)
        try:
            yield ensemble
        finally:
            ensemble.close()


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m zktasks.testing serve`: run ZooKeeper in the foreground until signalled."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m zktasks.testing", description="Run real ZooKeeper servers."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve until SIGINT/SIGTERM")
    serve.add_argument("--port", type=int, default=2181, help="client port (first member's)")
    serve.add_argument("--data-dir", help="keep data here (default: a temp dir, removed)")
    serve.add_argument("--ensemble", type=int, default=1, metavar="N", help="run N members")
    serve.add_argument("--tick-time-ms", type=int, default=200)
    serve.add_argument("--tls", metavar="DIR",
                       help="also serve TLS (mutual) on another port, with a throw-away CA "
                            "and certificates made in DIR (one member only)")
    args = parser.parse_args(argv)
    if args.tls and args.ensemble > 1:
        parser.error("--tls runs one member only")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    cluster: ZooKeeperServer | ZooKeeperEnsemble
    if args.ensemble > 1:
        cluster = ZooKeeperEnsemble(
            args.ensemble,
            base_dir=args.data_dir,
            client_ports=[args.port + i for i in range(args.ensemble)],
            tick_time_ms=args.tick_time_ms,
        )
        members = cluster.servers
    else:
        cluster = ZooKeeperServer(
            data_dir=args.data_dir, client_port=args.port, tick_time_ms=args.tick_time_ms,
            tls=make_tls_files(args.tls) if args.tls else None,
        )
        members = [cluster]

    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with cluster:
            print(f"ZooKeeper serving at {cluster.hosts}", flush=True)
            if isinstance(cluster, ZooKeeperServer) and cluster.tls:
                files = cluster.tls
                print(f"TLS at {cluster.secure_hosts}: \"HOSTS\": {cluster.secure_hosts!r}, "
                      f"\"TLS\": {{\"CA\": {str(files.ca)!r}, \"CERTFILE\": "
                      f"{str(files.client_cert)!r}, \"KEYFILE\": {str(files.client_key)!r}}}",
                      flush=True)
            while not stop.wait(0.5):
                if dead := [m for m in members if not m.is_running]:
                    print(
                        f"ZooKeeper {dead[0].hosts} exited:\n{dead[0].log_tail()}", file=sys.stderr
                    )
                    return 1
    except ZooKeeperUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    except ZooKeeperStartError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
