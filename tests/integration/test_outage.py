"""ZooKeeper goes away and comes back: nothing is lost, work goes on."""

import json
import logging
import secrets
import threading

import pytest

from tests import tasks
from tests.conftest import impatient, use_zookeeper
from tests.waiting import wait_until


@pytest.fixture
def zk_settings(settings, own_server, zk_root, monkeypatch):
    """Overrides the suite's fixture: every task backend here uses this test's server.

    A submit waits for ZooKeeper at most CONNECT_TIMEOUT, and retries a lost connection
    within SESSION_TIMEOUT: a minute and 30 s here, so that riding out a JVM restart does
    not depend on how loaded the machine is. (With the suite's 4 s session, a restart
    slowed by a busy machine expired the session and the submit rightly gave up: CI saw
    it once.) Expiry itself is tested by expiring a session on purpose, not by waiting.
    """
    return use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root,
                         CONNECT_TIMEOUT=CONNECT_TIMEOUT, SESSION_TIMEOUT=30.0)


CONNECT_TIMEOUT = 60.0


def test_submit_rides_out_a_server_restart(zk_settings, own_server, start_worker):
    assert tasks.add.submit(1, 1).id  # connected, skeleton made
    own_server.stop()
    submitted = {}

    def submit():
        try:
            submitted["job"] = tasks.add.submit(20, 22)
        except Exception as exc:  # surfaced by the assertion below
            submitted["error"] = exc

    thread = threading.Thread(target=submit)
    thread.start()
    own_server.start()  # back within the session timeout
    # The submit's own bound is CONNECT_TIMEOUT; waiting less would fail a submit that
    # is still within it (CI saw one whose reconnect hung in kazoo's connect read, which
    # lasts up to SESSION_TIMEOUT). Usually this returns within a second or two.
    thread.join(CONNECT_TIMEOUT + 30)
    assert not thread.is_alive(), (
        f"submit() still blocked {CONNECT_TIMEOUT + 30:.0f}s after the restart, past its "
        f"CONNECT_TIMEOUT; server log:\n{own_server.log_tail()}")
    assert "error" not in submitted, submitted.get("error")
    start_worker()
    assert submitted["job"].wait(timeout=30).return_value == 42


def test_worker_and_leader_carry_on_after_a_restart(zk_settings, own_server, start_worker):
    worker = start_worker()
    assert worker.options.hosts == own_server.hosts
    assert tasks.add.submit(1, 2).wait(timeout=30).return_value == 3
    own_server.restart()
    assert tasks.add.submit(3, 4).wait(timeout=30).return_value == 7
    assert worker.leader.is_leader


def test_a_drain_during_an_outage_hands_its_waiting_jobs_back_when_zookeeper_returns(
        zk_settings, own_server, start_worker, tmp_path, caplog):
    """A worker told to leave while ZooKeeper is away waited CONNECT_TIMEOUT to mark its
    drain and up to 2 s for each job waiting on it to hand back, one after another, all
    for nothing: its stop waited behind them. It now defers both to the connection's
    return, and if the connection never returns, its session's end hands the jobs back.
    Here ZooKeeper returns mid-drain: the waiting jobs run on another worker while the
    draining one still runs its long job."""
    caplog.set_level(logging.INFO, logger="zktasks")
    release = tmp_path / "release"
    draining = start_worker(concurrency=1, prefetch=4)
    long_job = tasks.wait_for_file.submit(str(release), "done")
    wait_until(lambda: long_job.id in draining._running, 30, "the long job to start")
    # Prefetch 4: the leader refills while at most half of it is taken, so all three
    # get here (with 3, the third waited for one of the first two to start).
    waiting = [tasks.add.submit(i, i) for i in range(3)]
    wait_until(lambda: len(draining._ready) == 3, 30, "three jobs to wait behind it")
    own_server.stop()
    wait_until(lambda: draining._paused, 30, "the worker to see ZooKeeper go")
    draining.stop(graceful=True)
    # With CONNECT_TIMEOUT 60 s here, the old drain sat in its mark until ZooKeeper
    # came back, and these lines never came during the outage.
    wait_until(lambda: "stay with worker=" in caplog.text, 30,
               "the drain to keep its waiting jobs for the connection's return")
    assert "the leader learns of the drain when the connection returns" in caplog.text
    own_server.start()
    other = start_worker()
    for i, job in enumerate(waiting):
        result = job.wait(timeout=60)
        assert result.return_value == 2 * i
        assert result.worker_ids == [other.worker_id]  # handed back, never run here
    assert long_job.id in draining._running  # the drain goes on meanwhile
    assert not draining._stopped.is_set()
    raw, _ = other.client.get(other.store.layout.worker(draining.worker_id))
    assert json.loads(raw)["draining"]  # told once the connection came back
    release.touch()
    assert long_job.wait(timeout=60).return_value == "done"
    assert draining._stopped.wait(60), "the drained worker did not stop"


