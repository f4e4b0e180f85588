"""The peer: zktasks' job pipeline on raw kazoo, to compare against ZooKeeper's bare cost.

Raw kazoo, batched multis, no task execution: no Django, no dill, no HMAC, no task
processes, small JSON records. Per job it makes the same transitions zktasks makes,
each one ZooKeeper multi:

    submit  create {root}/status/{id} + create {root}/jobs/{id}            (submitter)
    assign  one multi per batch of up to 100 jobs:
            create {root}/assign/{worker}/{id} + delete {root}/jobs/{id}  (assigner)
    start   check {root}/assign/{worker}/{id} + set {root}/status/{id}    (worker)
    finish  delete {root}/assign/{worker}/{id} + set {root}/status/{id}   (worker)

plus one read of the status before starting. The assigner caps nothing (zktasks' leader
assigns at most concurrency + prefetch jobs per worker at a time), and the worker lists its
assignments again only when its runners are about to run out of work.

`python -m bench.peer serve --hosts H --root R --threads 2` runs the assigner and the
worker in one process until SIGTERM; bench/run.py imports PeerClient to submit and wait.
"""

import argparse
import json
import os
import queue
import secrets
import signal
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

BATCH = 100


def _paths(root: str) -> dict[str, str]:
    return {
        "jobs": f"{root}/jobs",
        "status": f"{root}/status",
        "assign": f"{root}/assign",
        "workers": f"{root}/workers",
    }


def _dumps(data: dict) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _failed(results) -> list:
    return [r for r in results if isinstance(r, Exception)]


def new_job_id() -> str:
    # Time first so that a sort of /jobs is FIFO, as zktasks' ids are.
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


class PeerClient:
    """The submitting side, used in the bench process."""

    def __init__(self, hosts: str, root: str):
        self.paths = _paths(root)
        self.client = KazooClient(hosts=hosts, timeout=10.0)
        self.client.start(timeout=15.0)
        for path in self.paths.values():
            self.client.ensure_path(path)

    @property
    def queue_path(self) -> str:
        return self.paths["jobs"]

    @property
    def assignments_path(self) -> str:
        return self.paths["assign"]

    def submit(self) -> str:
        job_id = new_job_id()
        txn = self.client.transaction()
        txn.create(f"{self.paths['status']}/{job_id}",
                   _dumps({"state": "READY", "enqueued_at": time.time()}))
        txn.create(f"{self.paths['jobs']}/{job_id}", b"")
        failed = _failed(txn.commit())
        if failed:
            raise failed[0]
        return job_id

    def wait(self, job_id: str, timeout: float) -> dict:
        """Block on the status znode's watch until DONE; return the status record."""
        deadline = time.monotonic() + timeout
        changed = threading.Event()
        path = f"{self.paths['status']}/{job_id}"
        while True:
            changed.clear()
            data, _ = self.client.get(path, watch=lambda event: changed.set())
            record = json.loads(data)
            if record["state"] == "DONE":
                return record
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"peer job {job_id} not done within {timeout}s "
                                   f"(state {record['state']})")
            changed.wait(remaining)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def serve(hosts: str, root: str, threads: int) -> int:
    """Run the assigner and a worker with `threads` runner threads until SIGTERM."""
    paths = _paths(root)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=15.0)
    for path in paths.values():
        client.ensure_path(path)
    worker_id = f"peer-{os.getpid()}-{secrets.token_hex(3)}"
    mine = f"{paths['assign']}/{worker_id}"
    txn = client.transaction()
    txn.create(mine, b"")
    txn.create(f"{paths['workers']}/{worker_id}", b"", ephemeral=True)
    if failed := _failed(txn.commit()):
        raise failed[0]

    jobs_changed = threading.Event()
    mine_changed = threading.Event()
    ready: queue.SimpleQueue[str] = queue.SimpleQueue()
    errors: list[BaseException] = []

    def assigner() -> None:
        while not stop.is_set():
            jobs_changed.clear()
            names = sorted(client.get_children(paths["jobs"],
                                               watch=lambda event: jobs_changed.set()))
            for start in range(0, len(names), BATCH):
                txn = client.transaction()
                for name in names[start:start + BATCH]:
                    txn.create(f"{mine}/{name}", b"")
                    txn.delete(f"{paths['jobs']}/{name}")
                txn.commit()  # a refused batch is simply re-read on the next pass
            jobs_changed.wait(1.0)

    def runner() -> None:
        while not stop.is_set():
            try:
                job_id = ready.get(timeout=0.2)
            except queue.Empty:
                continue
            status = f"{paths['status']}/{job_id}"
            assignment = f"{mine}/{job_id}"
            try:
                data, stat = client.get(status)
            except NoNodeError:
                continue
            record = json.loads(data)
            record.update(state="RUNNING", started_at=time.time(), worker=worker_id)
            txn = client.transaction()
            txn.check(assignment, -1)
            txn.set_data(status, _dumps(record), version=stat.version)
            results = txn.commit()
            if _failed(results):
                continue
            # (no task execution)
            record.update(state="DONE", finished_at=time.time())
            txn = client.transaction()
            txn.delete(assignment)
            txn.set_data(status, _dumps(record), version=results[1].version)
            txn.commit()

    def guarded(target):
        def run():
            try:
                target()
            except BaseException as exc:  # report, and stop the process
                errors.append(exc)
                stop.set()
        return run

    workers = [threading.Thread(target=guarded(assigner), name="peer-assigner", daemon=True)]
    workers += [threading.Thread(target=guarded(runner), name=f"peer-run-{i}", daemon=True)
                for i in range(threads)]
    for thread in workers:
        thread.start()
    known: set[str] = set()
    try:
        while not stop.is_set():
            mine_changed.clear()
            current = set(client.get_children(mine, watch=lambda event: mine_changed.set()))
            new = current - known
            known = (known & current) | new
            for job_id in sorted(new):
                ready.put(job_id)
            mine_changed.wait(1.0)
            # Re-list our assignments only when the runners are about to run dry: each
            # listing returns every job assigned to us, so listing on every change
            # would cost O(backlog) per job.
            while ready.qsize() > threads and not stop.is_set():
                time.sleep(0.002)
    finally:
        stop.set()
        for thread in workers:
            thread.join(10)
        try:
            txn = client.transaction()
            txn.delete(f"{paths['workers']}/{worker_id}")
            txn.commit()
        finally:
            client.stop()
            client.close()
    if errors:
        print(f"peer worker failed: {errors[0]!r}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run assigner + worker until SIGTERM")
    serve_cmd.add_argument("--hosts", required=True)
    serve_cmd.add_argument("--root", required=True)
    serve_cmd.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    return serve(args.hosts, args.root, args.threads)


if __name__ == "__main__":
    sys.exit(main())
