"""A real 3-server ensemble: work goes on when a member, even ZooKeeper's leader, dies."""

import pytest

from tests import tasks
from tests.conftest import use_zookeeper


@pytest.fixture
def zk_settings(settings, zk_ensemble, zk_root, monkeypatch):
    """Overrides the suite's fixture: the backend talks to the whole ensemble."""
    return use_zookeeper(settings, monkeypatch, zk_ensemble.hosts, zk_root)


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
