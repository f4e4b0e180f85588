"""Celery 5 with Redis as broker and result backend, prefork pool, one child per worker.

BENCH_CELERY_RELIABLE=1 (system "celery-reliable") sets the settings Celery's docs give
for not losing a job when a worker dies: task_acks_late and worker_prefetch_multiplier 1.
Everything else is Celery's default (prefetch multiplier 4, early ack, mingle, gossip,
heartbeats).
"""

import os
import sys

from celery import Celery

from bench.peers import Driver as BaseDriver
from bench.peers import defaults, work

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("bench", broker=URL, backend=URL)
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("BENCH_CELERY_RELIABLE") == "1":
    app.conf.task_acks_late = True
    app.conf.worker_prefetch_multiplier = 1


@app.task(name="bench.noop")
def noop():
    return work.noop()


@app.task(name="bench.sleep10")
def sleep10():
    return work.sleep10()


TASKS = {"noop": noop, "sleep10": sleep10}


class Driver(BaseDriver):
    def worker_cmd(self, name: str) -> list[str]:
        # -c 1: one prefork child per worker process; with --defaults, Celery's own
        # default (one per CPU).
        concurrency = [] if defaults() else ["--concurrency", "1"]
        # No --loglevel: Celery's default (WARNING), like every other peer's. INFO would
        # write two lines per job ("Task ... received", "... succeeded").
        return [sys.executable, "-m", "celery", "-A", "bench.peers.celery_peer", "worker",
                "--pool", "prefork", *concurrency, "--hostname", f"{name}@%h"]

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_CELERY_RELIABLE": "1" if self.system == "celery-reliable" else "0"}

    def submit(self, workload: str):
        return TASKS[workload].delay()

    def wait(self, handle, timeout: float) -> dict:
        return handle.get(timeout=timeout)

    def versions(self) -> str:
        import celery
        import kombu

        return f"celery {celery.__version__}, kombu {kombu.__version__}"
