"""A worker learns of its assignments from a persistent recursive watch (ZooKeeper 3.6+,
zktasks/connection.py), listing them only when it registers or reconnects; with
one-shot watches (kazoo's own handler, an older server) it lists them on every change."""

import threading
from collections import Counter

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from zktasks import store as store_module
from zktasks.store import Store

JOBS = 12  # more than a worker's capacity (2 runners + 8 prefetched): finishes must be seen
PREFETCH = 8  # fixed: short jobs would raise the default to 32 (prefetch.py), past JOBS


def _count_listings(monkeypatch, thread_name: str) -> list[str]:
    """The worker ids whose assignments the thread called `thread_name` listed, once per
    listing."""
    listed: list[str] = []
    children = Store.children

    def counting(self, path, watch=None):
        parent, _, name = path.rpartition("/")
        if (threading.current_thread().name == thread_name
                and parent == self.layout.assignments):
            listed.append(name)
        return children(self, path, watch=watch)

    monkeypatch.setattr(Store, "children", counting)
    return listed


@pytest.fixture
def assignment_lists(monkeypatch):
    """Listings by the worker's main loop (the thread zk_worker, the plugin's, runs it in)."""
    return _count_listings(monkeypatch, "zk-worker")


@pytest.fixture
def connections(monkeypatch):
    """How many times each client connected, by its connection handler: a worker lists
    its assignments once per connection (a reconnection the machine's load causes, a
    missed ping, counts too). The idle relist every RELIST_EVERY is put off."""
    from zktasks import worker as worker_module
    from zktasks.connection import EagerConnectionHandler

    counts: Counter = Counter()
    connect = EagerConnectionHandler._connect

    def counting(self, *args):
        result = connect(self, *args)
        counts[id(self)] += 1
        return result

    monkeypatch.setattr(EagerConnectionHandler, "_connect", counting)
    monkeypatch.setattr(worker_module, "RELIST_EVERY", 3600.0)
    return lambda worker: counts[id(worker.client._connection)]




def _run_jobs(worker, timeout=30):
    for i in range(JOBS):  # one at a time: every job is a change of its own
        result = tasks.add.submit(i, 1).wait(timeout=timeout)
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == i + 1
        assert result.worker_ids == [worker.worker_id]


def test_a_worker_lists_its_assignments_once_and_follows_the_watch(
        backend, start_worker, assignment_lists, connections):
    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    assert worker._persistent == backend.store.layout.worker_assignments(worker.worker_id)
    # At registration only (and once more per reconnection, if the machine caused one).
    assert assignment_lists.count(worker.worker_id) == connections(worker)


def test_without_persistent_watches_a_worker_lists_them_on_every_change(
        backend, start_worker, assignment_lists, monkeypatch):
    monkeypatch.setattr(store_module, "add_persistent_watch", lambda *args, **kw: False)
    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    assert worker._persistent is None
    assert assignment_lists.count(worker.worker_id) > JOBS  # an assignment and a finish


def test_after_a_reconnection_the_watch_is_armed_again(backend, start_worker,
                                                      assignment_lists, connections):
    """ZooKeeper forgets a connection's watches with it (and kazoo does not re-arm
    them): the worker lists its assignments once more and arms the watch again."""
    from kazoo.protocol.connection import _CONNECTION_DROP  # kazoo's own test hook
    from kazoo.protocol.states import KazooState

    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    resumed = threading.Event()
    session = worker.client.client_id

    def on_state(state):
        if state == KazooState.CONNECTED:
            resumed.set()

    worker.client.add_listener(on_state)
    worker.client._call(_CONNECTION_DROP, worker.client.handler.async_result())
    assert resumed.wait(30), "the worker's client did not reconnect"
    assert worker.client.client_id == session  # the same session: a reconnection
    _run_jobs(worker)
    assert connections(worker) >= 2
    # Registration, then one per reconnection (the one made here, and any other).
    assert assignment_lists.count(worker.worker_id) == connections(worker)
    assert worker._persistent is not None



def test_a_job_retried_at_once_to_the_same_worker_is_run_again(backend, start_worker):
    """A retry with no backoff leaves with the outcome's multi (deleting the assignment,
    whose deletion event the worker skips as its own) and comes back to this worker as
    a new assignment, which it must not skip. (Should it come back before the worker
    has forgotten the job, worker._reassigned reads it then; that window is too narrow
    for this test to hit reliably.)"""
    worker = start_worker(prefetch=PREFETCH)
    for _ in range(5):
        # Under RELIST_EVERY: a lost event would show as a time-out, not a slow pass.
        result = tasks.flaky.submit(succeed_on=3).wait(timeout=20)
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 3
        assert result.worker_ids == [worker.worker_id] * 3


