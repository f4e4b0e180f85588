"""bench/targets.py: issue 6's targets read from one run's figures, the parts that need no
servers. A row meets a target or not by its own figure in that run; the verdict says which
rows met it; a target whose figures the run did not make says "not run", never "met"."""

import pytest

from bench import targets


def row(system, **figures):
    return {"system": system, "matrix": True, "workload": "noop", "workers": 2,
            "submitters": 1, **figures}


ROWS = [
    row("zktasks", e2e_per_s=400, submit_per_s=400, submit_idle_per_s=720,
        latency_p50_ms=8.4, latency_p99_ms=21, latency_zk_txns_per_job=4.0,
        zk_txns_per_job=2.55, drain_zk_txns_per_job=0.3,
        sparse_zk_txns_per_job=3.8),
    row("zktasks-pipelined", e2e_per_s=1000, submit_per_s=2600, latency_p50_ms=7.3,
        latency_p99_ms=16, latency_zk_txns_per_job=4.0, zk_txns_per_job=0.34,
        drain_zk_txns_per_job=0.28),
    row("zktasks-pipelined-thread", e2e_per_s=1800, submit_per_s=3300, latency_p50_ms=7.3,
        latency_p99_ms=14, latency_zk_txns_per_job=4.0, zk_txns_per_job=0.1,
        drain_zk_txns_per_job=0.06),
    row("celery", e2e_per_s=600, submit_per_s=620),
    row("dramatiq", e2e_per_s=1600, submit_per_s=1560),
    # Not compared: another workload, another worker count, another submitter count.
    row("celery", e2e_per_s=1, submit_per_s=1, workload="sleep10"),
    row("celery", e2e_per_s=1, submit_per_s=1, workers=1),
    row("celery", e2e_per_s=1, submit_per_s=1, submitters=4),
]

SCALE = {"jobs": 1_000_000, "submit_per_s": 5804, "drain_per_s": 1625, "never_ran": 0,
         "ran_twice_or_more": 0, "error_lines_in_worker_logs": 0, "failed_in_index": 0,
         "leader_vmhwm_mb": 66.0}

FAILOVER = {"target_x": 1.5, "summary": [
    {"scenario": "leader_kill", "measure": "assigned_s", "n": 5, "median_s": 4.13,
     "median_x": 1.03, "max_s": 4.21},
    {"scenario": "worker_kill", "measure": "running_s", "n": 5, "median_s": 6.4,
     "median_x": 1.6, "max_s": 7.0},
], "runs": {"drain": [{"jobs": 18, "repeated": 0, "lost": 0}] * 5}}


def by_target(found):
    return {line.target: line for line in found}


def test_each_row_is_held_to_the_target_by_its_own_figure_against_the_same_run_s_peer():
    found = by_target(targets.lines(ROWS, scale=SCALE, failover=FAILOVER))
    celery = found["e2e >= 1.5x celery (no-op, 2 workers)"]
    assert {k: v for k, v in celery.cells.items() if k != "run"} == {
        "zktasks": "0.67x NO", "zktasks-pipelined": "1.67x ok",
        "zktasks-pipelined-thread": "3.00x ok"}
    assert celery.verdict == "met by pipelined, tuned; not by plain"
    # The plain loop's bound, from its own submit loop with no worker running.
    assert celery.cells["run"] == ("plain at best: 1.20x, its submit() loop alone "
                                   "(no worker running: 720/s)")
    dramatiq = found["e2e >= 0.5x dramatiq (no-op, 2 workers)"]
    assert dramatiq.cells["zktasks-pipelined"] == "0.62x ok"
    assert dramatiq.verdict == "met by pipelined, tuned; not by plain"
    assert dramatiq.cells["run"].startswith("plain at best: 0.45x,")
    submit = found["submit rate >= celery's, workers running"]
    assert submit.cells["zktasks"] == "0.65x NO"
    assert submit.cells["run"] == "and submit_many 9.36x ok"  # scale's submit_many rate
    assert found["latency p50 <= 8 ms (idle cluster)"].verdict == \
        "met by pipelined, tuned; not by plain"
    assert found["latency p99 <= 30 ms (idle cluster)"].verdict == "met"
    # Four for a job alone here (as before 1 December: submit, assign, start, finish).
    assert found["write txns/job <= 3, one job at a time"].verdict == "NOT met"
    # One job a second, measured for the plain row only here: the others are not run.
    sparse = found["write txns/job <= 3, one job a second"]
    assert sparse.cells["zktasks"] == "3.80 NO"
    assert sparse.verdict.startswith("NOT met")
    assert found["write txns/job <= 3, streaming"].verdict == "met"
    assert found["write txns/job <= 1.2 under a backlog"].verdict == "met"