def test_a_drain_the_leader_was_not_told_of_keeps_the_jobs_it_is_given_again(
        zk_settings, own_server, start_worker, tmp_path, caplog, monkeypatch):
    """A draining worker hands back jobs assigned to it after its drain began, but not
    while its znode does not say draining (its mark timed out): the leader, seeing a
    worker with free slots, gave them straight back, and the two passed them to and fro
    until the drain ended (seen in bench/failover.py's drain trial while building the
    hand-back). It keeps them; its leaving hands them back."""
    from zktasks.exceptions import ZooKeeperUnavailableError
    from zktasks.store import mark_draining

    caplog.set_level(logging.INFO, logger="zktasks")
    start_worker(queues=["elsewhere"])  # the leader; it serves none of these jobs
    release = tmp_path / "release"
    draining = start_worker(concurrency=1, prefetch=4, lead=False)
    real_update = draining.store.update_worker

    def mark_times_out(worker_id, change, *args, **kwargs):
        if change is mark_draining:
            raise ZooKeeperUnavailableError("the drain mark timed out (this test's)")
        return real_update(worker_id, change, *args, **kwargs)

    monkeypatch.setattr(draining.store, "update_worker", mark_times_out)
    long_job = tasks.wait_for_file.submit(str(release), "done")
    wait_until(lambda: long_job.id in draining._running, 30, "the long job to start")
    # Prefetch 4: the leader refills while at most half of it is taken, so all three
    # get here (with 3, the third waited for one of the first two to start).
    waiting = [tasks.add.submit(i, i) for i in range(3)]
    wait_until(lambda: len(draining._ready) == 3, 30, "three jobs to wait behind it")
    draining.stop(graceful=True)
    wait_until(lambda: caplog.text.count("(worker draining)") == 3, 30,
               "the drain to hand its three waiting jobs back")
    # The leader knows no drain: it assigns them to the same worker, which keeps them.
    wait_until(lambda: len(draining._ready) == 3, 30, "the jobs to be given back to it")
    release.touch()
    assert long_job.wait(timeout=60).return_value == "done"
    assert draining._stopped.wait(60), "the drained worker did not stop"
    assert caplog.text.count("(worker draining)") == 3, caplog.text  # handed back once
    start_worker()  # its session's end handed them back: they run here
    for i, job in enumerate(waiting):
        assert job.wait(timeout=60).return_value == 2 * i


def test_the_prefetch_write_gives_up_on_a_frozen_server(zk_settings, own_server,
                                                        start_worker):
    """The worker advertises a new prefetch from its main loop. ZooKeeper frozen
    (SIGSTOP) before kazoo notices: the write used to wait for ZooKeeper's return, and
    the main loop with it (a drain, a stop, every event). It gives up at CONNECT_TIMEOUT
    now, and the next finished job asks again."""
    worker = start_worker()
    path = worker.store.layout.worker(worker.worker_id)
    restore = impatient(worker.store, 1.0)
    worker._run_avg = 0.0  # jobs this short ask for the short-job prefetch
    wanted = worker._prefetch.wanted(worker._run_avg, 0.0)
    assert wanted is not None and wanted != worker._prefetch.current
    done = threading.Event()

    def advertise():
        worker._advertise_prefetch()
        done.set()

    own_server.pause()
    try:
        # The server stays frozen until after this wait, and the session (30 s) outlives
        # it: before the fix the call returned only once the server was thawed.
        threading.Thread(target=advertise, daemon=True).start()
        assert done.wait(20), "the prefetch write waited for the frozen server"
        assert worker._prefetch.current != wanted  # not taken as written
    finally:
        own_server.resume()
        restore()
    # Thawed, the next ask writes it (or finds the write that timed out landed after all).
    worker._prefetch._changed_at = None
    worker._advertise_prefetch()
    assert worker._prefetch.current == wanted
    assert json.loads(worker.client.get(path)[0])["prefetch"] == wanted


