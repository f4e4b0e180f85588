"""Security and failure handling with in-process workers on a real ZooKeeper."""

import json
import logging
import queue
import threading

import pytest
from django.tasks import TaskResultStatus
from django.tasks.signals import task_enqueued, task_finished, task_started
from kazoo.client import KazooClient

from tests import tasks
from tests.pending import pending_nodes
from tests.waiting import wait_for_children, wait_until
from zktasks.exceptions import CorruptRecord, PayloadVerificationError
from zktasks.leader import Leader
from zktasks.records import ErrorRecord, StatusRecord
from zktasks.store import Store, failures


def _tamper(zk_client, path, change):
    raw, stat = zk_client.get(path)
    data = json.loads(raw)
    change(data)
    zk_client.set(path, json.dumps(data).encode(), version=stat.version)


def test_tampered_payload_fails_and_never_runs(backend, start_worker, zk_client, tmp_path):
    job = tasks.sleep_then_return.submit(str(tmp_path), 0, "ran")
    path = backend.store.layout.status(job.id)
    _tamper(zk_client, path, lambda d: d["payload"].update(mac="0" * 64))
    start_worker()
    job.wait(timeout=30)
    assert job.status == TaskResultStatus.FAILED
    assert job.errors[-1].exception_class_path == (
        "zktasks.exceptions.PayloadVerificationError")
    assert "signature check" in job.errors[-1].traceback
    assert list(tmp_path.iterdir()) == []  # the task never ran


def test_unsigned_payload_fails_and_never_runs(backend, start_worker, zk_client, tmp_path):
    job = tasks.sleep_then_return.submit(str(tmp_path), 0, "ran")
    _tamper(zk_client, backend.store.layout.status(job.id), lambda d: d["payload"].pop("mac"))
    start_worker()
    job.wait(timeout=30)
    assert "not signed" in job.errors[-1].traceback
    assert list(tmp_path.iterdir()) == []


def test_payload_copied_from_another_job_is_refused(backend, start_worker, zk_client, tmp_path):
    victim = tasks.add.submit(1, 1)
    donor = tasks.sleep_then_return.submit(str(tmp_path), 0, "ran")
    layout = backend.store.layout
    donor_payload = json.loads(zk_client.get(layout.status(donor.id))[0])["payload"]
    _tamper(zk_client, layout.status(victim.id), lambda d: d.update(payload=donor_payload))
    backend.cancel(donor.id)
    start_worker()
    victim.wait(timeout=30)
    assert victim.status == TaskResultStatus.FAILED
    assert victim.errors[-1].exception_class_path.endswith("PayloadVerificationError")
    assert list(tmp_path.iterdir()) == []


def test_a_status_record_copied_whole_from_another_job_is_refused(backend, start_worker,
                                                                  zk_client, tmp_path):
    """The signatures bind the id a record states: a record copied whole (id included)
    is refused because that id is not its znode's."""
    layout = backend.store.layout
    done_donor, done_victim = tasks.add.submit(2, 2), tasks.add.submit(1, 1)
    waiting_victim = tasks.add.submit(3, 3)
    waiting_donor = tasks.mark.submit(str(tmp_path), 1)
    backend.cancel(waiting_donor.id)
    zk_client.set(layout.status(waiting_victim.id),
                  zk_client.get(layout.status(waiting_donor.id))[0])
    # Swapped before any worker read it: the job fails instead of running the donor's call.
    start_worker()
    assert done_donor.wait(timeout=30).return_value == 4
    done_victim.wait(timeout=30)
    zk_client.set(layout.status(done_victim.id), zk_client.get(layout.status(done_donor.id))[0])
    with pytest.raises(CorruptRecord, match="not the job id of its znode"):
        backend.get_result(done_victim.id)
    wait_until(lambda: StatusRecord.from_bytes(
        zk_client.get(layout.status(waiting_victim.id))[0]).state == "FAILED", 30,
        "the record-swapped job to fail")
    record = StatusRecord.from_bytes(zk_client.get(layout.status(waiting_victim.id))[0])
    assert record.id == waiting_victim.id
    assert record.errors[-1].exception_class_path == "zktasks.exceptions.CorruptRecord"
    assert list(tmp_path.iterdir()) == []  # the donor's call never ran


