"""The first multiRead asks the server whether it knows the opcode (ZooKeeper 3.6+), and
persistent watches wait for that answer. A probe the connection kept from the server
(sent while kazoo reconnects, or to a frozen server) is no answer: it turned multiRead
and persistent watches off for the life of the process. A real server of the test's
own, stopped or frozen (SIGSTOP)."""

import queue
import threading

from django.tasks import task_backends

from tests import tasks
from tests.conftest import use_zookeeper
from tests.waiting import wait_until
from zktasks.handler import inline_watch


def store_on(settings, monkeypatch, own_server, zk_root, session: float):
    """The default backend's store, on the test's server with a `session` s session."""
    use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root,
                  SESSION_TIMEOUT=session, CONNECT_TIMEOUT=60.0)
    store = task_backends["default"].store
    assert tasks.add.submit(1, 1).id  # connected, skeleton made
    assert store._multi_read is None  # nothing asked yet
    return store


def disconnected(store) -> None:
    wait_until(lambda: not store.raw_client.connected, timeout=30,
               message="kazoo to see the connection gone")


def connected(store) -> None:
    wait_until(lambda: store.raw_client.connected, timeout=60,
               message="kazoo to connect again")


def in_thread(call, timeout: float = 60.0):
    """Run `call` on a thread of its own (as a worker's reads run); return its value."""
    out = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert out, f"{call} did not return within {timeout:g}s"
    return out[0]


def watched_parent(store):
    """A parent to watch persistently, and the queue its watch events go to."""
    path = f"{store.layout.assignments}/probe"
    store.raw_client.ensure_path(path)
    events = queue.SimpleQueue()

    @inline_watch
    def on_event(event):
        events.put(event)

    return path, on_event, events


def assert_watched_persistently(store, path, on_event, events) -> None:
    """A persistent watch is set on `path` and reports a child created under it."""
    assert store.watch_persistently(path, on_event) is True
    try:
        store.raw_client.create(f"{path}/job")
        assert events.get(timeout=30).path == f"{path}/job"
    finally:
        store.unwatch_persistently(path, on_event)


def test_a_probe_sent_while_disconnected_is_answered_after_the_reconnection(
        settings, monkeypatch, own_server, zk_root):
    """kazoo queues a request made while it reconnects: the probe waited there past its
    5 s and multiRead was off for good. The reads of that call go one by one; the
    probe's answer, once the server is back, turns multiRead on."""
    store = store_on(settings, monkeypatch, own_server, zk_root, session=30.0)
    ids = [tasks.add.submit(n, 1).id for n in range(3)]
    own_server.stop()
    disconnected(store)
    seen = {}

    def read_statuses():
        fetch = store.read_statuses(ids)  # the probe: queued, unanswered for its wait
        seen["asked"] = store._multi_read
        seen["records"] = [fetch(job_id).record.id for job_id in ids]  # one by one

    reader = threading.Thread(target=read_statuses, daemon=True)
    reader.start()
    wait_until(lambda: "asked" in seen, timeout=60, message="the probe's wait to end")
    assert seen["asked"] is None  # no answer: nothing settled
    own_server.start()
    reader.join(90)
    assert seen.get("records") == ids
    wait_until(lambda: store._multi_read is not None, timeout=60,
               message="the queued probe to be answered")
    assert store._multi_read is True
    assert store._multi_read_works(store.layout.status(ids[0])) is True
    fetch = store.read_statuses(ids)
    assert [fetch(job_id).record.id for job_id in ids] == ids


def test_persistent_watches_wait_for_a_frozen_servers_late_answer(
        settings, monkeypatch, own_server, zk_root):
    """A server frozen longer than the probe's wait (a GC pause, SIGSTOP) but not the
    session: the probe's time-out read as "no multiRead", and the worker listed its
    assignments on every change for its lifetime. One-shot watches that time; the late
    answer turns persistent watches on."""
    store = store_on(settings, monkeypatch, own_server, zk_root, session=30.0)
    path, on_event, events = watched_parent(store)
    own_server.pause()
    try:
        assert in_thread(lambda: store.watch_persistently(path, on_event)) is False
        assert store._multi_read is None
    finally:
        own_server.resume()
    wait_until(lambda: store._multi_read is not None, timeout=60,
               message="the frozen server to answer the probe")
    assert store._multi_read is True
    assert_watched_persistently(store, path, on_event, events)


def test_a_probe_cut_off_with_the_connection_is_asked_again(
        settings, monkeypatch, own_server, zk_root):
    """Frozen longer than kazoo waits for a ping (two thirds of a 6 s session) and the
    probe fails with ConnectionLoss: no answer, asked again once connected."""
    store = store_on(settings, monkeypatch, own_server, zk_root, session=6.0)
    path = store.layout.status(tasks.add.submit(2, 2).id)
    own_server.pause()
    try:
        assert in_thread(lambda: store._multi_read_works(path)) is False
        disconnected(store)
        wait_until(lambda: store._multi_read_probe is None, timeout=30,
                   message="the probe to fail with the connection")
        assert store._multi_read is None
    finally:
        own_server.resume()
    connected(store)
    assert store._multi_read_works(path) is True


def test_an_add_watch_unanswered_while_disconnected_is_tried_again(
        settings, monkeypatch, own_server, zk_root):
    """addWatch to a server that answered multiRead (so knows addWatch), sent while
    kazoo reconnects: its time-out turned persistent watches off for good."""
    store = store_on(settings, monkeypatch, own_server, zk_root, session=6.0)
    path, on_event, events = watched_parent(store)
    assert store._multi_read_works(path) is True
    own_server.stop()
    disconnected(store)
    assert in_thread(lambda: store.watch_persistently(path, on_event)) is False
    own_server.start()
    connected(store)
    assert_watched_persistently(store, path, on_event, events)
