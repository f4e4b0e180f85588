"""A real `manage.py runworker` cut off from ZooKeeper: it still stops when told to."""

import signal

import pytest

from tests.conftest import use_zookeeper
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def zk_settings(settings, own_server, zk_root, monkeypatch):
    """Overrides the suite's fixture: the workers here use this test's server."""
    return use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root)


def test_a_worker_cut_off_from_zookeeper_still_stops(zk_settings, own_server, runworker):
    """kazoo fires a worker's watches as the connection drops; the reads they asked for
    waited in kazoo's queue for ZooKeeper's return, and the drain and stop queued behind
    them as long: neither SIGTERM nor a second one stopped it (a supervisor then had to
    SIGKILL it). Its calls during a stop are bounded now; leaving unregistered is safe,
    as the session's end hands its jobs back."""
    # CONNECT_TIMEOUT 4 s (10 s in the suite's settings): a read the cut-off worker
    # still waits for gives up sooner. The test takes about 6 s (40 s at first).
    proc = runworker("--concurrency", "1", "--drain-timeout", "2", name="cutoff",
                     env={"ZKTASKS_TEST_CONNECT_TIMEOUT": "4"})
    wait_until(lambda: "worker registered" in proc.log_path.read_text(), 60,
               "the worker to register")
    own_server.stop()
    wait_until(lambda: "connection suspended" in proc.log_path.read_text(), 60,
               "the worker to see ZooKeeper go")
    proc.send_signal(signal.SIGTERM)
    # Before the fix it waited for ZooKeeper, which never comes back in this test; then
    # up to CONNECT_TIMEOUT to mark its drain, 2 s per job waiting on it to hand back,
    # 5 s for its leader thread and 2 s to deregister. Disconnected, it tries none.
    assert proc.wait(120) == 0, proc.log_path.read_text()[-3000:]
    log = proc.log_path.read_text()
    assert "worker stopped" in log
    assert "the leader learns of the drain when the connection returns" in log
    assert "left without deregistering" in log
    # The reads the drop queued wait no longer for a connection that is gone: at most the
    # one already under way as it dropped (each waited CONNECT_TIMEOUT, and the
    # suspension, the drain and the stop waited behind them).
    assert log.split("connection suspended", 1)[0].count("ZooKeeper call failed") <= 1, log
