"""Django's own tasks framework (django.tasks) with django-tasks-db's DatabaseBackend.

On PostgreSQL: each `db_worker` claims a row with SELECT ... FOR UPDATE SKIP LOCKED, so
several workers do not wait for each other (on SQLite the package takes an exclusive
transaction for every claim instead). The worker runs the task in its own process, one
at a time, and polls the table every `--interval` seconds (default 1 s) when it finds
nothing to do. django.tasks has no blocking wait: the bench polls the row.
"""

import sys
import time

from django.tasks import task

from bench.peers import Driver as BaseDriver
from bench.peers import work

POLL = 0.002       # latency phase: one job, polled every 2 ms
POLL_MANY = 0.05   # throughput phases: count the unfinished rows every 50 ms


@task(backend="db")
def noop():
    return work.noop()


@task(backend="db")
def sleep10():
    return work.sleep10()


TASKS = {"noop": noop, "sleep10": sleep10}


class Driver(BaseDriver):
    settings_module = "bench.peers.dbtasks_settings"

    def __init__(self, system, server):
        super().__init__(system, server)
        from django.core.management import call_command

        call_command("migrate", "django_tasks_database", verbosity=0)

    def worker_cmd(self, name: str) -> list[str]:
        return [sys.executable, "-m", "django", "db_worker", "--backend", "db",
                "--queue-name", "default", "--worker-id", name]

    def submit(self, workload: str):
        return TASKS[workload].enqueue()

    def wait(self, handle, timeout: float) -> dict:
        limit = time.monotonic() + timeout
        while not handle.is_finished:
            if time.monotonic() > limit:
                raise TimeoutError(f"django-tasks-db job {handle.id} still {handle.status}")
            time.sleep(POLL)
            handle.refresh()
        if handle.status.name != "SUCCESSFUL":
            raise RuntimeError(f"django-tasks-db job {handle.id} ended {handle.status}")
        return handle.return_value

    def wait_all(self, handles: list, timeout: float) -> list[dict]:
        from django_tasks_db.models import DBTaskResult

        ids = [h.id for h in handles]
        rows = DBTaskResult.objects.filter(id__in=ids)
        limit = time.monotonic() + timeout
        while (left := rows.exclude(status="SUCCESSFUL").count()) > 0:
            failed = rows.filter(status="FAILED").count()
            if failed:
                raise RuntimeError(f"{failed} django-tasks-db jobs FAILED")
            if time.monotonic() > limit:
                raise TimeoutError(f"{left} django-tasks-db jobs not finished")
            time.sleep(POLL_MANY)
        # The row's finished_at (written by the worker right after the task returned),
        # and the worker that ran it (db_worker --worker-id NAME records NAME).
        return [{**(value or {}), "at": finished.timestamp(),
                 "worker": workers[-1] if workers else None}
                for finished, workers, value in rows.values_list(
                    "finished_at", "worker_ids", "return_value")]

    def reset(self) -> None:
        from django_tasks_db.models import DBTaskResult

        DBTaskResult.objects.all().delete()

    def versions(self) -> str:
        from importlib.metadata import version

        return f"django-tasks-db {version('django-tasks-db')}, psycopg {version('psycopg')}"