def test_scale_and_failover_are_judged_by_their_harnesses_figures():
    found = by_target(targets.lines(ROWS, scale=SCALE, failover=FAILOVER))
    scale = found["1,000,000 pending jobs: none lost or twice, leader <= 500 MB"]
    assert scale.verdict == "met"
    assert scale.cells["run"] == ("1,000,000 jobs: submitted 5,804/s, drained 1,625/s, "
                                  "leader 66.0 MB")
    assert found["leader kill -> assigned by the new leader <= 1.5x session timeout"
                 ].verdict == "met"
    worker = found["worker kill -> its jobs running elsewhere <= 1.5x session timeout"]
    assert worker.verdict == "NOT met" and worker.cells["run"].endswith(" NO")
    assert found["graceful drain: 0 jobs repeated"].cells["run"] == "0 of 90 repeated, 0 lost ok"


@pytest.mark.parametrize("change, verdict", [
    ({"ran_twice_or_more": 3}, "NOT met"),
    ({"never_ran": 1}, "NOT met"),
    ({"error_lines_in_worker_logs": 2}, "NOT met"),
    ({"leader_vmhwm_mb": 612.0}, "NOT met"),
    ({"drain_per_s": None}, "NOT met"),
    ({"jobs": 20_000}, "met at 20,000 jobs only"),
])
def test_a_scale_run_with_a_fault_or_fewer_jobs_is_not_called_met(change, verdict):
    line = targets._scale_line({**SCALE, **change})
    assert line.verdict == verdict, line


def test_what_the_run_did_not_measure_says_not_run():
    found = by_target(targets.lines([r for r in ROWS if r["system"] != "dramatiq"]))
    assert found["e2e >= 0.5x dramatiq (no-op, 2 workers)"].verdict == \
        "not run (dramatiq not in this run)"
    assert found["1,000,000 pending jobs: none lost or twice, leader <= 500 MB"
                 ].verdict == "not run"
    assert found["graceful drain: 0 jobs repeated"].verdict == "not run"
    only_ours = by_target(targets.lines([r for r in ROWS if r["system"].startswith("zk")]))
    assert only_ours["e2e >= 1.5x celery (no-op, 2 workers)"].verdict.startswith("not run")
    assert only_ours["latency p50 <= 8 ms (idle cluster)"].verdict != "not run"
    assert targets.lines([])[3].verdict == "not run"  # no zktasks row: nothing to judge


def test_the_table_has_a_column_per_row_and_spans_the_run_s_figures():
    text = targets.format_lines(targets.lines(ROWS, scale=SCALE, failover=FAILOVER))
    lines = text.splitlines()
    assert lines[0].split() == ["issue", "6", "target", "plain", "pipelined", "tuned",
                                "verdict"]
    assert any(line.startswith("e2e >= 1.5x celery") and "0.67x NO" in line
               and line.endswith("met by pipelined, tuned; not by plain") for line in lines)
    assert any("and submit_many 9.36x ok" in line for line in lines)
    assert any(line.startswith("1,000,000 pending jobs") and "drained 1,625/s" in line
               and line.endswith("met") for line in lines)
    assert "plain = zktasks (a submit() loop, default workers)" in text
