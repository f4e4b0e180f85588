"""Settings for bench/scale.py: the bench's, with RESULT_TTL from the environment (a
million finished records would otherwise stay in ZooKeeper's heap for a day)."""

import os

from bench.settings import *  # noqa: F403

TASKS["default"]["OPTIONS"]["RESULT_TTL"] = int(  # noqa: F405
    os.environ.get("ZKTASKS_BENCH_RESULT_TTL", "86400"))
