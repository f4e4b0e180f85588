"""Finished results: the index, expiry after RESULT_TTL, retry, purge; and drain requests."""

import pytest
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

from tests import tasks
from tests.conftest import use_zookeeper
from tests.waiting import wait_for_children
from zktasks.tree import finished_bucket


def test_recent_finished_lists_newest_first_with_a_cursor(backend, start_worker):
    start_worker()
    jobs = [tasks.add.submit(i, i) for i in range(5)]
    for job in jobs:
        job.wait(timeout=30)
    ids = backend.store.recent_finished(3)
    assert set(ids) <= {j.id for j in jobs} and len(ids) == 3
    rest = backend.store.recent_finished(10, before=ids[-1])
    # Newest first means: by 10-second bucket of the finish time, then by id (submission
    # order) inside a bucket. Not by the finish instant itself: short jobs that run side
    # by side (or in one runner's batch) finish in any order.
    def newest_first(job):
        return finished_bucket(int(job.finished_at.timestamp() * 1000)), job.id

    assert ids + rest == [j.id for j in sorted(jobs, key=newest_first, reverse=True)]


def test_retry_sends_a_failed_job_back_for_one_more_attempt(backend, start_worker):
    start_worker()
    job = tasks.flaky.using(max_attempts=1).submit(2).wait(timeout=30)
    assert job.status == TaskResultStatus.FAILED
    assert backend.retry(job.id) is True
    assert job.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
    assert job.attempts == 2 and job.return_value == 2
    assert backend.retry(job.id) is False  # not failed any more


def test_purge_deletes_finished_records_by_state(backend, start_worker):
    start_worker()
    ok = tasks.add.submit(1, 1).wait(timeout=30)
    bad = tasks.boom.submit("x").wait(timeout=30)
    assert backend.purge(states=("FAILED",)) == 1
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(bad.id)
    assert backend.get_result(ok.id).return_value == 2
    assert backend.purge() == 1
    assert backend.store.recent_finished(10) == []


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch, request):
    """Overrides the suite's fixture for the expiry test: a one-second RESULT_TTL."""
    ttl = getattr(request, "param", 86400)
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, RESULT_TTL=ttl)


@pytest.mark.parametrize("zk_settings", [1], indirect=True)
def test_results_expire_after_result_ttl(backend, start_worker, zk_client):
    start_worker()
    job = tasks.add.submit(1, 2).wait(timeout=30)
    layout = backend.store.layout
    # The leader sweeps whole 10-second buckets once they are older than the TTL.
    wait_for_children(zk_client, layout.status_dir, lambda c: job.id not in c, timeout=40)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(job.id)
    wait_for_children(zk_client, layout.finished, lambda c: c == [], timeout=20)


def test_drain_requested_through_zookeeper_stops_the_worker(backend, start_worker, zk_client):
    worker = start_worker()
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2
    assert backend.drain_worker(worker.worker_id) is True
    assert worker.wait_stopped(30)
    assert zk_client.get_children(backend.store.layout.workers) == []
    assert backend.drain_worker("nobody") is False


def test_waits_that_time_out_share_one_watch_and_every_waiter_wakes(backend, start_worker):
    """kazoo keeps a path's watch functions until the znode changes: a wait that timed
    out left its own there, so a view long-polling a job waiting in a backlog grew that
    set by one per poll (300 polls, 300). Waiters now share one function per znode."""
    import threading

    from zktasks import statuswatch

    job = tasks.add.submit(20, 22)  # no worker yet: it stays READY
    path = backend.store.layout.status(job.id)
    for _ in range(300):
        with pytest.raises(TimeoutError):
            job.wait(timeout=0)
    # kazoo's private registry is the thing that grew; nothing public counts it.
    assert len(backend.store.raw_client._data_watchers.get(path, ())) == 1

    outcomes = []
    waiters = [threading.Thread(target=lambda: outcomes.append(
        backend.wait(job.id, timeout=30).status)) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    start_worker()
    for waiter in waiters:
        waiter.join(60)
    assert outcomes == [TaskResultStatus.SUCCESSFUL] * 3
    assert job.wait(timeout=30).return_value == 42
    assert (id(backend.store.raw_client), path) not in statuswatch.watches._entries
