"""The peer benchmark's own harness, one small zktasks row: it runs to the end and writes
its figures, with the streaming phase's jobs submitted from several threads at once.

bench/run.py runs as a subprocess (its own ZooKeeper and workers) with 80 jobs, without
the peers (they need Redis and PostgreSQL and the `bench` extra). No timing is asserted:
the run only has to finish every job it submitted (it stops with an error on a job that
did not succeed or never came back) and report it. The full run is `make bench`.
"""

import json

import pytest

from tests.e2e.harness import run_bench

pytestmark = pytest.mark.e2e

DEADLINE = 240  # seconds; the run takes ~20 s on a loaded 2-CPU machine


def test_the_bench_runs_a_zktasks_row_with_concurrent_submitters(tmp_path):
    report = tmp_path / "bench.json"
    run = run_bench("run.py", "--only", "zktasks-noop-2w", "--jobs", "80", "--latency", "3",
                    "--submitters", "4", "--json", str(report), deadline=DEADLINE)
    assert run.returncode == 0, run.stdout[-12000:]
    assert "submitters: 4 threads in the streaming phase" in run.stdout, run.stdout[-4000:]

    result = json.loads(report.read_text())
    assert (result["jobs"], result["submitters"], result["latency_samples"]) == (80, 4, 3)
    [row] = result["rows"]
    assert (row["scenario"], row["workers"], row["jobs"]) == ("zktasks-noop-2w", 2, 80)
    # Every phase ran to its end: the figures exist (their values are the bench's to say).
    assert row["submit_idle_per_s"] > 0 and row["submit_per_s"] > 0, row
    assert row["e2e_per_s"] > 0 and row["latency_samples"] == 3, row
    assert row["zk_txns_per_job"] > 0, row


def test_the_bench_refuses_more_submitters_than_jobs():
    run = run_bench("run.py", "--only", "zktasks-noop-2w", "--jobs", "10",
                    "--submitters", "11", deadline=60)
    assert run.returncode == 2, run.stdout
    assert "--submitters must be between 1 and --jobs" in run.stdout, run.stdout
