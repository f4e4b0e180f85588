"""The live endpoint is fed by watches: polls read nothing, a change reads only its path."""

import threading
import time

import pytest

from tests import tasks
from tests.dashboard.conftest import url
from tests.waiting import wait_until
from zktasks import dashboard

READS = ("get", "get_children", "exists", "get_async", "get_children_async", "exists_async")
LIVE_THREAD = "zktasks-dashboard-live"


@pytest.fixture
def reads(backend, monkeypatch):
    """Record every read of the dashboard's shared client: (method, path, thread name)."""
    client = dashboard.connect(backend.conf)
    calls = []

    def spy(name, method):
        def call(path, *args, **kwargs):
            calls.append((name, path, threading.current_thread().name))
            return method(path, *args, **kwargs)
        return call

    for name in READS:
        monkeypatch.setattr(client, name, spy(name, getattr(client, name)))
    return calls


def poll(client):
    response = client.get(url("zktasks_live"))
    assert response.status_code == 200
    return response.json()


def settle(client, predicate, message):
    seen = {}

    def check():
        seen["data"] = poll(client)
        return predicate(seen["data"])

    wait_until(check, 60, message)
    return seen["data"]


def passes_done(state, count=2):
    """Return once the live thread has taken `count` wake-ups from us, one after the
    other: every pass it began before the last one, and the reads of that pass, is over.
    (A wake-up is taken when the thread clears the event, at the top of a pass.)"""
    for _ in range(count):
        state._wake.set()
        wait_until(lambda: not state._wake.is_set(), 60, "the live thread to take a wake-up")


def test_polls_read_nothing_while_nothing_changes(admin_client, backend, start_worker, reads):
    start_worker()
    for i in range(3):
        tasks.add.submit(i, i).wait(timeout=30)
    settle(admin_client, lambda d: d["totals"]["succeeded"] == 3 and d["leader"], "settled")
    # Settled includes the leader sweeping the empty shards: while a queue has shards,
    # their counts are re-read once a second (a shard's children fire no watch we hold).
    queue = backend.store.layout.queue("default")
    # Up to 15 s after they may go (leader.SWEEP_ALIGN): no job comes to take them along.
    wait_until(lambda: backend.store.children(queue) == [], 60, "empty shards swept")
    state = dashboard.live_state(backend)
    wait_until(lambda: not state._dirty and not state._sharded, 60, "no unread marks")
    passes_done(state)  # a pass that took the last marks is over: its reads are made
    reads.clear()
    for _ in range(25):
        assert poll(admin_client)["totals"]["succeeded"] == 3
    assert reads == []


def test_a_change_reads_only_the_path_that_changed(admin_client, backend, reads):
    tasks.add.submit(1, 1)
    settle(admin_client, lambda d: d["totals"]["pending"] == 1, "first job seen")
    state = dashboard.live_state(backend)
    wait_until(lambda: not state._dirty, 60, "no unread marks")
    passes_done(state)  # a pass that took the last marks is over: its reads are made
    reads.clear()
    # Not cleared after the submit: the live thread may list the queue before this thread
    # gets past submit(). The submitter's own reads (this thread's) are left out instead.
    tasks.add.submit(2, 2)
    settle(admin_client, lambda d: d["totals"]["pending"] == 2, "second job seen")
    layout = backend.store.layout
    listed = {path for name, path, thread in reads
              if name.startswith("get_children") and thread == LIVE_THREAD}
    assert listed == {layout.queue("default")}, reads


def test_reads_happen_on_the_live_thread_never_in_watch_callbacks(admin_client, backend,
                                                                  start_worker, reads):
    start_worker()
    for i in range(5):
        tasks.add.submit(i, 1).wait(timeout=30)
    settle(admin_client, lambda d: d["totals"]["succeeded"] == 5, "counts")
    # MainThread: this test's own submit() and wait(); kazoo's threads: never.
    threads = {thread for _, _, thread in reads}
    assert LIVE_THREAD in threads
    assert threads <= {"MainThread", LIVE_THREAD}, threads


