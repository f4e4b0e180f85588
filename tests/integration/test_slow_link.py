"""A worker whose link to ZooKeeper is slow: answers take longer than CONNECT_TIMEOUT.

The worker waits for the status records of its new assignments no longer than
CONNECT_TIMEOUT at a time, so that its main loop (a drain, a stop) is never held by a
ZooKeeper that went away. Over a slow link the answers are still coming: each try used
to send the same reads again, queued behind the first (16 records of 850 KB, 2.5 MB/s:
182 MB sent in 75 s, one job started). The next try waits on the reads already sent.
"""

from django.tasks import TaskResultStatus

from tests import tasks
from tests.conftest import zk_tasks_setting
from tests.lagging import Relay

RATE = 2_500_000  # bytes a second, ZooKeeper to the worker


def test_large_assignments_over_a_slow_link_start(settings, zk_hosts, zk_root,
                                                  start_worker):
    throttle = Relay(int(zk_hosts.rsplit(":", 1)[1]), rate=RATE)
    direct = zk_tasks_setting(zk_hosts, zk_root)["default"]
    slow = zk_tasks_setting(f"127.0.0.1:{throttle.port}", zk_root,
                            SESSION_TIMEOUT=10.0, CONNECT_TIMEOUT=2.0)["default"]
    settings.TASKS = {"default": direct, "slow": slow}  # only the worker's link is slow
    results = [tasks.environ.submit("X" * 640_000) for _ in range(16)]  # 850 KB records
    try:
        start_worker(backend="slow", concurrency=16)
        for result in results:
            assert result.wait(timeout=90).status == TaskResultStatus.SUCCESSFUL
        # About what the records weigh (13.6 MB) and their starts' answers, not a copy
        # of them per try.
        assert throttle.sent < 60_000_000, throttle.sent
    finally:
        throttle.close()
