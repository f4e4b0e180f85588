"""A worker's prefetch follows its jobs (zktasks/prefetch.py): written to its worker
znode, followed by the leader, and a drain request written meanwhile is not lost."""

import json

import pytest

from tests import tasks
from tests.waiting import wait_for_children, wait_for_data, wait_until
from zktasks import prefetch

# "Short" is an average run under 5 ms in production; a loaded machine can make an
# add() take longer than that, and the prefetch would never go up. The thresholds are
# what is under test, not their values: these leave room for any machine, and a job of
# LONG_JOB_S alone lifts any average under SHORT_ENTER_S over SHORT_LEAVE_S (the moving
# average gives a new run a weight of 0.2).
SHORT_ENTER_S = 0.25
SHORT_LEAVE_S = 0.5
LONG_JOB_S = 3.0
assert 0.2 * LONG_JOB_S > SHORT_LEAVE_S


@pytest.fixture(autouse=True)
def _generous_thresholds(monkeypatch):
    monkeypatch.setattr(prefetch, "SHORT_ENTER_S", SHORT_ENTER_S)
    monkeypatch.setattr(prefetch, "SHORT_LEAVE_S", SHORT_LEAVE_S)


def _run_short_jobs(n=10):
    for job in [tasks.add.submit(i, i) for i in range(n)]:
        assert job.wait(timeout=60).return_value is not None


def test_short_jobs_raise_the_prefetch_and_the_leader_assigns_up_to_it(
        backend, start_worker, zk_client, tmp_path):
    worker = start_worker(concurrency=2)
    path = backend.store.layout.worker(worker.worker_id)
    assert json.loads(zk_client.get(path)[0])["prefetch"] == 8  # 4 per runner at first
    _run_short_jobs()
    wait_for_data(zk_client, path, lambda data: data["prefetch"] == 32)
    wait_until(lambda: worker.leader.workers[worker.worker_id].prefetch == 32, 60,
               "the leader to read the new prefetch")
    # 30 jobs that wait. The leader assigns while the jobs waiting on the worker are at
    # most half its prefetch (leader.WorkerView.wants_work): with 2 runners and 32, at
    # least 19 of them; with the first prefetch (8) it would stop at 10 at most.
    release = tmp_path / "release"
    jobs = [tasks.wait_for_file.submit(str(release), i) for i in range(30)]
    wait_for_children(zk_client, backend.store.layout.worker_assignments(worker.worker_id),
                      lambda names: len(names) >= 2 + 32 // 2 + 1)
    release.touch()
    assert [job.wait(timeout=60).return_value for job in jobs] == list(range(30))


def test_long_jobs_bring_it_back_down(backend, start_worker, zk_client, tmp_path,
                                      monkeypatch):
    monkeypatch.setattr(prefetch, "HOLD_S", 0.5)
    worker = start_worker(concurrency=2)
    path = backend.store.layout.worker(worker.worker_id)
    _run_short_jobs()
    wait_for_data(zk_client, path, lambda data: data["prefetch"] == 32)
    # Ends more than HOLD_S after the change above, and alone lifts the average
    # over SHORT_LEAVE_S.
    assert tasks.sleep_then_return.submit(str(tmp_path), LONG_JOB_S, "slow").wait(
        timeout=60).return_value == "slow"
    wait_for_data(zk_client, path, lambda data: data["prefetch"] == 8)


def test_a_fixed_prefetch_is_what_the_worker_znode_says(backend, start_worker, zk_client):
    worker = start_worker(concurrency=2, prefetch=3)
    _run_short_jobs()
    path = backend.store.layout.worker(worker.worker_id)
    assert json.loads(zk_client.get(path)[0])["prefetch"] == 3


def test_a_drain_request_racing_a_write_of_the_worker_znode_is_not_lost(
        backend, start_worker, zk_client, monkeypatch):
    """The worker rewrites its znode (its prefetch); drain_worker's versioned write then
    fails with BadVersion, and must read again rather than answer "no such worker"."""
    worker = start_worker()
    path = backend.store.layout.worker(worker.worker_id)
    client = backend.store.raw_client  # drain_worker's calls: its *_async variants
    real_set_async = client.set_async
    raced = []

    def rewrite_then_set(target, value, version=-1):
        if target == path and not raced:
            # Between drain_worker's read and its write, as the worker would.
            raced.append(zk_client.set(path, zk_client.get(path)[0]))
        return real_set_async(target, value, version=version)

    monkeypatch.setattr(client, "set_async", rewrite_then_set)
    assert backend.drain_worker(worker.worker_id) is True
    assert raced, "the znode was not rewritten between the read and the write"
    monkeypatch.setattr(client, "set_async", real_set_async)
    assert worker.wait_stopped(60)


def test_the_workers_prefetch_write_never_undoes_a_drain_request(
        backend, start_worker, zk_client, monkeypatch):
    """A drain request lands between the worker's read of its znode and its write of the
    new prefetch: the write fails on the version, and the worker leaves the request
    as it is and drains."""
    worker = start_worker(concurrency=2)
    path = backend.store.layout.worker(worker.worker_id)
    # The write is bounded (Store.bounded), which sends it with set_async.
    real_set_async = worker.client.set_async
    raced = []

    def drain_then_set(target, value, version=-1):
        if target == path and not raced and json.loads(value).get("prefetch") == 32:
            data = json.loads(zk_client.get(path)[0])
            raced.append(zk_client.set(path, json.dumps({**data, "draining": True}).encode()))
        return real_set_async(target, value, version=version)

    monkeypatch.setattr(worker.client, "set_async", drain_then_set)
    for i in range(10):  # the worker drains part way: some are handed back, unrun
        tasks.add.submit(i, i)
    # Overwritten, the request would be lost: the worker reads its znode (on its own
    # watch) only after its write, on the same thread.
    assert worker.wait_stopped(60), "the drain request was lost"
    assert raced, "the worker never wrote a new prefetch"
