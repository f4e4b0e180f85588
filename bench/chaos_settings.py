"""Django settings for the chaos harness (bench/chaos.py) and the workers it starts:
the bench's settings, with ZooKeeper options of its own.

The harness sets ZKTASKS_CHAOS_HOSTS / ZKTASKS_CHAOS_ROOT / ZKTASKS_CHAOS_SESSION_TIMEOUT
(and, with --tls, ZKTASKS_CHAOS_TLS_CA / _CERTFILE / _KEYFILE; with --rate-limit,
ZKTASKS_CHAOS_RATE_LIMIT) in its own environment
before django.setup(), and passes them on to every runworker.
"""

import os

from bench.settings import *  # noqa: F403 - the same app, database and backend

SECRET_KEY = "chaos-secret-key-not-for-production"
TASKS = {
    "default": {
        "BACKEND": "zktasks.backend.ZooKeeperBackend",
        "QUEUES": [],
        "OPTIONS": {
            "HOSTS": os.environ.get("ZKTASKS_CHAOS_HOSTS", "127.0.0.1:2181"),
            "ROOT": os.environ.get("ZKTASKS_CHAOS_ROOT", "/zktasks-chaos"),
            "SESSION_TIMEOUT": float(os.environ.get("ZKTASKS_CHAOS_SESSION_TIMEOUT", "3")),
            # Workers start while the ensemble is still forming its quorum.
            "CONNECT_TIMEOUT": float(os.environ.get("ZKTASKS_CHAOS_CONNECT_TIMEOUT", "60")),
            # bench/chaos.py --tls
            "TLS": {"CA": os.environ["ZKTASKS_CHAOS_TLS_CA"],
                    "CERTFILE": os.environ["ZKTASKS_CHAOS_TLS_CERTFILE"],
                    "KEYFILE": os.environ["ZKTASKS_CHAOS_TLS_KEYFILE"]}
            if os.environ.get("ZKTASKS_CHAOS_TLS_CA") else None,
            # bench/chaos.py --rate-limit: every other job goes to the queue "limited".
            "RATE_LIMITS": {"limited": os.environ["ZKTASKS_CHAOS_RATE_LIMIT"]}
            if os.environ.get("ZKTASKS_CHAOS_RATE_LIMIT") else {},
        },
    },
}
