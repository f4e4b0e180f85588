"""A worker's session ends while the worker is busy: events read late, a start sent again
on the next session, a cancel that must reach a rerun. In-process workers, a real
ZooKeeper, sessions expired on the server (a second handle with the same id, closed)."""

import logging
import threading

from django.tasks import TaskResultStatus
from kazoo.protocol.states import KazooState

from tests import tasks
from tests.integration.test_faults import _expire
from tests.waiting import wait_until


class _Recorded:
    """The worker's event queue, noting what is put in it."""

    def __init__(self, events):
        self.events = events
        self.put_items: list = []

    def put(self, item) -> None:
        self.events.put(item)
        self.put_items.append(item)

    def get(self, *args, **kwargs):
        return self.events.get(*args, **kwargs)

    def empty(self) -> bool:
        return self.events.empty()

    def put_after(self, first, then) -> bool:
        items = list(self.put_items)
        return first in items and then in items[items.index(first) + 1:]


def test_a_connected_notice_read_after_the_session_ended_leaves_one_identity(
        backend, start_worker, zk_hosts, zk_client, monkeypatch):
    """The main loop reads events late (it was busy in a ZooKeeper call). A CONNECTED of
    the old session, read once the next session is up, made it register there; then the
    old session's LOST made it register a second identity. The first stayed alive and
    idle on the live session, and the leader handed it jobs that nobody read."""
    worker = start_worker(name="late")
    layout = backend.store.layout
    first_identity, old_session = worker.worker_id, worker.client.client_id[0]
    busy, gate = threading.Event(), threading.Event()
    read_own_znode = worker._read_own_znode

    def held():
        busy.set()
        gate.wait(60)
        read_own_znode()

    monkeypatch.setattr(worker, "_read_own_znode", held)
    events = _Recorded(worker._events)
    monkeypatch.setattr(worker, "_events", events)
    events.put(("own", None))
    assert busy.wait(30)
    # Queued before the expiry, read after it: the notice of a reconnection that came
    # just before the session ended.
    events.put(("state", KazooState.CONNECTED))
    _expire(zk_hosts, worker.client)
    wait_until(lambda: events.put_after(("state", KazooState.LOST),
                                        ("state", KazooState.CONNECTED)), 30,
               "the old session's LOST and the next CONNECTED to be queued")
    assert worker.client.client_id[0] != old_session
    gate.set()
    wait_until(lambda: events.empty() and not worker._lost
               and worker.worker_id != first_identity, 30, "a new registration")
    wait_until(lambda: zk_client.get_children(layout.workers) == [worker.worker_id], 30,
               "one identity registered")
    assert [tasks.add.submit(n, 1).wait(timeout=30).return_value for n in range(4)] \
        == [1, 2, 3, 4]


def test_a_start_sent_again_on_the_next_session_does_not_run_the_job(
        backend, start_worker, zk_hosts, tmp_path, monkeypatch, caplog):
    """A start cut off by the expiry is sent again once the client is back, on the next
    session, and lands: the old identity's assignment is still there until the leader
    hands it back. The job had not begun; run under the dead identity, it ran alongside
    the rerun the leader then made."""
    caplog.set_level(logging.WARNING, logger="zktasks.worker")
    worker = start_worker(name="resent", pool="thread", concurrency=2)
    first_identity = worker.worker_id
    store = worker.store
    commit = store.commit
    cut_off = threading.Event()

    def start_cut_off_by_the_expiry(build, **kwargs):
        # The start's multi (written by a runner or the committer thread; the worker's
        # other multis are its own registration and outcomes after this one).
        if not cut_off.is_set() and threading.current_thread().name.startswith(
                ("zktasks-run", "zktasks-committer")):
            cut_off.set()
            _expire(zk_hosts, worker.client)
            wait_until(lambda: worker.worker_id != first_identity and not worker._lost, 30,
                       "the worker to register again")
        return commit(build, **kwargs)

    requeue = store.requeue
    decided = threading.Event()

    def after_the_runner_decided(*args, **kwargs):
        # The leader hands the job back only once the runner has run it or turned it
        # down: either way, what the runner did is seen.
        wait_until(decided.is_set, 30, "the runner to run the job or turn it down")
        return requeue(*args, **kwargs)

    monkeypatch.setattr(store, "commit", start_cut_off_by_the_expiry)
    monkeypatch.setattr(store, "requeue", after_the_runner_decided)
    job = tasks.notes_its_attempt.submit(str(tmp_path))

    def runner_decided():
        if (tmp_path / "1.ran").exists() or "job not started" in caplog.text:
            decided.set()
        return decided.is_set()

    wait_until(runner_decided, 60, "the runner to run the job or turn it down")
    job.wait(timeout=60)
    assert job.status == TaskResultStatus.SUCCESSFUL
    assert sorted(p.name for p in tmp_path.glob("*.ran")) == ["2.ran"]
    assert job.worker_ids == [first_identity, worker.worker_id]
    assert [e.exception_class_path for e in job.errors] == ["zktasks.exceptions.WorkerLost"]


def test_a_cancel_reaches_the_rerun_while_the_first_run_goes_on(
        backend, start_worker, zk_hosts, tmp_path):
    """Task processes: after a lost session one slot still runs the first run (it does
    not look at cancel_requested()), the other the rerun under the new identity. A
    cancel of the job reached only the first slot that held it, the old run's."""
    worker = start_worker(name="two-runs", pool="process", concurrency=2)
    job = tasks.cancel_reaches_the_rerun.submit(str(tmp_path), 20)
    try:
        wait_until(lambda: (tmp_path / "1.started").exists(), 60, "the first run")
        _expire(zk_hosts, worker.client)
        wait_until(lambda: (tmp_path / "2.started").exists(), 60, "the rerun")
        assert job.cancel() is False  # running: asked to stop
        job.wait(timeout=60)
    finally:
        (tmp_path / "release").touch()
    assert (tmp_path / "rerun-asked").exists()
    assert job.status == TaskResultStatus.FAILED
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"


def test_a_relist_asked_for_while_the_list_travels_is_not_lost(
        backend, start_worker, monkeypatch):
    """_recorded (on the committer thread) asks for a whole list when a job it just
    finished was assigned here again: the event naming it went elsewhere. Asked while the
    main loop's own list was on its way, the request was wiped when that list came back,
    and the job waited for the next periodic list (30 s)."""
    worker = start_worker(name="relist")
    wait_until(lambda: worker._listed_at > 0 and not worker._relist, 30, "the first list")
    path = worker.store.layout.worker_assignments(worker.worker_id)
    children = worker.store.children
    lists = []

    def list_meanwhile_asked_again(wanted, *args, **kwargs):
        found = children(wanted, *args, **kwargs)
        # The main loop's lists (it runs on the fixture's thread); not the leader's.
        if wanted == path and threading.current_thread().name == "zk-worker":
            lists.append(found)
            if len(lists) == 1:
                # As _recorded does, while this list was on its way.
                worker._relist = True
                worker._events.put(("assignments", None))
        return found

    monkeypatch.setattr(worker.store, "children", list_meanwhile_asked_again)
    worker._relist = True
    worker._events.put(("assignments", None))
    wait_until(lambda: len(lists) >= 2, 30, "the list asked for meanwhile")
