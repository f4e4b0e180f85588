"""What task processes cost a worker: forks of a fork server that set Django up once
(the default, zktasks/forkserver.py) against spawned interpreters that each set it up.

    .venv/bin/python bench/task_processes.py [--slots N] [--jobs J] [--rounds R]

No ZooKeeper: a ProcessRunner as runworker makes it (`--pool process --concurrency N`,
default one slot per CPU), in a fresh Python process per round, the two start methods
alternating. Printed per round:

* ready s:      from starting the task processes to all of them set up (wait_ready);
* PSS MB:       the proportional set size of the whole tree (this process, standing in
                for runworker, plus its descendants: the task processes, the fork server,
                multiprocessing's resource tracker), a page shared by n processes counted
                1/n in each, so once in all;
* replaced/s:   no-op jobs run with --max-tasks-per-child 1, each job in a new task
                process (a task that kills its process costs the same replacement).

Compare within a run: the machine's speed moves between runs.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")


def _round(method: str, slots: int, jobs: int) -> dict:
    import django

    django.setup()
    from bench.peers.servers import pss_mb
    from bench.run import _tree
    from bench.tasks import noop
    from zktasks import serialization
    from zktasks.executor import Execution, ProcessRunner

    blob = serialization.dump_call(noop.func, (), {}, task_path=noop.module_path)

    def execution(number: int) -> Execution:
        return Execution(job_id=f"bench-{number}", blob=blob, record_json=b"{}",
                         timeout=None)

    runner = ProcessRunner(slots, start_method=method)
    began = time.perf_counter()
    runner.start()
    runner.wait_ready()
    ready = time.perf_counter() - began
    for number in range(slots * 2):  # each slot runs once: its lazily touched pages
        assert runner.run(execution(number)).ok
    time.sleep(0.5)  # let the task processes settle into their idle wait
    pss = pss_mb(_tree(os.getpid()))
    runner.stop()

    recycling = ProcessRunner(1, max_tasks=1, start_method=method)
    recycling.start()
    recycling.wait_ready()
    began = time.perf_counter()
    for number in range(jobs):
        assert recycling.run(execution(number)).ok
    replaced = jobs / (time.perf_counter() - began)
    recycling.stop()
    return {"method": method, "ready_s": ready, "pss_mb": pss, "replaced_per_s": replaced,
            "forked": runner.forked}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 2,
                        help="task processes, as --concurrency (one per CPU)")
    parser.add_argument("--jobs", type=int, default=50,
                        help="no-op jobs run with --max-tasks-per-child 1 (50)")
    parser.add_argument("--rounds", type=int, default=3, help="per start method (3)")
    parser.add_argument("--round", choices=("forkserver", "spawn"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.round:
        print(json.dumps(_round(args.round, args.slots, args.jobs)))
        return 0

    print(f"{os.cpu_count()} CPUs; {args.slots} task processes; {args.jobs} jobs with "
          "--max-tasks-per-child 1", flush=True)
    print(f"{'start method':12}  {'ready s':>7}  {'PSS MB':>7}  {'replaced/s':>10}  setup")
    for _ in range(args.rounds):
        for method in ("forkserver", "spawn"):
            out = subprocess.run(
                [sys.executable, __file__, "--round", method, "--slots", str(args.slots),
                 "--jobs", str(args.jobs)],
                check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(f"{method:12}  {row['ready_s']:7.2f}  {row['pss_mb']:7.1f}  "
                  f"{row['replaced_per_s']:10.1f}  "
                  f"{'shared' if row['forked'] else 'each'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
