"""What one synchronous ZooKeeper request costs the process that makes it, with kazoo's
own hand-off to its connection thread and with zktasks' `send_now` (connection.py).

    .venv/bin/python bench/sync_requests.py [--requests N] [--rounds R] [--hogs H,...]

Starts a standalone ZooKeeper on loopback (fsync on) and, for each number of CPU hogs
(busy Python processes standing in for workers on the same CPUs; default 0 and 2), runs R
rounds of N sequential `create(sequence=True)` of 300 bytes with each client, alternating:

* kazoo:     a zktasks client whose requests go through kazoo's queue (the connection
             thread is woken through its socket pair and sends them);
* send_now:  a zktasks client as zktasks makes it (the calling thread sends).

Printed per round: requests/s, the process's CPU per request (all its threads) and its
context switches per request (voluntary and involuntary, all threads). Compare within a
run: the machine's speed moves between runs.
"""

import argparse
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")


def _hog(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _round(hosts: str, mode: str, requests: int) -> tuple[float, float, float]:
    from zktasks import client as clients
    from zktasks.conf import Options

    options = Options.from_params("default", {"OPTIONS": {"HOSTS": hosts, "ROOT": "/b"}})
    client = clients.new_client(options)
    if mode == "kazoo":
        del client._call  # kazoo's own _call: queue, wake the connection thread
    clients.start(client, options)
    try:
        client.ensure_path("/b")
        data = b"x" * 300
        for _ in range(200):  # warm up
            client.create("/b/w-", data, sequence=True)
        before, started, cpu = (resource.getrusage(resource.RUSAGE_SELF),
                                time.perf_counter(), time.process_time())
        for _ in range(requests):
            client.create("/b/x-", data, sequence=True)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        client.stop()
        client.close()
    switches = (after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw)
    return requests / elapsed, cpu / requests * 1e3, switches / requests


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="per round (3000)")
    parser.add_argument("--rounds", type=int, default=3, help="per client and load (3)")
    parser.add_argument("--hogs", default="0,2",
                        help="comma-separated numbers of busy processes (0,2)")
    args = parser.parse_args(argv)

    from zktasks.testing import ZooKeeperServer

    server = ZooKeeperServer(data_dir=tempfile.mkdtemp(prefix="zktasks-bench-"))
    server.start(timeout=60)
    print(f"ZooKeeper on {server.hosts}; {os.cpu_count()} CPUs; "
          f"{args.requests} sequential creates per round", flush=True)
    print(f"{'hogs':>4}  {'client':8} {'req/s':>7}  {'CPU ms/req':>10}  {'switches/req':>12}")
    try:
        for hogs in (int(h) for h in args.hogs.split(",")):
            stop = multiprocessing.Event()
            busy = [multiprocessing.Process(target=_hog, args=(stop,), daemon=True)
                    for _ in range(hogs)]
            for process in busy:
                process.start()
            try:
                for _ in range(args.rounds):
                    for mode in ("kazoo", "send_now"):
                        rate, cpu, switches = _round(server.hosts, mode, args.requests)
                        print(f"{hogs:>4}  {mode:8} {rate:7.0f}  {cpu:10.3f}  "
                              f"{switches:12.2f}", flush=True)
            finally:
                stop.set()
                for process in busy:
                    process.join(5)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