def test_the_status_reads_of_new_assignments_give_up_on_a_frozen_server(
        zk_settings, own_server, start_worker, caplog):
    """The worker's main loop reads the status records of its new assignments. ZooKeeper
    frozen (SIGSTOP) as they are sent: the answer waited the session timeout (30 s here),
    then the read again waited in kazoo's queue for ZooKeeper's return, and the main loop
    (a drain, a stop, every event) with it. It gives up at CONNECT_TIMEOUT now."""
    worker = start_worker()
    store = worker.store
    original = store.read_statuses
    frozen = threading.Event()
    restore = impatient(store, 1.0)

    def read_statuses(job_ids):
        ids = list(job_ids)
        if ids and not frozen.is_set():
            own_server.pause()
            frozen.set()
        return original(ids)

    store.read_statuses = read_statuses
    try:
        tasks.add.submit(1, 2)
        tasks.add.submit(3, 4)
        assert frozen.wait(30), "the worker never read its new assignments"
        worker.stop(graceful=False)
        # The main loop takes the stop while the server is still frozen; before the fix
        # it did so only once the server was thawed. (The whole stop takes longer: kazoo's
        # client.stop() waits for its connection attempt to the frozen server.)
        wait_until(lambda: "worker stopping now" in caplog.text, timeout=20,
                   message="the main loop waited for the frozen server")
        assert "did not answer within 1s" in caplog.text
    finally:
        own_server.resume()
        restore()
    assert worker.wait_stopped(60)


def test_outage_longer_than_the_session_re_registers_the_worker(zk_settings, own_server,
                                                                 start_worker, zk_root):
    from kazoo.client import KazooClient

    worker = start_worker()
    first_id = worker.worker_id
    # Expire the worker's session on the server (a second handle with its id, closed).
    session_id, password = worker.client.client_id
    assert worker.options.hosts == own_server.hosts
    twin = KazooClient(hosts=own_server.hosts, client_id=(session_id, password))
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    result = tasks.add.submit(5, 6).wait(timeout=60)
    assert result.return_value == 11
    assert worker.worker_id != first_id  # a new identity after expiry (rule 3)
    assert result.worker_ids == [worker.worker_id]


def test_retry_after_a_freeze_still_tries_before_giving_up(zk_settings, own_server):
    """A process frozen past its deadline (SIGSTOP, a long pause) wakes with the deadline
    spent: its first transient error must be retried, not turned into a fatal
    ZooKeeperUnavailableError (the chaos harness saw workers and leader threads die)."""
    from django.tasks import task_backends
    from kazoo.exceptions import ConnectionLoss

    store = task_backends["default"].store
    calls = []

    def first_call_lost_then_fine():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionLoss("connection lost while we were frozen")
        return store.client.exists("/")

    assert store.retry(first_call_lost_then_fine, deadline=-1.0) is not None
    assert len(calls) == 2


def test_bounded_calls_give_up_while_the_server_is_down(zk_settings, own_server):
    """Inside Store.bounded() a call made while kazoo is disconnected raises at the
    deadline instead of waiting in kazoo's queue for the reconnection; nested blocks
    keep the earlier deadline; outside them nothing changes."""
    from django.tasks import task_backends

    from zktasks.exceptions import ZooKeeperUnavailableError

    store = task_backends["default"].store
    job = tasks.add.submit(1, 1)
    own_server.stop()
    unavailable = pytest.raises(ZooKeeperUnavailableError, match=r"did not answer within 1s")
    with unavailable, store.bounded(1.0), store.bounded(300.0):
        store.read_status(job.id)
    unavailable = pytest.raises(ZooKeeperUnavailableError, match=r"within 1s")
    with unavailable, store.bounded(1.0):
        store.commit(lambda txn: txn.check(store.layout.status(job.id), -1))
    assert store.client is store.raw_client  # the bound ended with its block
    own_server.start()
    with store.bounded(60.0):
        assert store.read_status(job.id).record.id == job.id


