"""Settings for bench/ratelimit.py: the bench's, with the queue "limited" rate-limited to
ZKTASKS_BENCH_RATE (as OPTIONS['RATE_LIMITS'] writes it, e.g. "50/s")."""

import os

from bench.settings import *  # noqa: F403

TASKS["default"]["OPTIONS"]["RATE_LIMITS"] = {  # noqa: F405
    "limited": os.environ.get("ZKTASKS_BENCH_RATE", "50/s")}
