"""RQ with its default worker class (rq.Worker: it forks a work horse for every job)."""

import os

from redis import Redis
from rq import Queue

from bench.peers import Driver as BaseDriver
from bench.peers import bin_path, work

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def noop():
    return work.noop()


def sleep10():
    return work.sleep10()


class Driver(BaseDriver):
    def __init__(self, system, server):
        super().__init__(system, server)
        self.queue = Queue("default", connection=Redis.from_url(URL))

    def worker_cmd(self, name: str) -> list[str]:
        return [bin_path("rq"), "worker", "--url", URL, "--name", name, "default"]

    def submit(self, workload: str):
        return self.queue.enqueue(f"bench.peers.rq_peer.{workload}")

    def wait(self, handle, timeout: float) -> dict:
        result = handle.latest_result(timeout=max(1, round(timeout)))
        if result is None:
            raise TimeoutError(f"rq job {handle.id} has no result after {timeout:.0f}s")
        if result.type != result.Type.SUCCESSFUL:
            raise RuntimeError(f"rq job {handle.id} ended {result.type}: {result.exc_string}")
        return result.return_value

    def versions(self) -> str:
        import rq

        return f"rq {rq.__version__}"

    def close(self) -> None:
        self.queue.connection.close()
