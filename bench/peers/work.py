"""The two workloads, shared by every system: their bodies only, no framework.

Both return the time they finished, so that a peer's result says when the job ended
(zktasks' status record has its own finished_at).
"""

import time


def noop() -> float:
    return time.time()


def sleep10() -> float:
    time.sleep(0.010)
    return time.time()
