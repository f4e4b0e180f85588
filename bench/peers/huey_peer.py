"""Huey with RedisHuey's defaults: one consumer process, one worker thread (-w 1 -k thread).

Huey's default result wait polls Redis (50 ms first, then backoff 1.15), because
RedisHuey's `notify_result` is off by default: that shows in its latency.
"""

import os

from huey import RedisHuey

from bench.peers import Driver as BaseDriver
from bench.peers import bin_path, work

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

huey = RedisHuey("bench", url=URL)


@huey.task()
def noop():
    return work.noop()


@huey.task()
def sleep10():
    return work.sleep10()


TASKS = {"noop": noop, "sleep10": sleep10}


class Driver(BaseDriver):
    def worker_cmd(self, name: str) -> list[str]:
        return [bin_path("huey_consumer"), "bench.peers.huey_peer.huey", "--workers", "1",
                "--worker-type", "thread"]

    def submit(self, workload: str):
        return TASKS[workload]()

    def wait(self, handle, timeout: float) -> dict:
        return handle.get(blocking=True, timeout=timeout)

    def versions(self) -> str:
        import huey as huey_module

        return f"huey {huey_module.__version__}"
