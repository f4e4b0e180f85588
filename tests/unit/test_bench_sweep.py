"""bench/run.py's submitter sweep, the parts that need no servers: the option's parsing
and the pairing of ratios by submitter threads (a sweep runs each scenario once per
count; zktasks with 4 threads must be compared with a peer with 4, never with 1)."""

import importlib
import os

import pytest


@pytest.fixture
def bench_run(monkeypatch):
    # bench/run.py points DJANGO_SETTINGS_MODULE at its own settings when imported;
    # setting it here first makes monkeypatch put the test run's value back afterwards.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", os.environ["DJANGO_SETTINGS_MODULE"])
    return importlib.import_module("bench.run")


def test_submitters_takes_one_count_or_a_list_in_order_once_each(bench_run):
    assert bench_run.parse_args(["--submitters", "4"]).submitters == (4,)
    assert bench_run.parse_args(["--submitters", "16,1,4,16"]).submitters == (16, 1, 4)
    assert bench_run.parse_args([]).submitters == (1,)


@pytest.mark.parametrize("value, message", [
    ("1,x", "is not a count or a comma-separated list of counts"),
    ("1,,4", "is not a count or a comma-separated list of counts"),
    ("0", "--submitters must be between 1 and --jobs"),
    ("1,2001", "--submitters must be between 1 and --jobs"),
])
def test_submitters_refuses_what_is_not_a_list_of_counts_up_to_jobs(bench_run, capsys,
                                                                     value, message):
    with pytest.raises(SystemExit) as exc:
        bench_run.parse_args(["--submitters", value, "--jobs", "2000"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_ratios_pair_rows_by_submitter_threads(bench_run):
    def row(system, submitters, e2e):
        return bench_run.Row(f"{system}-noop-2w", 2, "process", 1, 100, system=system,
                             workload="noop", matrix=True, submitters=submitters,
                             e2e_per_s=e2e)

    rows = [row("zktasks", 1, 500.0), row("celery", 1, 1000.0),
            row("zktasks", 4, 800.0), row("celery", 4, 400.0)]
    ratios = bench_run.ratio_rows(rows)
    assert [(r["submitters"], r["peer"], r["e2e jobs/s"]) for r in ratios] == [
        (1, "celery", 0.5), (4, "celery", 2.0)]
    table = bench_run.format_ratios(ratios, sweep=True)
    assert table.splitlines()[0].split()[:5] == ["workload", "workers", "submitters",
                                                 "zktasks", "/"]


def test_a_sweep_table_shows_each_rows_submitters(bench_run):
    rows = [bench_run.Row("zktasks-noop-2w", 2, "process", 1, 100, submitters=n)
            for n in (1, 16)]
    lines = bench_run.format_table(rows, bench_run.with_submitters(bench_run.COLUMNS),
                                   left=4).splitlines()
    assert lines[0].split()[:3] == ["scenario", "submitters", "workers"]
    assert [line.split()[1] for line in lines[2:]] == ["1", "16"]