def test_watch_callbacks_only_mark(backend):
    """A callback runs on kazoo's event thread: it must neither read nor block."""
    from kazoo.protocol.states import EventType, WatchedEvent

    state = dashboard.live_state(backend)

    class Refuse:
        connected = True

        def __getattr__(self, name):
            raise AssertionError(f"a watch callback called client.{name}")

    real, state.client = state.client, Refuse()
    try:
        state._stop.set()  # keep the live thread from reading through the refusing client
        state._watcher("q:default")(WatchedEvent(EventType.CHILD, 3, "/x"))
        state._watcher("workers")(WatchedEvent(EventType.NONE, 3, None))
        assert {"q:default", "*"} <= state._dirty
    finally:
        state.client = real


def test_a_burst_of_changes_is_read_a_few_times_not_once_each(admin_client, backend, reads):
    tasks.add.submit(0, 0)
    settle(admin_client, lambda d: d["totals"]["pending"] == 1, "first job seen")
    reads.clear()
    started = time.monotonic()
    for i in range(150):
        tasks.add.submit(i, 1)
    settle(admin_client, lambda d: d["totals"]["pending"] == 151, "the burst seen")
    elapsed = time.monotonic() - started
    queue = backend.store.layout.queue("default")
    lists = [r for r in reads if r[1] == queue and r[2] == LIVE_THREAD]
    # At most one list per MIN_INTERVAL the burst lasted (on a loaded machine the 150
    # fsync'd submits take seconds), plus one per new shard: never one per job.
    bound = elapsed / dashboard.LiveState.MIN_INTERVAL + 6
    assert 1 <= len(lists) <= bound and len(lists) < 50, (len(lists), elapsed)


def test_an_idle_cache_reads_nothing_until_polled_again(admin_client, backend, reads,
                                                        monkeypatch):
    monkeypatch.setattr(dashboard.LiveState, "IDLE_AFTER", 0.3)
    tasks.add.submit(0, 0)
    settle(admin_client, lambda d: d["totals"]["pending"] == 1, "first job seen")
    state = dashboard.live_state(backend)
    wait_until(lambda: state.idle_for > 0.6, 60, "idle")
    reads.clear()
    for i in range(5):
        tasks.add.submit(i, 1)
    # Give an (unwanted) idle read every chance to happen, on signals rather than a
    # sleep: the queue's count is due for its periodic re-read (MIN_INTERVAL since the
    # last one), and the live thread has gone through whole passes since.
    count_key = "q:default"
    assert count_key in {f"q:{q}" for q in state._sharded}
    wait_until(lambda: time.monotonic() - state._last_read.get(count_key, 0.0)
               >= dashboard.LiveState.MIN_INTERVAL, 60, "the count's re-read to be due")
    passes_done(state)
    assert state.idle_for > dashboard.LiveState.IDLE_AFTER  # nobody polled meanwhile
    assert [r for r in reads if r[2] == LIVE_THREAD] == []
    # The first poll after the idle spell waits for the marks to be read: it is current.
    # (Asked of the cache itself, with a deadline a loaded machine cannot miss: the
    # endpoint waits at most 1.5 s for that read.)
    assert state.snapshot(wait=60)["totals"]["pending"] == 6


def test_topics_are_kept_only_for_the_jobs_followed(backend, monkeypatch):
    """Each job page polled added a `job:{id}` topic that stayed for good, copied into
    every live.json answer (a resource-growth audit)."""
    monkeypatch.setattr(dashboard.LiveState, "MAX_WATCHED_JOBS", 3)
    state = dashboard.live_state(backend)
    for n in range(10):
        state.snapshot(job_id=tasks.add.submit(n, 1).id)

    def job_topics():
        return [t for t in state.snapshot()["topics"] if t.startswith("job:")]

    tasks.add.submit(99, 1)  # a change to read: the refresh that prunes
    wait_until(lambda: len(job_topics()) <= 3, 60, "topics of unfollowed jobs to go")
    assert set(job_topics()) <= {f"job:{j}" for j in state.jobs}
    values = list(state.snapshot()["topics"].values())
    assert len(values) == len(set(values))  # one serial: no two topics share a value
