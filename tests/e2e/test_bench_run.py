"""The peer benchmark's own harness, one small zktasks row: it runs to the end and writes
its figures, once with the streaming phase's jobs submitted by one loop and once from
several threads at once (a --submitters sweep), then runs the failover and scale harnesses
at their smallest and ends with issue 6's targets table.

bench/run.py runs as a subprocess (its own ZooKeeper and workers) with 60 jobs a row, without
the peers (they need Redis and PostgreSQL and the `bench` extra). No timing is asserted:
the run only has to finish every job it submitted (it stops with an error on a job that
did not succeed or never came back) and report it. The full run is `make bench`.
"""

import json
import os

import pytest

from tests.e2e.harness import run_bench

pytestmark = pytest.mark.e2e

DEADLINE = 400  # seconds; the run takes ~75 s on a loaded 2-CPU machine


def test_the_bench_runs_a_row_per_count_of_submitters_then_failover_scale_and_targets(
        tmp_path):
    report = tmp_path / "bench.json"
    # A full run (no --only) times failover and drains a large backlog by default; asked
    # for here, at their smallest.
    run = run_bench("run.py", "--only", "zktasks-noop-2w", "--jobs", "60", "--latency", "3",
                    "--sparse", "2", "--submitters", "1,4", "--failover-trials", "1",
                    "--scale-jobs", "2000",
                    "--json", str(report), deadline=DEADLINE)
    assert run.returncode == 0, run.stdout[-12000:]
    assert "submitters: 1, 4 threads in the streaming phase" in run.stdout, run.stdout[-4000:]
    assert "== 4 submitter thread(s)" in run.stdout, run.stdout[-4000:]

    result = json.loads(report.read_text())
    assert (result["jobs"], result["submitters"], result["latency_samples"]) == (60, [1, 4], 3)
    assert [(row["scenario"], row["submitters"]) for row in result["rows"]] == [
        ("zktasks-noop-2w", 1), ("zktasks-noop-2w", 4)]
    for row in result["rows"]:
        assert (row["workers"], row["jobs"]) == (2, 60), row
        # Every phase ran to its end: the figures exist (their values are the bench's).
        assert row["submit_idle_per_s"] > 0 and row["submit_per_s"] > 0, row
        assert row["e2e_per_s"] > 0 and row["latency_samples"] == 3, row
        assert row["zk_txns_per_job"] > 0, row
        # The host meters ran over the streaming phase: its machine-wide CPU time, and
        # the worker processes' run-queue wait, counted (zero or more).
        stream = row["cpu_ms_per_job"]
        assert stream["host_total"] > 0 and stream["runq_wait"] >= 0, stream
        assert 0 <= stream["host_idle"] + stream["host_steal"] <= stream["host_total"], stream
        # A job alone on an idle cluster was counted (submit, assign, finish: a short
        # job held alone writes no start), and so were jobs one a second.
        assert row["latency_zk_txns_per_job"] >= 3, row
        assert row["sparse_zk_txns_per_job"] >= 3, row

    assert "-- failover: python bench/failover.py --trials 1" in run.stdout, run.stdout[-4000:]
    assert "-- scale: python -m bench.scale --jobs 2000 --heap 1g" in run.stdout, \
        run.stdout[-4000:]
    assert "issue 6's targets, figures of this run" in run.stdout, run.stdout[-4000:]
    assert result["scale"]["jobs"] == 2000 and result["scale"]["never_ran"] == 0
    assert result["failover"]["trials"] == 1 and result["failover"]["summary"]
    verdicts = {t["target"]: t["verdict"] for t in result["targets"]}
    # No peer ran: what needs one says so instead of a verdict.
    assert verdicts["e2e >= 1.5x celery (no-op, 2 workers)"].startswith("not run")
    assert verdicts["1,000,000 pending jobs: none lost or twice, leader <= 500 MB"] == \
        "met at 2,000 jobs only"
    assert verdicts["graceful drain: 0 jobs repeated"] == "met"


def test_the_bench_refuses_more_submitters_than_jobs():
    run = run_bench("run.py", "--only", "zktasks-noop-2w", "--jobs", "10",
                    "--submitters", "11", deadline=60)
    assert run.returncode == 2, run.stdout
    assert "--submitters must be between 1 and --jobs" in run.stdout, run.stdout


def test_a_finished_scenario_s_tree_is_deleted_whole(zk_hosts, zk_root, zk_client, monkeypatch):
    # bench/run.py empties ZooKeeper after each row, as the peers' servers are emptied
    # before theirs: wider levels than one multi, and nodes at several depths.
    # Importing bench/run.py points DJANGO_SETTINGS_MODULE at the bench's settings:
    # setting it first makes monkeypatch put the test run's value back afterwards.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", os.environ["DJANGO_SETTINGS_MODULE"])
    from bench.run import Monitor
    from zktasks.testing import DELETE_BATCH

    wide = DELETE_BATCH * 2 + 7
    for i in range(wide):
        zk_client.create(f"{zk_root}/status/j{i:04d}", b"x", makepath=True)
    for i in range(5):
        zk_client.create(f"{zk_root}/finished/b{i}/{i}/j{i}", makepath=True)
    expected = 1 + 1 + wide + 1 + 5 * 3  # root, status, its children, finished, 3 each
    monitor = Monitor(zk_hosts)
    try:
        assert monitor.delete_tree(zk_root) == expected
        assert monitor.delete_tree(zk_root) == 0  # gone: nothing to list, nothing raised
    finally:
        monitor.close()
    assert zk_client.exists(zk_root) is None

