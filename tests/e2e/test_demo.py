"""`project/demo.py --no-wait`, what `make demo` runs: the whole demo, start to shutdown."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zktasks.testing import ZooKeeperUnavailable, find_zookeeper, free_ports

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_demo_runs_the_samples_and_stops_everything(tmp_path):
    try:
        find_zookeeper()
    except ZooKeeperUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    site_port, zk_port = free_ports(2)
    var = tmp_path / "var"
    env = {
        **os.environ,
        "ZKTASKS_DEMO_PORT": str(site_port),
        "ZKTASKS_DEMO_ZK_PORT": str(zk_port),
        "ZKTASKS_DEMO_VAR": str(var),
        "DATABASE_URL": f"sqlite:///{var / 'demo.sqlite3'}",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest-django's tests.settings; the demo sets its own
    try:
        done = subprocess.run(
            [sys.executable, "project/demo.py", "--no-wait"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=TIMEOUT, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"demo.py did not finish within {TIMEOUT}s:\n{exc.stdout}\n{exc.stderr}")
    output = done.stdout
    report = f"exit code {done.returncode}\n--- stdout\n{output}\n--- stderr\n{done.stderr}"

    assert done.returncode == 0, report
    assert f"http://127.0.0.1:{site_port}/admin/zktasks/" in output, report
    assert re.search(r"^\s*add\(2, 3\)\s+SUCCESSFUL\s+-> 5\b", output, re.M), report
    assert re.search(r"^\s*divide\(1, 0\)\s+FAILED\s+ZeroDivisionError", output, re.M), report
    assert "Ctrl-C stops everything" in output, report
    assert f"http://127.0.0.1:{site_port}/admin/zktasks/schedules/" in output, report
    for name in ("worker-1", "worker-2", "runserver"):
        assert (var / "logs" / f"{name}.log").stat().st_size > 0, name
    # The demo's schedule (heartbeat) imports and fits its task: no leader refused it.
    for name in ("worker-1", "worker-2"):
        assert "schedule failed" not in (var / "logs" / f"{name}.log").read_text(), name

    # Nothing outlives the demo: its children are gone and nobody serves its ports.
    pids = re.findall(r"stopped \S+ \(pid (\d+)\)", output)
    assert len(pids) == 3, report
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], report
    assert not listening(site_port), report
    assert not listening(zk_port), report