def test_arming_the_watch_again_keeps_the_leaders_child_watch_in_the_same_process(
        backend, start_worker, monkeypatch):
    """ZooKeeper before 3.9 keeps one watch mode per connection and path (ZOOKEEPER-4466).
    A worker and the leader in one process share a connection, and both watch the
    worker's assignments: the leader with a child watch, the worker with a persistent
    recursive one. Armed in that order (after a reconnection they re-arm in either
    order), the worker's addWatch turned the leader's watch recursive: the leader was
    told of none of the worker's finishes, took it for full, and assigned it nothing
    until its 30 s full read. add_persistent_watch now hands such a watch its event, and
    the leader lists again. (A leader that can follows assignments/ with a persistent
    watch of its own, another path: here it is kept to child watches, as where it
    cannot.)"""
    from zktasks.leader import Leader

    monkeypatch.setattr(Leader, "_watch_assignments", lambda self: None)
    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)  # by now the leader has a child watch on this worker's assignments
    assert not worker.leader._assignments_watched
    path = backend.store.layout.worker_assignments(worker.worker_id)
    assert worker._watch_assignments(path)  # the worker's watch, armed after the leader's
    # More jobs than the worker's capacity (2 runners + 8 prefetched): unless its
    # finishes reach the leader, the leader stops assigning before the last ones, for
    # longer than this wait (its full read comes every 30 s).
    _run_jobs(worker, timeout=15)


# -- the leader --------------------------------------------------------------------------


@pytest.fixture
def leader_lists(monkeypatch):
    """Listings of workers' assignments by the leader's thread, once per listing; its
    full reads (each term, reconnection or RECONCILE_EVERY) list every worker's once."""
    from zktasks import leader as leader_module

    monkeypatch.setattr(leader_module, "RECONCILE_EVERY", 3600.0)
    return _count_listings(monkeypatch, "zktasks-leader")


def test_the_leader_follows_assignments_by_the_watch_not_by_listing_them(
        backend, start_worker, leader_lists, connections):
    """The leader learns of a worker's finishes from a persistent recursive watch on
    assignments/, and lists a worker's assignments only at a full read."""
    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    assert worker.leader._assignments_watched
    assert leader_lists.count(worker.worker_id) == connections(worker)


def test_without_persistent_watches_the_leader_lists_assignments_on_change(
        backend, start_worker, leader_lists, monkeypatch):
    monkeypatch.setattr(store_module, "add_persistent_watch", lambda *args, **kw: False)
    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    assert not worker.leader._assignments_watched
    assert leader_lists.count(worker.worker_id) > JOBS // 2


def test_finishes_reach_the_leader_while_jobs_wait_for_a_slot(
        backend, start_worker, leader_lists, connections):
    """Three times the worker's capacity submitted at once: the jobs past it wait in
    their shard, and only the finishes' events (no listing, and no full read for an
    hour) tell the leader that slots are free. One it missed would leave jobs pending
    for longer than the wait."""
    worker = start_worker(prefetch=PREFETCH)
    count = 3 * (2 + PREFETCH)
    results = [tasks.add.submit(i, 1) for i in range(count)]
    for i, result in enumerate(results):
        done = result.wait(timeout=20)
        assert done.status == TaskResultStatus.SUCCESSFUL
        assert done.return_value == i + 1
    assert leader_lists.count(worker.worker_id) == connections(worker)


def test_after_a_reconnection_the_leader_arms_its_watch_again(
        backend, start_worker, leader_lists, connections):
    """The server forgets the leader's watch with the connection: the full read after
    the reconnection arms it again and lists each worker's assignments once more. Jobs
    beyond the worker's capacity then still finish: the leader sees the finishes."""
    from kazoo.protocol.connection import _CONNECTION_DROP
    from kazoo.protocol.states import KazooState

    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    resumed = threading.Event()
    worker.client.add_listener(
        lambda state: resumed.set() if state == KazooState.CONNECTED else None)
    worker.client._call(_CONNECTION_DROP, worker.client.handler.async_result())
    assert resumed.wait(30), "the worker's client did not reconnect"
    _run_jobs(worker, timeout=15)
    assert connections(worker) >= 2
    assert worker.leader._assignments_watched
    assert leader_lists.count(worker.worker_id) == connections(worker)


def test_a_leader_that_steps_down_stops_following_assignments(backend, start_worker):
    """Once a term ends the watch is removed: nobody would read its events."""
    from zktasks.connection import _PERSISTENT, _server_path

    worker = start_worker(prefetch=PREFETCH)
    _run_jobs(worker)
    leader = worker.leader
    path = _server_path(worker.client, backend.store.layout.assignments)
    assert path in getattr(worker.client, _PERSISTENT)
    (thread,) = [t for t in threading.enumerate() if t.name == "zktasks-leader"]
    leader.cancel()  # the term ends (Leader.run returns), and this worker leads no more
    thread.join(30)
    assert not thread.is_alive()
    assert path not in getattr(worker.client, _PERSISTENT)
    assert not leader._assignments_watched
    # The worker's own watch on its assignments is another path, and stays.
    assert _server_path(worker.client, backend.store.layout.worker_assignments(
        worker.worker_id)) in getattr(worker.client, _PERSISTENT)
