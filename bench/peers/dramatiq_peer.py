"""Dramatiq with its Redis broker and the Results middleware on Redis.

`dramatiq --processes 1 --threads 1`: one worker process with one worker thread under
dramatiq's supervisor (its defaults are one process per CPU and 8 threads each).
"""

import os
import sys

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from bench.peers import Driver as BaseDriver
from bench.peers import defaults, work

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=RedisBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def noop():
    return work.noop()


@dramatiq.actor(store_results=True)
def sleep10():
    return work.sleep10()


TASKS = {"noop": noop, "sleep10": sleep10}


class Driver(BaseDriver):
    def worker_cmd(self, name: str) -> list[str]:
        # With --defaults, Dramatiq's own: one process per CPU, 8 threads each.
        sizes = [] if defaults() else ["--processes", "1", "--threads", "1"]
        return [sys.executable, "-m", "dramatiq", "bench.peers.dramatiq_peer", *sizes]

    def submit(self, workload: str):
        return TASKS[workload].send()

    def wait(self, handle, timeout: float) -> dict:
        return handle.get_result(block=True, timeout=int(timeout * 1000))

    def versions(self) -> str:
        return f"dramatiq {dramatiq.__version__}"
