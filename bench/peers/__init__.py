"""The peers of bench/run.py: the same workloads through other task queues.

One small module per system. Each defines the two workloads as that system's tasks
(`noop` and `sleep10`, see work.py) and a `Driver` that submits, waits and names the
command of one worker process. bench/run.py starts the servers (servers.py), the worker
processes and the phases; these modules never start anything themselves.

Every worker process runs one job at a time (concurrency 1), whatever the system, so
that "N worker processes" means the same thing in every row: see bench/README.md. With
`bench/run.py --defaults`, each system runs with its own default concurrency instead
(Celery: one prefork child per CPU; Dramatiq: a process per CPU, 8 threads each; zktasks:
one runner per CPU; RQ, Huey and django-tasks-db: one job at a time, their defaults).
The peers are benchmark-only dependencies: `pip install -e '.[bench]'`.
"""

import importlib
import sys
from pathlib import Path

# system name -> (module, server it needs)
SYSTEMS = {
    "celery": ("bench.peers.celery_peer", "redis"),
    "celery-reliable": ("bench.peers.celery_peer", "redis"),
    "rq": ("bench.peers.rq_peer", "redis"),
    "huey": ("bench.peers.huey_peer", "redis"),
    "dramatiq": ("bench.peers.dramatiq_peer", "redis"),
    "django-tasks-db": ("bench.peers.dbtasks_peer", "postgres"),
}

def defaults() -> bool:
    """bench/run.py --defaults: each system with its own default concurrency."""
    import os

    return os.environ.get("BENCH_PEER_DEFAULTS") == "1"


# What to `pip install` when a module is missing (the `bench` extra has them all).
INSTALL_HINT = ".venv/bin/pip install -e '.[bench]'  (or: make bench)"


class PeerMissing(Exception):
    """A peer's Python package is not installed; the message says how to install it."""


def driver(system: str, server) -> "Driver":
    module_name, _ = SYSTEMS[system]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PeerMissing(f"{system}: {exc}; install the peers with {INSTALL_HINT}") from exc
    return module.Driver(system, server)


def bin_path(name: str) -> str:
    """A console script installed next to this Python (celery, rq, huey_consumer, ...)."""
    return str(Path(sys.executable).parent / name)


class Driver:
    """What bench/run.py needs from a peer. Handles are whatever submit() returns."""

    system: str
    settings_module = "bench.settings"

    def __init__(self, system: str, server):
        self.system = system
        self.server = server

    def worker_cmd(self, name: str) -> list[str]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return {}

    def submit(self, workload: str):
        raise NotImplementedError

    def wait(self, handle, timeout: float) -> dict:
        """Block until the job is done; return what the job returned (work.stamp(): when
        it finished, in epoch seconds, and the ids of the process that ran it)."""
        raise NotImplementedError

    def wait_all(self, handles: list, timeout: float) -> list[dict]:
        return [self.wait(h, timeout) for h in handles]

    def reset(self) -> None:
        """Empty the queues and results before a scenario."""
        self.server.reset()

    def versions(self) -> str:
        return ""

    def close(self) -> None:
        pass


# The import names each system needs (checked before anything starts).
_MODULES = {
    "celery": ("celery", "redis"),
    "celery-reliable": ("celery", "redis"),
    "rq": ("rq", "redis"),
    "huey": ("huey", "redis"),
    "dramatiq": ("dramatiq", "redis"),
    "django-tasks-db": ("django_tasks_db", "psycopg"),
}


def missing(systems: list[str]) -> list[str]:
    """The modules these systems need that cannot be imported."""
    from importlib.util import find_spec

    wanted = dict.fromkeys(m for system in systems for m in _MODULES[system])
    return [m for m in wanted if find_spec(m) is None]