def test_pipelined_submits_ride_out_a_server_crash(zk_settings, own_server, start_worker):
    """kill -9 of ZooKeeper with pipelined multis in flight, more sent while it is down:
    once the block ends every job is written, once, and runs."""
    import zktasks
    from tests.pending import pending_nodes
    from zktasks.store import Store

    assert tasks.add.submit(0, 0).id  # connected, skeleton made
    restarter = threading.Thread(target=own_server.start)
    with zktasks.pipelined() as pipe:
        results = [tasks.add.submit(n, 1) for n in range(150)]
        own_server.kill()  # some of those are in flight: their outcome is unknown
        restarter.start()
        # Sent while kazoo is disconnected or reconnecting: queued until it is back.
        results += [tasks.add.submit(n, 2) for n in range(150, 200)]
    restarter.join(60)
    assert pipe.sent == 200  # the resends (about a third to all of the first 150) are
    # not asserted: how many were in flight at the kill is up to timing
    from django.tasks import task_backends

    store: Store = task_backends["default"].store
    ids = {r.id for r in results}
    assert len(ids) == 200
    with store.bounded(60.0):
        waiting = {name[-32:] for name in pending_nodes(store.client, store.layout)}
        assert ids <= waiting  # each job waits exactly once: its node is named by its id
        assert all(store.read_status(job_id) is not None for job_id in ids)
    start_worker()
    values = [r.wait(timeout=60).return_value for r in results]
    assert values == [n + 1 for n in range(150)] + [n + 2 for n in range(150, 200)]


def test_a_multiread_without_answer_means_reading_one_by_one(zk_settings, own_server):
    """A server that does not answer the first multiRead in time (frozen here) is read one
    by one meanwhile, and the reads still answer right. Its silence decides nothing
    (since 14aef08): the answer, once it comes, does, and a 3.6+ server's turns multiRead
    on (test_multiread_probe.py has the other cases)."""
    from django.tasks import task_backends

    store = task_backends["default"].store
    result = tasks.add.submit(1, 1)
    own_server.pause()
    try:
        assert store._multi_read_works(store.layout.status(result.id)) is False
    finally:
        own_server.resume()
    missing = result.id[:-4] + "beef"
    fetch = store.read_statuses([result.id, missing])
    assert fetch(result.id).record.id == result.id
    assert fetch(missing) is None
    wait_until(lambda: store._multi_read is True, 60, "the thawed server's answer to decide")


def test_pipelined_jobs_behind_an_unanswered_multi_share_the_next(zk_settings, own_server,
                                                                 monkeypatch):
    """ZooKeeper frozen (SIGSTOP) after a multi was sent: the jobs submitted behind it wait
    and go together, BATCH_JOBS per multi, and all are written once it answers."""
    from django.tasks import task_backends

    import zktasks
    from tests.pending import pending_nodes
    from zktasks import pipeline

    monkeypatch.setattr(pipeline, "BATCH_JOBS", 4)
    backend = task_backends["default"]
    with zktasks.pipelined() as pipe:
        first = tasks.add.submit(0, 0)  # makes its shard; nothing in flight: sent alone
        pipe.in_flight[-1][1].get(timeout=60)  # answered
        try:
            own_server.pause()
            results = [first]
            for n in range(1, 12):
                # The first job's millisecond, so its shard: nothing to make first.
                job_id = f"{first.id[:12]}{0xff00 + n:04x}{secrets.token_hex(8)}"
                record, result = backend.prepare(tasks.add, (n, 1), {}, job_id=job_id)
                results.append(pipe.send(record, result))
            # Job 1 went alone (the multi before it was answered), jobs 2-9 in two full
            # multis, jobs 10 and 11 wait for the block's end.
            assert (pipe.multis, len(pipe.buffer)) == (4, 2)
        finally:
            own_server.resume()
    assert pipe.multis == 5 and pipe.resent == 0
    store = backend.store
    ids = {r.id for r in results}
    with store.bounded(60.0):
        assert {name[-32:] for name in pending_nodes(store.client, store.layout)} == ids
        assert all(store.read_status(job_id) is not None for job_id in ids)


