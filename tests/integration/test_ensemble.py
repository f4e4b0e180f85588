"""A real 3-server ensemble: work goes on when a member, even ZooKeeper's leader, dies."""

import pytest

from tests import tasks
from tests.conftest import impatient, use_zookeeper


@pytest.fixture
def zk_settings(settings, zk_ensemble, zk_root, monkeypatch, request):
    """Overrides the suite's fixture: the backend talks to the whole ensemble.

    Web-facing calls give up after CONNECT_TIMEOUT: the tests riding out an outage give
    restarting JVMs a minute, however loaded the machine; a test may pass its own.
    """
    timeout = getattr(request, "param", 60.0)
    return use_zookeeper(settings, monkeypatch, zk_ensemble.hosts, zk_root,
                         CONNECT_TIMEOUT=timeout)


def test_work_goes_on_when_the_ensemble_leader_dies(zk_settings, zk_ensemble, start_worker):
    start_worker(name="a")
    start_worker(name="b")
    before = [tasks.add.submit(i, 1) for i in range(10)]
    zk_ensemble.leader().kill()  # a quorum of two remains and elects a new leader
    after = [tasks.add.submit(i, 2) for i in range(10)]
    assert [r.wait(timeout=60).return_value for r in before] == [i + 1 for i in range(10)]
    assert [r.wait(timeout=60).return_value for r in after] == [i + 2 for i in range(10)]


def test_nothing_is_lost_when_a_majority_returns(zk_settings, zk_ensemble, start_worker):
    import threading

    start_worker()
    done = tasks.add.submit(1, 1)
    assert done.wait(timeout=60).return_value == 2
    followers = [s for s in zk_ensemble.servers if s is not zk_ensemble.leader()]
    for member in followers:
        member.kill()  # no quorum: nothing can be written
    submitted = {}

    def submit():
        submitted["job"] = tasks.add.submit(20, 22)

    thread = threading.Thread(target=submit)
    thread.start()
    for member in followers:
        member.start()  # the quorum is back within the session timeout
    thread.join(60)
    assert submitted["job"].wait(timeout=60).return_value == 42
    assert tasks.add.get_result(done.id).return_value == 2


@pytest.mark.parametrize("zk_settings", [5.0], indirect=True)
def test_submit_and_reads_fail_clearly_while_the_quorum_is_lost(zk_settings, zk_ensemble,
                                                                start_worker, zk_root):
    """kazoo queues a request made while disconnected and its synchronous calls wait for
    the reconnection: a web request submitting during a loss of quorum hung. Now it gets
    ZooKeeperUnavailableError naming the job, whose outcome is unknown until ZooKeeper is
    back; a retried submit never makes a second job."""
    import re

    from django.tasks import task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist

    from tests.waiting import wait_until
    from zktasks.exceptions import ZooKeeperUnavailableError

    start_worker()
    done = tasks.add.submit(1, 1)
    assert done.wait(timeout=60).return_value == 2
    backend = task_backends["default"]
    client = backend.store.raw_client
    # Kill a follower first (a quorum of two remains), then the leader: the last member,
    # a follower, loses its leader at once and serves nobody (no window in which a
    # leader without quorum still answers reads).
    leader = zk_ensemble.leader()
    follower = next(s for s in zk_ensemble.servers if s is not leader)
    # The calls below each give up at CONNECT_TIMEOUT: 1.5 s for them (5 s before, for
    # the first writes to the fresh ensemble), 5 s again once the quorum is back.
    restore = impatient(backend.store, 1.5)
    follower.kill()
    leader.kill()

    with pytest.raises(ZooKeeperUnavailableError) as raised:
        tasks.add.submit(20, 22)
    message = str(raised.value)
    job_id = re.search(r"Job '([0-9a-f]{32})'", message).group(1)
    assert "may or may not have been submitted" in message
    assert f"get_result('{job_id}')" in message
    with pytest.raises(ZooKeeperUnavailableError, match=f"job '{done.id}' cannot be read"):
        tasks.add.get_result(done.id)
    with pytest.raises(ZooKeeperUnavailableError, match="unknown outcome"):
        backend.cancel(done.id)

    restore()
    follower.start()  # a quorum again
    leader.start()
    wait_until(lambda: client.connected, timeout=120, message="the client to reconnect")
    fresh = tasks.add.submit(3, 4)  # works again, and runs
    assert fresh.wait(timeout=60).return_value == 7
    # The fresh submit went through the same session after the one that timed out (kazoo
    # sends in order): whatever became of that one is settled now.
    try:
        late = tasks.add.get_result(job_id)
    except TaskResultDoesNotExist:
        late = None  # never created
    if late is not None:  # created once ZooKeeper was back: it runs exactly once
        late.wait(timeout=60)
        assert late.return_value == 42 and late.worker_ids and len(late.worker_ids) == 1
    status = set(client.get_children(backend.store.layout.status_dir))
    assert status == {done.id, fresh.id} | ({job_id} if late else set())
    assert tasks.add.get_result(done.id).return_value == 2
