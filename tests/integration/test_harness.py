"""Check zktasks.testing against real ZooKeeper processes: lifecycle, crashes, quorum."""

import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.retry import KazooRetry

from tests.processes import process_running
from tests.waiting import wait_until
from zktasks.testing import (
    ZooKeeperEnsemble,
    ZooKeeperPortInUse,
    ZooKeeperServer,
    ZooKeeperUnavailable,
    delete_tree,
    find_zookeeper,
    four_letter_word,
    free_port,
)

PROJECT_DIR = Path(__file__).resolve().parents[2]

# Reconnect quickly while a server is down instead of backing off for minutes.
FAST_RECONNECT = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5}


def connect(hosts: str, *, timeout: float = 10.0) -> KazooClient:
    client = KazooClient(
        hosts=hosts,
        timeout=timeout,
        connection_retry=dict(FAST_RECONNECT),
        command_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, deadline=30),
    )
    client.start(timeout=60)
    return client


def close(client: KazooClient) -> None:
    client.stop()
    client.close()


def test_server_serves_znodes_and_cleans_up() -> None:
    with ZooKeeperServer() as server:
        assert server.is_running
        assert server.hosts == f"127.0.0.1:{server.port}"
        assert server.mode() == "standalone"
        client = connect(server.hosts)
        try:
            client.create("/greeting", b"hello")
            assert client.get("/greeting")[0] == b"hello"
        finally:
            close(client)
        pid, data_dir = server.pid, server.data_dir
        assert (data_dir / "zoo.cfg").is_file()
        assert "ZooKeeperServerMain" in server.log_path.read_text()
    assert pid is not None and not process_running(pid)
    assert not data_dir.exists()


def test_restart_keeps_port_and_data(tmp_path: Path) -> None:
    with ZooKeeperServer(data_dir=tmp_path / "zk") as server:
        port = server.port
        client = connect(server.hosts)
        try:
            client.create("/kept/deep", b"v1", makepath=True)
        finally:
            close(client)
        server.restart()
        assert server.port == port
        client = connect(server.hosts)
        try:
            assert client.get("/kept/deep")[0] == b"v1"
        finally:
            close(client)
    # A caller-provided data dir is the caller's to remove.
    assert (tmp_path / "zk" / "version-2").is_dir()


def test_kill_suspends_client_and_restart_reconnects() -> None:
    with ZooKeeperServer() as server:
        client = connect(server.hosts)
        suspended = threading.Event()
        reconnected = threading.Event()

        def listener(state: str) -> None:
            if state == KazooState.SUSPENDED:
                suspended.set()
            elif state == KazooState.CONNECTED and suspended.is_set():
                reconnected.set()

        client.add_listener(listener)
        try:
            client.create("/survives-crash", b"fsynced")
            server.kill()
            assert not server.is_running
            assert suspended.wait(60), "client never noticed the crash"
            server.restart()
            assert reconnected.wait(60), "client did not reconnect after restart"
            assert client.get("/survives-crash")[0] == b"fsynced"
        finally:
            close(client)


def test_pause_freezes_and_resume_thaws() -> None:
    with ZooKeeperServer() as server:
        server.pause()
        assert server.is_paused
        assert server.mode(timeout=0.3) is None  # frozen: no answer can come
        server.resume()
        # Thawed, it answers again, once the JVM is scheduled: a deadline, not one probe.
        wait_until(lambda: server.mode() == "standalone", 30, "the thawed server to answer")
        server.pause()
        # stop() must get through to a frozen JVM.
        server.stop(timeout=10)
        assert not server.is_running


def test_taken_port_is_reported_not_mistaken_for_ours() -> None:
    with ZooKeeperServer() as server:
        intruder = ZooKeeperServer(client_port=server.port)
        try:
            with pytest.raises(ZooKeeperPortInUse):
                intruder.start(timeout=60)
            assert not intruder.is_running
        finally:
            intruder.close()


def test_missing_java_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZKTASKS_JAVA", "/nonexistent/java")
    with pytest.raises(ZooKeeperUnavailable, match="apt-get install -y zookeeper"):
        find_zookeeper()


def test_docker_without_testcontainers_falls_back_to_the_local_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """testcontainers comes with the `test` extra only. A project with zktasks alone and
    Docker's SDK (and an engine that answers) used to fail every test with
    ModuleNotFoundError; it gets the local server now, and a forced Docker says what to
    install."""
    from zktasks import testing

    monkeypatch.setattr(testing, "_docker_ok", True)  # an engine answers
    monkeypatch.setattr(testing, "_testcontainers_installed", lambda: False)
    monkeypatch.delenv("ZKTASKS_TEST_DOCKER", raising=False)
    server = testing.start_zookeeper()
    try:
        assert isinstance(server, ZooKeeperServer)
        assert "imok" in four_letter_word("127.0.0.1", server.port, "ruok")
    finally:
        server.close()
    monkeypatch.setenv("ZKTASKS_TEST_DOCKER", "1")
    with pytest.raises(ZooKeeperUnavailable, match="pip install testcontainers"):
        testing.start_zookeeper()


