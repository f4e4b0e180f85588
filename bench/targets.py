"""Issue 6's targets against the figures of one `bench/run.py` run.

`bench/run.py` prints this table last: each target, what each zktasks row measured in the
same run, and whether it met it. The throughput and memory targets are stated against the
peers' default configurations with no-op jobs and 2 worker processes; they are read from
the same rows as the ratio table above it. The scale and failover lines come from
`bench/scale.py` and `bench/failover.py`, which the full run starts after the peer matrix
(each with its own ZooKeeper), or say "not run".

Pure functions of the run's JSON-shaped data (rows as dicts), so that the verdicts can be
tested without servers (tests/unit/test_bench_targets.py).
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN, PIPELINED, TUNED = "zktasks", "zktasks-pipelined", "zktasks-pipelined-thread"
SYSTEMS = (PLAIN, PIPELINED, TUNED)
LABELS = {PLAIN: "plain", PIPELINED: "pipelined", TUNED: "tuned"}
LEGEND = ("plain = zktasks (a submit() loop, default workers); pipelined = zktasks-pipelined "
          "(the loop inside\nzktasks.pipelined()); tuned = zktasks-pipelined-thread (that, "
          "with runworker --pool thread --concurrency 16).\nok / NO: this row met the target "
          "in this run, or did not.")
SCALE_TARGET = 1_000_000
NOT_RUN = "not run"


@dataclass
class Line:
    """One target: a cell per zktasks row (or one for the whole run), and the verdict."""

    target: str
    cells: dict[str, str]        # system (or "run") -> the figure, with its mark
    verdict: str


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ok" if ok else " NO")


def _verdict(results: dict[str, bool | None]) -> str:
    """'met', 'NOT met', or which rows met it."""
    known = {system: ok for system, ok in results.items() if ok is not None}
    if not known:
        return NOT_RUN
    met = [LABELS.get(s, s) for s, ok in known.items() if ok]
    if len(met) == len(known):
        return "met"
    if not met:
        return "NOT met"
    return "met by " + ", ".join(met) + "; not by " + ", ".join(
        LABELS.get(s, s) for s, ok in known.items() if not ok)


def _row(rows: list[dict], system: str, workload: str = "noop", workers: int = 2,
         submitters: int = 1) -> dict | None:
    for row in rows:
        if (row.get("system") == system and row.get("matrix") and row.get("workload") == workload
                and row.get("workers") == workers and row.get("submitters", 1) == submitters):
            return row
    return None


def _per_row(rows, target: str, figure, bound: float, *, at_most: bool, fmt: str,
             submitters: int = 1) -> Line:
    """A target each zktasks row is held to: `figure(row)` against `bound`."""
    cells, results = {}, {}
    for system in SYSTEMS:
        row = _row(rows, system, submitters=submitters)
        value = None if row is None else figure(row)
        if value is None:
            cells[system], results[system] = "-", None
            continue
        ok = value <= bound if at_most else value >= bound
        cells[system], results[system] = fmt.format(value) + _mark(ok), ok
    return Line(target, cells, _verdict(results))


def _ratio(rows, peer: str, key: str, submitters: int):
    """zktasks row / the peer's row, same workload, workers and submitters."""
    theirs = _row(rows, peer, submitters=submitters)

    def figure(row):
        if theirs is None or not row.get(key) or not theirs.get(key):
            return None
        return row[key] / theirs[key]
    return figure, theirs


def lines(rows: list[dict], *, scale: dict | None = None, failover: dict | None = None,
          submitters: int = 1) -> list[Line]:
    """Every target of issue 6 that one run measures, in the issue's order."""
    out = []
    for peer, bound in (("celery", 1.5), ("dramatiq", 0.5)):
        figure, theirs = _ratio(rows, peer, "e2e_per_s", submitters)
        line = _per_row(rows, f"e2e >= {bound}x {peer} (no-op, 2 workers)", figure, bound,
                        at_most=False, fmt="{:.2f}x", submitters=submitters)
        if theirs is None:
            line.verdict = f"{NOT_RUN} ({peer} not in this run)"
        elif ceiling := _plain_ceiling(rows, theirs, submitters):
            line.cells["run"] = ceiling
        out.append(line)
    figure, theirs = _ratio(rows, "celery", "submit_per_s", submitters)
    line = _per_row(rows, "submit rate >= celery's, workers running", figure, 1.0,
                    at_most=False, fmt="{:.2f}x", submitters=submitters)
    if theirs is None:
        line.verdict = f"{NOT_RUN} (celery not in this run)"
    elif scale and scale.get("submit_per_s"):
        ratio = scale["submit_per_s"] / theirs["submit_per_s"]
        line.cells["run"] = f"and submit_many {ratio:.2f}x{_mark(ratio >= 1.0)}"
    out.append(line)
    # Upper bounds on a figure of each zktasks row.
    for target, key, limit, fmt in (
        ("latency p50 <= 8 ms (idle cluster)", "latency_p50_ms", 8.0, "{:.1f} ms"),
        ("latency p99 <= 30 ms (idle cluster)", "latency_p99_ms", 30.0, "{:.1f} ms"),
        ("write txns/job <= 3, one job at a time", "latency_zk_txns_per_job", 3.0, "{:.2f}"),
        ("write txns/job <= 3, one job a second", "sparse_zk_txns_per_job", 3.0, "{:.2f}"),
        ("write txns/job <= 3, streaming", "zk_txns_per_job", 3.0, "{:.2f}"),
        ("write txns/job <= 1.2 under a backlog", "drain_zk_txns_per_job", 1.2, "{:.2f}"),
    ):
        out.append(_per_row(rows, target, lambda r, key=key: r.get(key), limit,
                            at_most=True, fmt=fmt, submitters=submitters))
    out.append(_scale_line(scale))
    out += _failover_lines(failover)
    return out


