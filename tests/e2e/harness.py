"""Running one of bench/'s harnesses as a subprocess from a test.

Each harness starts its own ZooKeeper, workers and settings, so it gets the environment
without the test run's ZKTASKS_TEST_* and DJANGO_SETTINGS_MODULE. Past its deadline it is
sent SIGTERM, which makes it stop everything it started, and the test fails with the end
of its output.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, deadline: float) -> subprocess.CompletedProcess:
    """`python bench/{script} {args}` from the repo root; its output (stdout and stderr
    together) and exit status."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ZKTASKS_TEST_") and k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / script), *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the harness stops its workers and servers
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"bench/{script} did not end within {deadline}s:\n{output[-8000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, output)