def test_payload_signed_with_another_key_is_refused(settings, zk_hosts, zk_root, start_worker):
    from zktasks.backend import ZooKeeperBackend

    params = {**settings.TASKS["default"]}
    params["OPTIONS"] = {**params["OPTIONS"], "SIGNING_KEY": "someone-else"}
    foreign = ZooKeeperBackend("default", params)
    job = foreign.enqueue(tasks.add, (1, 2), {})
    start_worker()
    from django.tasks import task_backends

    result = task_backends["default"].wait(job.id, timeout=30)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path.endswith("PayloadVerificationError")


def test_a_rotated_signing_key_keeps_what_the_old_one_signed(settings, zk_settings,
                                                            start_worker):
    """Rotating as Django documents for SECRET_KEY: the new key signs, the old one, listed
    in SIGNING_KEY_FALLBACKS, still verifies the jobs and results it signed."""
    from django.tasks import task_backends

    def keys(signing_key, fallbacks=None):
        options = {**settings.TASKS["default"]["OPTIONS"], "SIGNING_KEY": signing_key}
        options.pop("SIGNING_KEY_FALLBACKS", None)
        if fallbacks is not None:
            options["SIGNING_KEY_FALLBACKS"] = fallbacks
        settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": options}}
        return task_backends["default"]

    keys("old-key")
    before = start_worker(name="before")
    done = tasks.add.submit(1, 2)
    assert done.wait(timeout=30).return_value == 3  # its result is signed with old-key
    before.stop(graceful=True)
    assert before.wait_stopped(30)
    waiting = tasks.add.submit(2, 3)  # its payload too

    rotated = keys("new-key", ["old-key"])
    start_worker(name="after")
    assert rotated.wait(waiting.id, timeout=30).return_value == 5
    assert rotated.get_result(done.id).return_value == 3
    after = tasks.add.submit(3, 4).wait(timeout=30)
    assert after.return_value == 7

    # What was written since is signed with the new key alone.
    only_new = keys("new-key", [])
    assert only_new.get_result(waiting.id).return_value == 5
    assert only_new.get_result(after.id).return_value == 7
    with pytest.raises(PayloadVerificationError, match="SIGNING_KEY_FALLBACKS"):
        _ = only_new.get_result(done.id).return_value


def test_corrupt_status_record_fails_job_and_worker_goes_on(backend, start_worker, zk_client):
    job = tasks.add.submit(1, 2)
    zk_client.set(backend.store.layout.status(job.id), b"\x80not json")
    start_worker()
    ok = tasks.add.submit(2, 2).wait(timeout=30)
    assert ok.return_value == 4
    record = StatusRecord.from_bytes(zk_client.get(backend.store.layout.status(job.id))[0])
    assert record.state == "FAILED"
    assert record.errors[0].exception_class_path == "zktasks.exceptions.CorruptRecord"


def test_django_tasks_log_lines_are_written_without_other_receivers(backend, start_worker,
                                                                      caplog):
    """Django's own receivers log each start and outcome on the django.tasks logger; a
    worker that sends no signal (no other receiver) writes those lines itself."""
    caplog.set_level(logging.INFO, logger="django.tasks")
    start_worker()
    ok, bad = tasks.add.submit(1, 1), tasks.boom.submit("no")
    ok.wait(timeout=30)
    bad.wait(timeout=30)

    def line(job, state):
        return [r.levelname for r in caplog.records if r.name == "django.tasks"
                and r.getMessage() == f"Task id={job.id} path={job.task.module_path} "
                                      f"state={state}"]
    wait_until(lambda: line(bad, "FAILED"), 60, "the failure's line")
    wait_until(lambda: line(ok, "SUCCESSFUL"), 60, "the success's line")
    assert line(ok, "RUNNING") == ["INFO"] and line(ok, "SUCCESSFUL") == ["INFO"]
    assert line(bad, "FAILED") == ["ERROR"]


