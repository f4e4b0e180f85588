"""Summarize py-spy raw (collapsed) stacks: where a worker spends its CPU.

    .venv/bin/python bench/profile_summary.py PROFILE.txt [--top 15]

For each process in the file (the worker, its task processes), print the share of
samples by thread, the functions with the most samples on top of the stack (self), and
the zktasks / kazoo / django functions with the most samples anywhere in it (inclusive).
py-spy samples only threads that are running (not idle), so this is CPU time.
"""

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

_PROCESS_PREFIX = re.compile(r'process (\d+):"([^"]*)";')
_THREAD = re.compile(r'^thread \((0x[0-9A-Fa-f]+)\)$')


def parse(path: Path) -> dict:
    """{process label: {"total": n, "self": Counter, "incl": Counter, "threads": Counter}}."""
    procs: dict = defaultdict(lambda: {"total": 0, "self": Counter(), "incl": Counter(),
                                       "threads": Counter()})
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        # Process frames come first; their command lines may hold ";" themselves.
        labels = []
        while m := _PROCESS_PREFIX.match(stack):
            labels.append(_short_process(m.group(2)))
            stack = stack[m.end():]
        thread = "?"
        rest = []
        for frame in stack.split(";"):
            m = _THREAD.match(frame)
            if m:
                thread = m.group(1)
                continue
            rest.append(frame)
        label = labels[-1] if labels else "?"
        entry = procs[label]
        entry["total"] += n
        entry["threads"][_thread_name(rest, thread)] += n
        if rest:
            entry["self"][_strip(rest[-1])] += n
            for frame in {_strip(f) for f in rest}:
                entry["incl"][frame] += n
    return procs


def _short_process(cmdline: str) -> str:
    if "spawn_main" in cmdline:
        return "task process(es)"
    if "runworker" in cmdline:
        return "runworker"
    return cmdline[:60]


def _strip(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)" so lines of one function merge.
    m = re.match(r"^(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    func, where = m.groups()
    where = where.replace(".venv/lib/python3.13/site-packages/", "")
    return f"{func} ({where})"


def _thread_name(frames: list[str], thread: str) -> str:
    # Name a thread by its entry function: the zktasks/kazoo loop it runs.
    for frame in frames:
        f = _strip(frame)
        for marker in ("_runner_loop", "_main_loop", "_lead ", "_connect_attempt",
                       "_connect_loop", "zk_loop", "_thread_loop", "run (bench/peer",
                       "assigner", "runner", "serve"):
            if marker in f:
                return f.split(" (")[0]
    return thread


def report(path: Path, top: int = 15, out=sys.stdout) -> None:
    procs = parse(path)
    grand = sum(p["total"] for p in procs.values()) or 1
    print(f"== {path.name}: {grand} samples", file=out)
    for label, entry in sorted(procs.items(), key=lambda kv: -kv[1]["total"]):
        total = entry["total"] or 1
        print(f"  [{label}] {entry['total']} samples ({100 * entry['total'] / grand:.0f}%)",
              file=out)
        threads = ", ".join(f"{name} {100 * n / total:.0f}%"
                            for name, n in entry["threads"].most_common(6))
        print(f"    threads: {threads}", file=out)
        print("    self (top of stack):", file=out)
        for frame, n in entry["self"].most_common(top):
            print(f"      {100 * n / total:5.1f}%  {frame}", file=out)
        print("    inclusive, zktasks/kazoo/django/dill frames:", file=out)
        shown = 0
        for frame, n in entry["incl"].most_common():
            if any(k in frame for k in ("zktasks/", "kazoo/", "django/", "dill/",
                                        "bench/", "logging/", "json/")):
                print(f"      {100 * n / total:5.1f}%  {frame}", file=out)
                shown += 1
                if shown >= top:
                    break


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/profile_summary.py")
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    for path in args.paths:
        report(path, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
