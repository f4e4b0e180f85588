"""Django settings for the benchmark: the bench process and its runworker subprocesses.

ZooKeeper hosts and the zktasks root come from the environment so that `bench/run.py`
can point every worker it starts at its own server and a fresh root per scenario.
"""

import os

SECRET_KEY = "bench-secret-key-not-for-production"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["zktasks"]
# Task processes call close_old_connections() after each job; give them a database
# that costs nothing when never opened.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "zktasks.backend.ZooKeeperBackend",
        "QUEUES": [],
        "OPTIONS": {
            "HOSTS": os.environ.get("ZKTASKS_BENCH_HOSTS", "127.0.0.1:2181"),
            "ROOT": os.environ.get("ZKTASKS_BENCH_ROOT", "/zktasks-bench"),
            "SESSION_TIMEOUT": 10.0,
            "CONNECT_TIMEOUT": 10.0,
        },
    },
}
