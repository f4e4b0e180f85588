"""Per-task result_ttl: each job's finished record expires after its own TTL, removed by
whoever leads, while jobs of the global RESULT_TTL finished at the same time stay."""

import signal

import pytest
from django.tasks.exceptions import TaskResultDoesNotExist

from tests import tasks
from tests.conftest import use_zookeeper
from tests.waiting import wait_for_children, wait_for_deletion
from zktasks.tree import parse_bucket


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch, request):
    """Overrides the suite's fixture: the global RESULT_TTL is the test's parameter."""
    ttl = getattr(request, "param", 86400)
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, RESULT_TTL=ttl)


def bucket_ttls(zk_client, layout) -> set:
    return {parse_bucket(b)[1] for b in zk_client.get_children(layout.finished)}


def test_a_short_result_ttl_expires_while_default_results_stay(backend, start_worker,
                                                                zk_client):
    start_worker()
    short = tasks.add.using(result_ttl=1).submit(1, 2)
    kept = tasks.add.submit(3, 4)
    assert short.wait(timeout=30).return_value == 3
    assert kept.wait(timeout=30).return_value == 7
    layout = backend.store.layout
    assert bucket_ttls(zk_client, layout) == {None, 1}
    # The leader deletes the one-second bucket once its ten seconds and one are over.
    wait_for_deletion(zk_client, layout.status(short.id), timeout=60)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(short.id)
    with pytest.raises(TaskResultDoesNotExist):
        short.refresh()
    wait_for_children(zk_client, layout.finished,
                      lambda c: {parse_bucket(b)[1] for b in c} == {None}, timeout=30)
    assert tasks.add.get_result(kept.id).return_value == 7
    assert backend.store.recent_finished(10) == [kept.id]


@pytest.mark.parametrize("zk_settings", [1], indirect=True)
def test_a_result_ttl_longer_than_the_global_survives_the_global_sweep(backend, start_worker,
                                                                       zk_client):
    start_worker()
    default = tasks.add.submit(1, 1)
    kept = tasks.add.using(result_ttl=3600).submit(2, 2)
    assert default.wait(timeout=30).return_value == 2
    assert kept.wait(timeout=30).return_value == 4
    layout = backend.store.layout
    wait_for_deletion(zk_client, layout.status(default.id), timeout=60)
    wait_for_children(zk_client, layout.finished,
                      lambda c: {parse_bucket(b)[1] for b in c} == {3600}, timeout=30)
    result = tasks.add.get_result(kept.id)
    assert result.return_value == 4 and result.task.result_ttl == 3600
    assert backend.store.recent_finished(10) == [kept.id]


def test_a_new_leader_expires_what_a_killed_leader_left(backend, runworker, start_worker,
                                                        zk_client):
    """The expiry of each bucket is in its name: a leader killed before it, knowing
    nothing in memory that matters, is replaced by one that expires the bucket."""
    layout = backend.store.layout
    first = runworker("--concurrency", "1", name="first")
    wait_for_children(zk_client, layout.leader, lambda c: len(c) == 1, timeout=60)
    kept = tasks.add.submit(5, 5)
    assert kept.wait(timeout=60).return_value == 10
    first.send_signal(signal.SIGKILL)
    first.wait(15)
    # No leader runs now (the killed one's session lingers until it times out): cancel a
    # pending job, which records it FAILED with its one-second TTL.
    short = tasks.add.using(result_ttl=1).submit(6, 6)
    assert short.cancel() is True
    assert bucket_ttls(zk_client, layout) == {None, 1}
    start_worker()  # leads once the killed leader's session has expired
    wait_for_deletion(zk_client, layout.status(short.id), timeout=60)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(short.id)
    assert tasks.add.get_result(kept.id).return_value == 10