def test_pipelined_block_names_the_jobs_it_could_not_confirm(settings, own_server, zk_root,
                                                             monkeypatch):
    """ZooKeeper frozen (SIGSTOP) with multis in flight: the block does not hang past
    CONNECT_TIMEOUT per job, and every job is either written or named in the error."""
    from datetime import timedelta

    from django.tasks import task_backends
    from django.utils import timezone

    import zktasks
    from zktasks.exceptions import ZooKeeperUnavailableError

    # The first connect and writes to the fresh server get the generous default; the
    # 1 s bound is for the frozen part only.
    use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root, CONNECT_TIMEOUT=60.0)
    backend = task_backends["default"]
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1))
    results = []
    restore = lambda: None  # noqa: E731 - until the first job is written
    try:
        with pytest.raises(ZooKeeperUnavailableError) as caught, zktasks.pipelined() as pipe:
            results.append(later.submit(0, 0))  # makes its shard, which the pipe now knows
            restore = impatient(backend.store)  # the block's end meets the frozen server
            own_server.pause()
            for n in (1, 2):
                # The first job's millisecond, so the same delayed shard: nothing to make
                # first (a new second would need a synchronous create, and fail here).
                job_id = f"{results[0].id[:12]}{0xff00 + n:04x}{secrets.token_hex(8)}"
                record, result = backend.prepare(later, (n, n), {}, job_id=job_id)
                results.append(pipe.send(record, result))  # sent, never answered
    finally:
        own_server.resume()
        restore()
    message = str(caught.value)
    named = {r.id for r in results if r.id in message}
    assert {results[1].id, results[2].id} <= named
    assert "may not have been written" in message and "get_result" in message
    with backend.store.bounded(60.0):
        for result in results:
            if result.id not in named:
                assert backend.store.read_status(result.id) is not None


def test_submit_many_gives_up_per_batch_and_says_what_was_written(
        settings, zk_settings, own_server, zk_root, monkeypatch):
    """submit_many() waited in kazoo's queue for as long as ZooKeeper was away, where
    submit() gives up after CONNECT_TIMEOUT. Each multi is bounded now, and the error
    says which jobs were written: here the server stops once the first batch landed."""
    from django.tasks import task_backends

    from tests.conftest import zk_tasks_setting
    from zktasks.exceptions import ZooKeeperUnavailableError
    from zktasks.store import BULK_JOBS, Store

    settings.TASKS = zk_tasks_setting(own_server.hosts, zk_root, CONNECT_TIMEOUT=1.0,
                                      SESSION_TIMEOUT=30.0)
    backend = task_backends["default"]
    assert tasks.add.submit(0, 0).id  # connected, skeleton made
    unbounded = Store.submit_many
    batches = []

    def the_server_stops_after_the_first_batch(self, batch, *, around_chunk=None,
                                               written=None):
        def landed(count):
            written(count)
            batches.append(count)
            if own_server.is_running:
                own_server.stop()

        return unbounded(self, batch, around_chunk=around_chunk, written=landed)

    monkeypatch.setattr(Store, "submit_many", the_server_stops_after_the_first_batch)
    calls = [((n, 1), {}) for n in range(2 * BULK_JOBS + 10)]  # three batches at least
    outcome = {}

    def submit_many():
        try:
            outcome["results"] = tasks.add.submit_many(calls)
        except Exception as exc:  # looked at below
            outcome["error"] = exc

    thread = threading.Thread(target=submit_many)
    thread.start()
    thread.join(60)  # CONNECT_TIMEOUT is 1 s: the call ends in seconds
    assert not thread.is_alive(), "submit_many() still waits for ZooKeeper"
    error = outcome["error"]
    assert isinstance(error, ZooKeeperUnavailableError), error
    first = batches[0]  # (batches are also bounded by bytes)
    assert batches == [first] and len(calls) > 2 * first
    assert f"after writing {first:,} of {len(calls):,} jobs" in str(error)
    assert len(error.submitted) == first
    assert len(error.not_known) == len(calls) - first
    own_server.start()
    # Read unbounded (the store waits for the reconnection; get_result's own bound is
    # this test's 1 s CONNECT_TIMEOUT, which a loaded machine's reconnection can pass).
    store = backend.store
    assert store.read_status(error.submitted[-1].id).record.id == error.submitted[-1].id
    assert store.read_status(error.not_known[-1].id) is None  # the third batch: not sent
