"""bench/run.py's host meters, read from this machine's /proc: the run-queue wait of a
process's threads (schedstat) and the machine's idle and stolen CPU time (/proc/stat),
which tell a row that waited for CPUs from one that left them idle."""

import importlib
import os
import subprocess
import sys
import time

import pytest

BUSY = "while True: pass"


@pytest.fixture
def bench_run(monkeypatch):
    # As in test_bench_sweep: bench/run.py sets DJANGO_SETTINGS_MODULE when imported.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", os.environ["DJANGO_SETTINGS_MODULE"])
    return importlib.import_module("bench.run")


def test_more_busy_processes_than_cpus_show_run_queue_wait(bench_run):
    # One more spinning process than there are CPUs: while they all spin, at least one
    # of them is runnable without a CPU at every instant, so their wait adds up to at
    # least the time they all spun, whatever the scheduler's order.
    cpus = len(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(cpus + 1)]
    try:
        before = [bench_run._runq_wait_seconds(p.pid) for p in procs]
        # No event says "this much CPU was used"; poll the counters the meter reads.
        while min(bench_run._cpu_seconds(p.pid) for p in procs) < 0.2:
            assert all(p.poll() is None for p in procs), "a spinning process exited"
            time.sleep(0.02)
        after = [bench_run._runq_wait_seconds(p.pid) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(a >= b for a, b in zip(after, before, strict=True))
    assert sum(after) > sum(before)
    assert bench_run._runq_wait_seconds(procs[0].pid) == 0.0  # gone: nothing, no error


def test_host_cpu_counts_idle_and_steal_within_the_total(bench_run):
    first = bench_run._host_cpu()
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    second = bench_run._host_cpu()
    assert second["host_total"] > first["host_total"]
    for key in ("host_idle", "host_steal"):
        assert 0 <= second[key] - first[key] <= second["host_total"] - first["host_total"]


def test_host_shares_are_percentages_of_all_cpus_time_in_the_phase(bench_run):
    per_job = bench_run.CpuMeter.per_job_ms(
        {"host_total": 10.0, "host_idle": 4.0, "host_steal": 1.0},
        {"host_total": 12.0, "host_idle": 5.0, "host_steal": 1.1}, jobs=100)
    assert bench_run.host_pct(per_job, "host_idle") == pytest.approx(50.0)
    assert bench_run.host_pct(per_job, "host_steal") == pytest.approx(5.0)
    # Rows written before the meter, or by a peer driver without it: no figure.
    assert bench_run.host_pct({"workers": 1.0}, "host_idle") is None
