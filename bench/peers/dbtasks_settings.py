"""Settings for the django-tasks-db peer: the bench's settings plus a PostgreSQL database.

The bench process uses them when a django-tasks-db scenario is selected, and so do the
`db_worker` processes. bench/run.py starts the PostgreSQL cluster first and passes its
port in BENCH_PG_PORT. Connections persist (CONN_MAX_AGE None, with health checks): with
Django's default of 0, db_worker would open a new connection (a new PostgreSQL backend
process) for every job it polls, and the figures would measure that.
"""

import os

from bench.settings import *  # noqa: F403 - the zktasks side stays as it is
from bench.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "bench",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
    },
}
TASKS = {
    **TASKS,
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]},
}
