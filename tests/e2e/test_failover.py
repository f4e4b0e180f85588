"""The failover benchmark, one short trial: it runs, reports figures, and the drain neither
repeats nor loses a job.

bench/failover.py runs as a subprocess (its own ZooKeeper, workers and settings) with a
2-second session timeout and one trial of each scenario (~30 s). No timing is asserted:
the figures only have to exist. The full run is `.venv/bin/python bench/failover.py`.
"""

import json
import subprocess
import sys

import pytest

from tests.e2e.harness import REPO, run_bench

pytestmark = pytest.mark.e2e

DEADLINE = 240  # seconds; the run takes ~30 s on a loaded 2-CPU machine


def test_failover_benchmark_runs_and_drain_repeats_nothing(tmp_path):
    report = tmp_path / "failover.json"
    run = run_bench("failover.py", "--trials", "1", "--session-timeout", "2",
                    "--json", str(report), deadline=DEADLINE)
    output = run.stdout
    assert run.returncode == 0, output[-12000:]

    result = json.loads(report.read_text())
    assert result["failures"] == [], result["failures"]
    runs = result["runs"]
    assert {k: len(v) for k, v in runs.items()} == {
        "leader_kill": 1, "worker_kill": 1, "drain": 1}, output[-6000:]

    drained = runs["drain"][0]
    assert drained["exit_code"] == 0, drained
    assert drained["repeated"] == 0, drained
    assert drained["lost"] == 0, drained
    assert drained["running"] >= 1 and drained["prefetched"] >= 1, drained
    assert drained["prefetched_ran_elsewhere"] == drained["prefetched"], drained

    killed = runs["worker_kill"][0]
    assert killed["held"] >= 1 and len(killed["ran_again_on"]) == killed["held"], killed
    assert killed["victim"] not in killed["ran_again_on"].values(), killed
    assert runs["leader_kill"][0]["new_leader"] != runs["leader_kill"][0]["victim"]

    # Figures exist for every measure (their values are the benchmark's business).
    measures = {(row["scenario"], row["measure"]) for row in result["summary"]}
    assert {("leader_kill", "assigned_s"), ("worker_kill", "running_s"),
            ("drain", "drain_s")} <= measures, result["summary"]
    for row in result["summary"]:
        assert row["median_s"] > 0, row
    assert "leader kill -> job assigned by new leader" in output


# Run in a child interpreter: importing bench.failover sets DJANGO_SETTINGS_MODULE (it is
# the harness's own process), which must not leak into this test session.
_CRASHED_WORKER = """
import subprocess, sys, types
sys.path.insert(0, sys.argv[1])
import bench.failover as failover

crashed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
crashed.wait()
proc = types.SimpleNamespace(state="running", popen=crashed, name="fo-w1", exit_code=None,
                             log_path="fo-w1.log", log_tail=lambda lines: "Traceback ...")
try:
    failover.Trial.wait_for(types.SimpleNamespace(procs=[proc]), "a leader", lambda: None, 5)
except failover.Finding as exc:
    print("finding:", exc, proc.state, proc.exit_code)
except failover.HarnessError as exc:
    print("harness error:", exc)
"""


def test_a_worker_that_exits_on_its_own_is_a_finding_not_a_harness_fault():
    """A worker crash is zktasks' failure: the trial fails with a finding (exit 1), as
    in bench/chaos.py, instead of "the harness could not run" (exit 2)."""
    done = subprocess.run([sys.executable, "-c", _CRASHED_WORKER, str(REPO)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("finding: fo-w1 exited on its own with code 3 while "
                                  "waiting for a leader"), done.stdout
    assert done.stdout.rstrip().endswith("crashed 3"), done.stdout
