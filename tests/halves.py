"""Run the whole suite as two pytest processes at once; `make test` calls this.

Most of the suite waits rather than computes: for sessions to expire, servers to restart,
runworker subprocesses to start and drain. In one process it took about 20 minutes on a
2-CPU machine (2 December 2026); in two, about 11. The first half is tests/integration,
the second everything else under tests/ (unit, dashboard, e2e and any directory added
later), each with its own session ZooKeeper; zktasks.testing's port claims keep their
servers off each other's ports.

Both halves' lines are shown as they come, each tagged with its half, and a failed
half's short test summary again at the end. The exit status is the first non-zero one
of the two (a half that a `-k` left without tests does not count). Arguments go to both
pytest runs (`make test PYTEST_ARGS=...` runs one process instead, with only those).

    python tests/halves.py [PYTEST OPTION ...]
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIRST = ["tests/integration"]


def halves() -> list[tuple[str, list[str]]]:
    """The two halves, as (tag, paths relative to the repository)."""
    rest = sorted(
        f"tests/{entry.name}" for entry in TESTS.iterdir()
        if f"tests/{entry.name}" not in FIRST and (
            (entry.is_dir() and any(entry.rglob("test_*.py")))
            or (entry.is_file() and entry.name.startswith("test_")
                and entry.suffix == ".py")))
    return [("integration", FIRST), ("rest", rest)]


def _relay(tag: str, proc: subprocess.Popen, lock: threading.Lock,
           summary: list[str]) -> None:
    """Pass a half's lines on, tagged; keep its short test summary for the end."""
    for line in proc.stdout:
        if summary or "short test summary info" in line:
            summary.append(line)
        with lock:
            sys.stdout.write(f"[{tag}] {line}")
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    lock = threading.Lock()
    began = time.monotonic()
    runs = []
    for tag, paths in halves():
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *argv, *paths], cwd=TESTS.parent,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # A process group each: a terminal's Ctrl-C reaches this process alone, which
            # passes it on once (a second SIGINT would make pytest abort unreported).
            process_group=0)
        summary: list[str] = []
        relay = threading.Thread(target=_relay, args=(tag, proc, lock, summary),
                                 daemon=True)
        relay.start()
        runs.append((tag, paths, proc, relay, summary))
    print(f"running the suite in {len(runs)} pytest processes: "
          + "; ".join(f"{tag} = {' '.join(paths)}" for tag, paths, *_ in runs), flush=True)

    def forward(signum, frame):
        # Ctrl-C or a CI's SIGTERM: both halves get SIGINT, on which pytest stops after
        # its fixtures' teardowns (servers stopped, trees deleted) and reports.
        for _, _, proc, *_ in runs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = []
    for _, _, proc, relay, _ in runs:
        codes.append(proc.wait())
        relay.join()
    took = time.monotonic() - began
    for (tag, _, _, _, summary), code in zip(runs, codes, strict=True):
        if code != 0 and summary:  # the failures together, not between the other's lines
            print(f"\n{tag}: " + "".join(summary), end="", flush=True)
    print(f"suite done in {took / 60:.1f} min: "
          + ", ".join(f"{run[0]} exit {code}" for run, code in zip(runs, codes, strict=True)),
          flush=True)
    # 5 is pytest's "no tests collected": a half that a -k left empty is no failure.
    return next((code for code in codes if code not in (0, 5)), 5 if set(codes) == {5} else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