def _plain_ceiling(rows, theirs: dict, submitters: int) -> str | None:
    """What the plain row could reach at best, against the peer: its submit() loop with
    no worker running. Each submit() returns once its job is written and fsync'd, so the
    loop's jobs cannot finish faster than it submits them, whatever the workers do."""
    plain = _row(rows, PLAIN, submitters=submitters)
    idle = None if plain is None else plain.get("submit_idle_per_s")
    if not idle or not theirs.get("e2e_per_s"):
        return None
    return (f"plain at best: {idle / theirs['e2e_per_s']:.2f}x, its submit() loop alone "
            f"(no worker running: {idle:,.0f}/s)")


def _scale_line(scale: dict | None) -> Line:
    target = f"{SCALE_TARGET:,} pending jobs: none lost or twice, leader <= 500 MB"
    if not scale:
        return Line(target, {}, NOT_RUN)
    problems = [f"{scale[key]:,} {what}" for key, what in (
        ("never_ran", "never ran"), ("ran_twice_or_more", "ran twice"),
        ("error_lines_in_worker_logs", "error lines"), ("failed_in_index", "failed"))
        if scale.get(key)]
    if scale.get("drain_per_s") is None:
        problems.append("the drain did not finish")
    leader = scale.get("leader_vmhwm_mb")
    if leader is None or leader > 500:
        problems.append(f"leader at {leader} MB")
    jobs = scale.get("jobs", 0)
    cell = (f"{jobs:,} jobs: submitted {scale.get('submit_per_s') or 0:,}/s, drained "
            f"{scale.get('drain_per_s') or 0:,}/s, leader {leader} MB"
            + (f"; {'; '.join(problems)}" if problems else ""))
    if problems:
        verdict = "NOT met"
    elif jobs < SCALE_TARGET:
        verdict = f"met at {jobs:,} jobs only"
    else:
        verdict = "met"
    return Line(target, {"run": cell}, verdict)


def _failover_lines(failover: dict | None) -> list[Line]:
    names = (("leader_kill", "assigned_s", "leader kill -> assigned by the new leader"),
             ("worker_kill", "running_s", "worker kill -> its jobs running elsewhere"))
    out = []
    target_x = (failover or {}).get("target_x", 1.5)
    summary = {(r["scenario"], r["measure"]): r for r in (failover or {}).get("summary", [])}
    for scenario, measure, label in names:
        found = summary.get((scenario, measure))
        if found is None:
            out.append(Line(f"{label} <= {target_x}x session timeout", {}, NOT_RUN))
            continue
        ok = found["median_x"] <= target_x
        out.append(Line(f"{label} <= {target_x}x session timeout",
                        {"run": f"median {found['median_s']:.2f} s = {found['median_x']:.2f}x "
                                f"(n={found['n']}, max {found['max_s']:.2f} s){_mark(ok)}"},
                        "met" if ok else "NOT met"))
    drains = (failover or {}).get("runs", {}).get("drain", [])
    if not drains:
        out.append(Line("graceful drain: 0 jobs repeated", {}, NOT_RUN))
    else:
        repeated = sum(d["repeated"] for d in drains)
        lost = sum(d["lost"] for d in drains)
        jobs = sum(d["jobs"] for d in drains)
        ok = repeated == 0 and lost == 0
        out.append(Line("graceful drain: 0 jobs repeated",
                        {"run": f"{repeated} of {jobs} repeated, {lost} lost{_mark(ok)}"},
                        "met" if ok else "NOT met"))
    return out


def format_lines(found: list[Line]) -> str:
    """The table: a column per zktasks row; a figure of the whole run (scale, failover, the
    submit_many rate) is written across those columns."""
    header = ["issue 6 target", *(LABELS[s] for s in SYSTEMS)]
    per_row = [line for line in found if set(line.cells) - {"run"}]
    widths = [max(len(x) for x in [header[0], *(line.target for line in found)])]
    widths += [max(len(x) for x in [LABELS[s], *(line.cells.get(s, "-") for line in per_row)])
               for s in SYSTEMS]
    span = sum(widths[1:]) + 2 * (len(SYSTEMS) - 1)

    def out(first: str, middle: list[str] | str, verdict: str) -> str:
        cells = (middle.ljust(span) if isinstance(middle, str)
                 else "  ".join(c.ljust(w) for c, w in zip(middle, widths[1:], strict=True)))
        return f"{first.ljust(widths[0])}  {cells}  {verdict}".rstrip()

    text = [out(header[0], header[1:], "verdict"),
            out("-" * widths[0], ["-" * w for w in widths[1:]], "-------")]
    for line in found:
        if set(line.cells) - {"run"}:
            text.append(out(line.target, [line.cells.get(s, "-") for s in SYSTEMS],
                            line.verdict))
            if "run" in line.cells:
                text.append(out("", line.cells["run"], ""))
        else:
            text.append(out(line.target, line.cells.get("run", "-"), line.verdict))
    return "\n".join(text) + "\n\n" + LEGEND