def test_signals_fire_after_each_recorded_transition(backend, start_worker):
    seen = []

    def record(signal_name):
        def receiver(sender, task_result, **kwargs):
            fresh = backend.get_result(task_result.id)
            seen.append((signal_name, task_result.status, fresh.status))
        return receiver

    receivers = {name: record(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        start_worker()
        job = tasks.add.submit(1, 1)
        job.wait(timeout=30)
        wait_until(lambda: len(seen) == 3, 60, "three signals")
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    # Each signal reports a state already recorded in ZooKeeper.
    assert seen == [
        ("enqueued", "READY", "READY"),
        ("started", "RUNNING", "RUNNING"),
        ("finished", "SUCCESSFUL", "SUCCESSFUL"),
    ]


def test_leader_fails_over_when_its_worker_stops(backend, start_worker):
    first = start_worker(name="first")
    wait_until(lambda: first.leader is not None and first.leader.is_leader, 60, "a leader")
    second = start_worker(name="second")
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2
    first.stop(graceful=False)
    assert first.wait_stopped(60)
    wait_until(lambda: second.leader is not None and second.leader.is_leader, 60,
               "the second worker to lead")
    assert tasks.add.submit(2, 2).wait(timeout=30).worker_ids == [second.worker_id]


def _expire(zk_hosts, client):
    """Expire `client`'s session on the server: a second handle with its id, closed."""
    session_id, password = client.client_id
    twin = KazooClient(hosts=zk_hosts, client_id=(session_id, password), timeout=4.0)
    twin.start(timeout=60)
    twin.stop()
    twin.close()
    return session_id


def test_a_worker_that_may_not_lead_says_when_nobody_contends(backend, start_worker, caplog):
    caplog.set_level(logging.INFO, logger="zktasks.worker")
    follower = start_worker(name="follower", lead=False)
    wait_until(lambda: "no worker contends for leadership" in caplog.text, 60,
               "the warning that no worker contends")
    assert f"worker={follower.worker_id}" in caplog.text
    start_worker(name="leader")
    wait_until(lambda: "a worker contends for leadership again" in caplog.text, 60,
               "the news that one does")


def test_the_leader_warns_once_of_jobs_in_a_queue_no_worker_serves(
        backend, start_worker, caplog):
    """Jobs in a queue no worker serves used to wait without a word (a worker started
    without --queues serves only "default" when QUEUES is [])."""
    caplog.set_level(logging.INFO, logger="zktasks.leader")
    start_worker(queues=["default"])
    waiting = tasks.email.submit("ada@example.com")  # queue "emails"
    wait_until(lambda: "no live worker serves it" in caplog.text, 60, "the warning")
    assert "queue=emails" in caplog.text and "runworker --queues emails" in caplog.text
    tasks.add.submit(1, 2).wait(timeout=30)  # the leader ticks on: no second warning
    start_worker(name="mailer", queues=["emails"])
    waiting.wait(timeout=30)
    wait_until(lambda: "queue=emails is served again" in caplog.text, 60, "the all-clear")
    assert caplog.text.count("no live worker serves it") == 1


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_run_whose_worker_session_expired_is_asked_to_stop_and_its_job_runs_again(
        backend, start_worker, zk_hosts, tmp_path, pool):
    """The leader hands the job back once the session is gone (here it comes back to the
    same worker, under its new identity). The first run, still going, sees
    cancel_requested() and stops instead of running alongside its rerun, and the
    JobCancelled it raises is not recorded as the job's outcome."""
    worker = start_worker(pool=pool, concurrency=2)
    job = tasks.stops_when_its_worker_is_lost.submit(str(tmp_path), 60)
    wait_until(lambda: (tmp_path / "1.started").exists(), 30, "the first run to start")
    first_identity = worker.worker_id
    _expire(zk_hosts, worker.client)
    wait_until(lambda: (tmp_path / "asked").exists(), 30,
               "the first run to see cancel_requested()")
    job.wait(timeout=30)
    assert job.status == TaskResultStatus.SUCCESSFUL
    assert job.return_value == 2  # the second attempt's
    assert job.worker_ids[0] == first_identity
    assert job.worker_ids[1] == worker.worker_id != first_identity
    assert [e.exception_class_path for e in job.errors] == [
        "zktasks.exceptions.WorkerLost"]
    assert not (tmp_path / "not-asked").exists()


def test_a_cancel_for_a_rerun_outlives_the_end_of_the_first_run_in_the_same_process(
        backend, start_worker, zk_hosts, monkeypatch):
    """The thread pool keeps cancel requests by job id, per process. A job handed back
    after a lost session and assigned again to this process's new identity has two runs
    here for a while; the first one ending (its run, then the worker letting go of it)
    used to drop the cancel requested for the rerun, which then ran to its end."""
    from zktasks import context

    gates = {name: threading.Event() for name in
             ("first started", "first may end", "rerun started", "first gone")}
    monkeypatch.setattr(tasks, "rerun_gates", gates)
    worker = start_worker(pool="thread", concurrency=2)
    job = tasks.rerun_sees_a_cancel_after_its_first_run_ends.submit(30)
    assert gates["first started"].wait(30)
    _expire(zk_hosts, worker.client)
    assert gates["rerun started"].wait(30), "the job to come back under the new identity"

    let_go = worker._wake_if_draining  # the last step of a run's bookkeeping

    def first_run_let_go(job_id):
        let_go(job_id)
        if job_id == job.id:  # the rerun is still waiting: this was the first run
            gates["first gone"].set()

    monkeypatch.setattr(worker, "_wake_if_draining", first_run_let_go)
    assert job.cancel() is False  # running: asked to stop
    wait_until(lambda: job.id in context._cancelled_jobs, 30, "the cancel to reach the runner")
    gates["first may end"].set()
    job.wait(timeout=60)
    assert job.status == TaskResultStatus.FAILED
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"


def test_stale_leader_write_is_refused_by_its_fence(backend, zk_hosts, zk_client):
    """A leader whose session expired must not assign, even if its client reconnects."""
    tasks.add.submit(1, 2)
    store = backend.store
    layout = store.layout
    stale = KazooClient(hosts=zk_hosts, timeout=4.0)
    stale.start(timeout=60)
    try:
        lock = stale.Lock(layout.leader, identifier="stale")
        assert lock.acquire(timeout=60)
        fence = layout.election_node(lock.node)
        session_id = _expire(zk_hosts, stale)
        wait_until(lambda: zk_client.exists(fence) is None, 60, "the fence to vanish")
        wait_until(lambda: stale.connected and stale.client_id[0] != session_id, 60,
                   "the stale client to reconnect on a new session")
        stale_store = Store(stale, backend.conf)
        zk_client.ensure_path(layout.worker_assignments("w1"))
        [node] = pending_nodes(zk_client, layout)
        results = stale_store.assign(fence, [("default", node, "w1")])
        assert failures(results)[0][0] == 0  # the fence check failed; nothing applied
        assert pending_nodes(zk_client, layout) == [node]
        assert zk_client.get_children(layout.worker_assignments("w1")) == []
    finally:
        stale.stop()
        stale.close()


def test_a_contender_whose_session_expired_while_it_waited_leads_once_elected(
        backend, zk_hosts, zk_client):
    """kazoo's Lock carries a waiting contender over to a new session after expiry. The
    LOST it saw while waiting was the old session's: elected on the new one, it leads; it
    does not step down at once (as bench/chaos.py found it doing) and hand over."""
    layout = backend.store.layout
    holder = KazooClient(hosts=zk_hosts, timeout=4.0)
    waiting = KazooClient(hosts=zk_hosts, timeout=4.0)
    holder.start(timeout=60)
    waiting.start(timeout=60)
    stop = threading.Event()
    leader = Leader(Store(waiting, backend.conf), "waiter", stop=stop)
    changes = []
    leader.on_change = changes.append
    waiting.add_listener(leader.on_state)  # as the worker forwards its state changes
    thread = threading.Thread(target=leader.run, name="test-leader", daemon=True)
    try:
        lock = holder.Lock(layout.leader, identifier="holder")
        assert lock.acquire(timeout=60)
        thread.start()
        [first] = [c for c in wait_for_children(zk_client, layout.leader, lambda c: len(c) == 2)
                   if c != lock.node]
        old_session = _expire(zk_hosts, waiting)
        # The Lock recipe puts a new node in the queue on the new session.
        wait_for_children(zk_client, layout.leader, lambda c: len(c) == 2 and first not in c,
                          timeout=60)
        assert waiting.client_id[0] != old_session
        assert leader.fence_lost  # the old session's LOST reached the waiting contender
        # A registered worker and a pending job: once the job is assigned, the leader
        # has gone past the point where it stepped down.
        zk_client.create(layout.worker_assignments("ghost"), b"", makepath=True)
        zk_client.create(layout.worker("ghost"), json.dumps(
            {"queues": ["default"], "concurrency": 1, "prefetch": 0}).encode(), ephemeral=True,
            makepath=True)
        job = tasks.add.submit(1, 2)
        lock.release()
        wait_for_children(zk_client, layout.worker_assignments("ghost"),
                          lambda c: c == [job.id])
        assert changes == [True]
        assert leader.is_leader and not leader.fence_lost
    finally:
        leader.cancel()
        thread.join(60)
        for client in (holder, waiting):
            client.stop()
            client.close()
    assert not thread.is_alive()


def _ghost_takes_and_dies(backend, zk_client, job, *, seed_losses=0, before_death=None):
    """A bare "worker" registers, is assigned `job`, starts it, and its session ends
    (after calling `before_death`, if given)."""
    layout = backend.store.layout
    ghost = KazooClient(hosts=backend.conf.hosts, timeout=4.0)
    ghost.start(timeout=60)
    try:
        data = json.dumps({"queues": ["default"], "concurrency": 1, "prefetch": 0}).encode()
        tx = ghost.transaction()
        tx.create(layout.worker_assignments("ghost"), b"")
        tx.create(layout.worker("ghost"), data, ephemeral=True)
        assert not failures(tx.commit())
        wait_for_children(zk_client, layout.worker_assignments("ghost"), lambda c: c == [job.id])
        ghost_store = Store(ghost, backend.conf)
        found = ghost_store.read_status(job.id)
        earlier = tuple(ErrorRecord(exception_class_path="zktasks.exceptions.WorkerLost",
                                    message="lost", traceback="lost\n", attempt=n + 1)
                        for n in range(seed_losses))
        running = found.record.evolve(state="RUNNING", attempts=seed_losses + 1,
                                      worker_ids=("ghost",), errors=earlier)
        assert ghost_store.start("ghost", job.id, running, found.version) is not None
        if before_death is not None:
            before_death()
    finally:
        ghost.stop()
        ghost.close()


def test_jobs_of_a_vanished_worker_are_handed_back(backend, start_worker, zk_client, caplog):
    """A worker whose session ends mid-job: the leader moves its job back to pending,
    notes the lost attempt, and another worker runs it (at-least-once)."""
    # The leader serves another queue, so the only taker of "default" is the ghost.
    leader = start_worker(name="leader", queues=["other"])
    wait_until(lambda: leader.leader is not None and leader.leader.is_leader, 60, "a leader")
    job = tasks.add.submit(5, 5)
    _ghost_takes_and_dies(backend, zk_client, job)
    survivor = start_worker(name="survivor", concurrency=1)
    result = job.wait(timeout=30)
    assert result.return_value == 10
    assert result.worker_ids == ["ghost", survivor.worker_id]
    assert result.attempts == 2
    assert result.errors[0].exception_class_path == "zktasks.exceptions.WorkerLost"
    assert not zk_client.exists(backend.store.layout.worker_assignments("ghost"))
    # The leader says what it saw and what it did (logged just after its multi landed).
    wait_until(lambda: f"job handed back job={job.id} from=ghost" in caplog.text, 60,
               "the hand-back to be logged")
    assert "worker vanished worker=ghost jobs=1" in caplog.text


def test_a_cancel_its_dead_worker_never_acted_on_still_holds(backend, start_worker,
                                                             zk_client):
    """Cancelled while a worker held it, and that worker died before acting on it: the
    job handed back is failed as cancelled, never run again (it used to run to success
    on the next worker)."""
    leader = start_worker(name="leader", queues=["other"])
    wait_until(lambda: leader.leader is not None and leader.leader.is_leader, 60, "a leader")
    job = tasks.add.submit(5, 5)
    _ghost_takes_and_dies(backend, zk_client, job,
                          before_death=lambda: job.cancel() is False or pytest.fail("held"))
    survivor = start_worker(name="survivor", concurrency=1)
    result = job.wait(timeout=30)
    assert result.status == "FAILED"
    assert [e.exception_class_path for e in result.errors] == [
        "zktasks.exceptions.WorkerLost", "zktasks.exceptions.JobCancelled"]
    assert result.worker_ids == ["ghost"]  # the survivor never started it
    assert not zk_client.get_children(backend.store.layout.worker_assignments(
        survivor.worker_id))


def test_job_that_keeps_losing_its_workers_is_failed_not_rerun(backend, start_worker,
                                                                 zk_client, caplog):
    """Failed by the leader itself, so no worker records the outcome: the leader's
    process sends task_finished for it (and Django's ERROR line), once."""
    finished = queue.Queue()

    def receiver(sender, task_result, **kwargs):
        finished.put(task_result)

    task_finished.connect(receiver, weak=False)
    try:
        leader = start_worker(name="leader", queues=["other"])
        wait_until(lambda: leader.leader is not None and leader.leader.is_leader, 60,
                   "a leader")
        job = tasks.add.using(unique_key="poison").submit(1, 1)
        _ghost_takes_and_dies(backend, zk_client, job, seed_losses=2)  # the third loss
        result = job.wait(timeout=30)
        assert result.status == "FAILED"
        assert len(result.errors) == 3
        assert "3 lost workers" in result.errors[-1].traceback
        assert pending_nodes(zk_client, backend.store.layout) == []
        assert zk_client.get_children(backend.store.layout.unique) == []  # key freed
        assert backend.store.recent_finished(5) == [job.id]
        wait_until(lambda: f"its workers kept vanishing job={job.id}" in caplog.text, 60,
                   "the failure to be logged")
        assert "job handed back" not in caplog.text
        sent = finished.get(timeout=60)
        assert (sent.id, sent.status, sent.args) == (job.id, "FAILED", [1, 1])
        assert sent.errors[-1].exception_class_path == "zktasks.exceptions.WorkerLost"
        assert finished.empty()
        assert any(r.name == "django.tasks" and r.levelno == logging.ERROR
                   and f"Task id={job.id} path=tests.tasks.add state=FAILED" in r.getMessage()
                   for r in caplog.records)  # Django's own receiver's line
    finally:
        task_finished.disconnect(receiver)


@pytest.mark.parametrize("data", [
    {"queues": ["other"], "concurrency": None},
    {"queues": ["default"], "concurrency": "abc"},
    {"queues": 5},
    {"queues": [["a"]], "prefetch": []},
    ["not", "an", "object"],
])
def test_a_worker_znode_with_odd_fields_does_not_stop_assignment(
        backend, start_worker, zk_client, data):
    """Parsed outside the leader's guard, a field of the wrong type ended its term, and
    every next leader's at the same read: nothing was assigned anywhere (an audit saw 48
    elections in 10 s). Such a worker gets no jobs; the others go on."""
    worker = start_worker()
    wait_until(lambda: worker.leader is not None and worker.leader.is_leader, 60, "a leader")
    zk_client.create(backend.store.layout.worker("ghost"), json.dumps(data).encode(),
                     ephemeral=True)
    assert tasks.add.submit(2, 3).wait(timeout=30).return_value == 5
    assert worker.leader.is_leader


def _stray_child_under(zk_client, path):
    zk_client.create(path + "/stray", b"hand-made")


def test_a_znode_under_a_pending_job_is_moved_aside_and_the_job_assigned(
        backend, start_worker, zk_client):
    """The delete of the job's node in the assignment multi met NotEmpty on every try:
    the first job in priority order sank every batch (nothing was assigned, thousands of
    refused multis a second)."""
    layout = backend.store.layout
    first = tasks.add.using(priority=10).submit(1, 1)
    [node] = pending_nodes(zk_client, layout)
    _stray_child_under(zk_client, layout.job("default", node))
    others = [tasks.add.submit(i, i) for i in range(3)]
    start_worker()
    assert first.wait(timeout=30).return_value == 2
    assert [job.wait(timeout=30).return_value for job in others] == [0, 2, 4]
    [letter] = backend.dead_letters(10)
    assert letter.kind == "foreign_name" and letter.path.endswith(f"{node}/stray")


def test_a_znode_under_a_delayed_job_is_moved_aside_and_the_job_promoted(
        backend, start_worker, zk_client):
    from datetime import timedelta

    from django.utils import timezone

    from tests.pending import delayed_nodes

    layout = backend.store.layout
    due = timezone.now() + timedelta(seconds=1)
    job = tasks.add.using(run_after=due).submit(2, 2)
    later = tasks.add.using(run_after=due + timedelta(seconds=1)).submit(3, 3)
    name = min(delayed_nodes(zk_client, layout))
    _stray_child_under(zk_client, layout.delayed_job(name))
    start_worker()
    assert job.wait(timeout=30).return_value == 4
    assert later.wait(timeout=30).return_value == 6
    assert [letter.kind for letter in backend.dead_letters(10)] == ["foreign_name"]


def test_a_znode_under_a_vanished_workers_assignment_is_moved_aside_and_the_job_runs(
        backend, start_worker, zk_client):
    layout = backend.store.layout
    job = tasks.add.submit(4, 4)
    [node] = pending_nodes(zk_client, layout)
    # As if a worker "ghost" held it and vanished, leaving a znode under the assignment.
    tx = zk_client.transaction()
    tx.create(layout.worker_assignments("ghost"), b"")
    tx.create(layout.assignment("ghost", job.id),
              json.dumps({"queue": "default", "node": node}).encode())
    tx.create(layout.assignment("ghost", job.id) + "/stray", b"")
    tx.delete(layout.job("default", node))
    assert not failures(tx.commit())
    start_worker()
    assert job.wait(timeout=30).return_value == 8
    assert [letter.kind for letter in backend.dead_letters(10)] == ["foreign_name"]