def test_ensemble_survives_leader_crash() -> None:
    with ZooKeeperEnsemble(3) as ensemble:
        assert ensemble.hosts == ",".join(f"127.0.0.1:{s.port}" for s in ensemble.servers)
        assert sorted(ensemble.modes().values()) == ["follower", "follower", "leader"]
        old_leader = ensemble.leader()
        client = connect(ensemble.hosts)
        try:
            client.create("/before", b"1")
        finally:
            close(client)

        old_leader.kill()
        new_leader = ensemble.leader(timeout=60)
        assert new_leader is not old_leader

        survivors = ",".join(s.hosts for s in ensemble.servers if s is not old_leader)
        client = connect(survivors)
        try:
            client.retry(client.create, "/after", b"2")
            assert client.get("/before")[0] == b"1"
        finally:
            close(client)

        old_leader.start()
        assert old_leader.mode(timeout=30) == "follower"
        assert ensemble.leader() is new_leader


def test_plugin_fixtures(zk_client: KazooClient, zk_root: str, zk_hosts: str) -> None:
    zk_client.create(f"{zk_root}/child", b"x", makepath=True)
    assert zk_client.get_children(zk_root) == ["child"]
    assert zk_client.connected
    assert zk_hosts.rsplit(":", 1)[1].isdigit()


_recorded_roots: list[str] = []


def test_plugin_gives_a_fresh_root(zk_client: KazooClient, zk_root: str) -> None:
    assert zk_client.exists(zk_root) is None
    zk_client.ensure_path(f"{zk_root}/some/tree")
    _recorded_roots.append(zk_root)


def test_plugin_removes_earlier_roots(zk_client: KazooClient, zk_root: str) -> None:
    # Runs after the test above (file order): the root it filled is gone.
    assert _recorded_roots and zk_root not in _recorded_roots
    assert zk_client.exists(_recorded_roots[0]) is None


def test_delete_tree_deletes_every_level_in_multis(zk_client: KazooClient, zk_root: str) -> None:
    # zk_root's teardown deletes with it: levels wider than a batch, and deeper ones.
    for i in range(7):
        zk_client.create(f"{zk_root}/wide/n{i}", b"x", makepath=True)
    zk_client.create(f"{zk_root}/deep/a/b/c/d", makepath=True)
    zk_client.create(f"{zk_root}/eph", ephemeral=True, makepath=False)
    expected = 1 + 1 + 7 + 5 + 1  # root, wide and its children, deep/a/b/c/d, eph
    assert delete_tree(zk_client, zk_root, batch=3) == expected
    assert zk_client.exists(zk_root) is None
    assert delete_tree(zk_client, zk_root, batch=3) == 0  # gone: nothing raised


def test_free_ports_are_claimed_across_processes() -> None:
    # `make test` runs two pytest processes, each picking ports for its servers.
    from zktasks import testing

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from zktasks.testing import free_ports; "
         "print(*free_ports(3), flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=PROJECT_DIR)
    try:
        ports = [int(p) for p in child.stdout.readline().split()]
        assert len(ports) == 3
        assert not any(testing._claim(port) for port in ports)  # its claims, alive
    finally:
        child.stdin.close()
        assert child.wait(30) == 0
    # Its exit released them.
    assert not any((testing._CLAIMS_DIR / str(port)).exists() for port in ports)


def test_a_port_claim_left_by_a_dead_process_is_taken_over() -> None:
    import os
    import socket

    from zktasks import testing

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    testing._CLAIMS_DIR.mkdir(mode=0o700, exist_ok=True)
    claim = testing._CLAIMS_DIR / str(port)
    claim.write_text(str(gone.pid))  # SIGKILLed before its atexit ran
    assert testing._claim(port)
    assert claim.read_text() == str(os.getpid())
    assert not testing._claim(port)  # ours now


def test_plugin_revives_crashed_session_server(
    zookeeper: ZooKeeperServer, request: pytest.FixtureRequest
) -> None:
    zookeeper.kill()
    client = request.getfixturevalue("zk_client")
    assert client.connected
    assert zookeeper.mode(timeout=30) == "standalone"


def test_zk_ensemble_fixture(zk_ensemble: ZooKeeperEnsemble) -> None:
    assert len(zk_ensemble.servers) == 3
    assert zk_ensemble.leader() in zk_ensemble.servers


def test_serve_command_runs_until_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "zktasks.testing", "serve", "--port", str(port)],
        cwd=PROJECT_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(proc, timeout=30)
        assert line == f"ZooKeeper serving at 127.0.0.1:{port}\n"
        client = connect(f"127.0.0.1:{port}")
        close(client)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The server went down with the command.
    with pytest.raises(OSError):
        four_letter_word("127.0.0.1", port, "srvr", timeout=1)


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=deadline - time.monotonic()):
                return proc.stdout.readline()
    stderr = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"no output from serve within {timeout}s; stderr: {stderr}")
