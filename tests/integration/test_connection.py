"""kazoo's connection handler with recv/send before select (zktasks/connection.py),
against a real ZooKeeper: replies and requests far larger than the socket's buffers
arrive whole, and the would-block path waits on select() as kazoo's does."""

import logging
import secrets
import socket
import threading

import pytest
from kazoo.protocol.states import KazooState

from zktasks import client as clients
from zktasks.conf import Options
from zktasks.connection import EagerConnectionHandler
from zktasks.testing import ZooKeeperServer

BIG = 900_000  # under jute.maxbuffer (1 MB), many times a 32 KB socket buffer


@pytest.fixture
def eager_client(zk_hosts, zk_root):
    options = Options.from_params("default", {"OPTIONS": {"HOSTS": zk_hosts,
                                                          "ROOT": zk_root}})
    client = clients.new_client(options)
    clients.start(client, options)
    yield client
    client.stop()
    client.close()


def _count_selects(client, monkeypatch) -> dict:
    """Count the handler's select() calls waiting to read or to write the server socket."""
    counts = {"read": 0, "write": 0}
    handler = client.handler
    select = handler.select

    def counting(rlist, wlist, xlist, timeout=None):
        if rlist == [client._connection._socket]:
            counts["read"] += 1
        if wlist == [client._connection._socket]:
            counts["write"] += 1
        return select(rlist, wlist, xlist, timeout)

    monkeypatch.setattr(handler, "select", counting)
    return counts


def test_the_clients_zktasks_builds_use_it(eager_client):
    assert type(eager_client._connection) is EagerConnectionHandler


def test_small_requests_read_and_write_without_select(eager_client, zk_root, monkeypatch):
    eager_client.ensure_path(zk_root)
    counts = _count_selects(eager_client, monkeypatch)
    for _ in range(50):
        assert eager_client.exists(zk_root) is not None
    # The loop's own select() (kazoo's) still wakes for each reply; the reads and writes
    # themselves did not ask select() first.
    assert counts == {"read": 0, "write": 0}


def test_a_large_znode_goes_both_ways_through_small_socket_buffers(eager_client, zk_root,
                                                                     monkeypatch):
    path = f"{zk_root}/big"
    data = secrets.token_bytes(BIG)
    sock = eager_client._connection._socket
    # Shrink the buffers of the live connection: the request and the reply then take
    # many send()/recv() calls, most of which would block.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    counts = _count_selects(eager_client, monkeypatch)
    eager_client.create(path, data, makepath=True)
    got, stat = eager_client.get(path)
    assert got == data
    assert stat.dataLength == BIG
    # The request hit "would block" and waited on select(), as kazoo's own code does:
    # 900 KB cannot leave through a 64 KB buffer in one go. (The reply's reads usually
    # do too, but not always: a reader slower than ZooKeeper, on a loaded machine,
    # finds data at every recv() and never has to wait.)
    assert counts["write"] > 0


def test_a_connection_class_it_was_not_written_for_is_left_alone(zk_hosts):
    """Someone else's subclass (or a kazoo whose handler differs) keeps its own class."""
    from kazoo.client import KazooClient
    from kazoo.protocol.connection import ConnectionHandler

    from zktasks.connection import install

    class TheirHandler(ConnectionHandler):
        pass

    client = KazooClient(hosts=zk_hosts)
    client._connection.__class__ = TheirHandler
    assert install(client) is False
    assert type(client._connection) is TheirHandler
    plain = KazooClient(hosts=zk_hosts)
    assert install(plain) is True
    assert type(plain._connection) is EagerConnectionHandler


class _Seen(logging.Handler):
    """Set an event when kazoo logs a message containing `text`."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text
        self.event = threading.Event()

    def emit(self, record):
        if self.text in record.getMessage():
            self.event.set()


def test_an_unanswered_connection_attempt_is_given_up_before_the_session():
    """A frozen server's kernel still accepts the TCP connection, but nothing answers.
    kazoo alone waits the whole session timeout for that answer (one host), and the
    session is gone by the time it tries again. The attempt is given up after a third
    of it, so once the server answers again the same session carries on."""
    server = ZooKeeperServer().start()
    options = Options.from_params("default", {"OPTIONS": {
        "HOSTS": server.hosts, "ROOT": "/connection-test", "SESSION_TIMEOUT": 15.0}})
    client = clients.new_client(options)
    seen = _Seen("Connection time-out")
    kazoo_log = logging.getLogger("kazoo.client")
    kazoo_log.addHandler(seen)
    waits = []
    read = client._connection._read

    def recording(length, timeout):  # the connection's reads, their time-outs noted
        waits.append(timeout)
        return read(length, timeout)

    client._connection._read = recording
    try:
        clients.start(client, options)
        del client._connection._read
        # The first read waits for the answer to the connection request: a third of
        # the session timeout, not kazoo's whole session timeout (one host).
        assert waits[0] == pytest.approx(15.0 / 3)
        session_id = client.client_id[0]
        lost, connected = threading.Event(), threading.Event()

        def on_state(state):
            if state == KazooState.LOST:
                lost.set()
            elif state == KazooState.CONNECTED:
                connected.set()

        client.add_listener(on_state)
        server.pause()
        # Drop the connection now rather than wait for a missed ping: the next attempt
        # meets the frozen server.
        client._connection._socket.shutdown(socket.SHUT_RDWR)
        assert seen.event.wait(30)  # that attempt was given up...
        server.resume()
        assert connected.wait(30)  # ...and the next one was answered
        assert client.client_id[0] == session_id
        assert not lost.is_set()
    finally:
        kazoo_log.removeHandler(seen)
        client.stop()
        client.close()
        server.close()


# -- persistent recursive watches (add_persistent_watch) ---------------------------------


def _collect():
    """A watch function that records (type, path) and a way to wait for the n-th."""
    import queue

    seen: queue.SimpleQueue = queue.SimpleQueue()

    def watch(event):
        seen.put((event.type, event.path))

    def take(n):
        return [seen.get(timeout=10) for _ in range(n)]

    return watch, take, seen


def test_a_persistent_watch_names_every_change_under_its_path_in_order(eager_client, zk_root):
    from kazoo.protocol.states import EventType

    from zktasks.connection import add_persistent_watch, remove_persistent_watch

    parent = f"{zk_root}/persist"
    eager_client.ensure_path(parent)
    eager_client.ensure_path(f"{parent}-sibling")  # shares the prefix, not the parent
    watch, take, seen = _collect()
    assert add_persistent_watch(eager_client, parent, watch) is True
    eager_client.create(f"{parent}/a", b"1")
    eager_client.create(f"{parent}/a/deep", b"")
    eager_client.create(f"{parent}-sibling/x", b"")
    eager_client.set(f"{parent}/a", b"2")
    eager_client.delete(f"{parent}/a/deep")
    eager_client.delete(f"{parent}/a")
    assert take(5) == [
        (EventType.CREATED, f"{parent}/a"),
        (EventType.CREATED, f"{parent}/a/deep"),
        (EventType.CHANGED, f"{parent}/a"),
        (EventType.DELETED, f"{parent}/a/deep"),
        (EventType.DELETED, f"{parent}/a"),
    ]
    # Still armed after firing (unlike kazoo's one-shot watches), and a one-shot watch on
    # the same path fires alongside it.
    one_shot, take_one, _ = _collect()
    assert eager_client.get_children(parent, watch=one_shot) == []
    eager_client.create(f"{parent}/b", b"")
    assert take(1) == [(EventType.CREATED, f"{parent}/b")]
    assert take_one(1) == [(EventType.CHILD, parent)]
    # Removed: no more calls. A later change's own watch shows the events have passed.
    remove_persistent_watch(eager_client, parent, watch)
    eager_client.delete(f"{parent}/b")
    eager_client.create(f"{parent}/c", b"")
    marker, take_marker, _ = _collect()
    eager_client.exists(f"{parent}/d", watch=marker)
    eager_client.create(f"{parent}/d", b"")
    take_marker(1)
    assert seen.empty()


def test_a_persistent_watch_under_a_chroot_gets_paths_without_it(zk_hosts, zk_root):
    from kazoo.client import KazooClient
    from kazoo.protocol.states import EventType

    from zktasks.connection import add_persistent_watch, install

    setup = KazooClient(hosts=zk_hosts)
    setup.start(15)
    setup.ensure_path(f"{zk_root}/chrooted/jobs")
    setup.stop()
    setup.close()
    client = KazooClient(hosts=f"{zk_hosts}{zk_root}/chrooted")
    assert install(client)
    client.start(15)
    try:
        watch, take, _ = _collect()
        assert add_persistent_watch(client, "/jobs", watch)
        client.create("/jobs/one", b"")
        assert take(1) == [(EventType.CREATED, "/jobs/one")]
    finally:
        client.stop()
        client.close()


def test_kazoos_own_connection_handler_has_no_persistent_watch(zk_hosts, zk_root):
    from kazoo.client import KazooClient

    from zktasks.connection import add_persistent_watch

    client = KazooClient(hosts=zk_hosts)  # not install()ed
    client.start(15)
    try:
        assert add_persistent_watch(client, zk_root, lambda event: None) is False
    finally:
        client.stop()
        client.close()


def test_removing_the_last_function_asks_the_server_to_forget_the_watch(eager_client,
                                                                         zk_root):
    from kazoo.exceptions import NoWatcherError

    from zktasks.connection import (
        _WATCHER_ANY,
        RemoveWatches,
        add_persistent_watch,
        remove_persistent_watch,
    )

    def remove_again(path):
        reply = eager_client.handler.async_result()
        eager_client._call(RemoveWatches(path, _WATCHER_ANY), reply)
        return reply.get(timeout=10)

    parent = f"{zk_root}/forget"
    eager_client.ensure_path(parent)
    first, second = (lambda event: None), (lambda event: None)
    assert add_persistent_watch(eager_client, parent, first)
    assert add_persistent_watch(eager_client, parent, second)
    remove_persistent_watch(eager_client, parent, first)
    assert remove_again(parent) is True  # still on the server: `second` wanted it
    assert add_persistent_watch(eager_client, parent, first)
    remove_persistent_watch(eager_client, parent, first)
    remove_persistent_watch(eager_client, parent, second)  # the last: the server forgets
    eager_client.sync(parent)  # the removal (not waited for) has been answered
    with pytest.raises(NoWatcherError):
        remove_again(parent)


def test_a_one_shot_child_watch_on_the_same_path_is_told_to_arm_again(eager_client, zk_root):
    """ZooKeeper before 3.9 keeps one watch mode per connection and path (ZOOKEEPER-4466):
    an addWatch after a one-shot child watch on the same path makes that watch recursive,
    and it is never told of a child change. add_persistent_watch hands such watches
    their event at once; armed again by their owner, they hear child changes again."""
    from kazoo.protocol.states import EventType

    from zktasks.connection import add_persistent_watch, remove_persistent_watch

    path = f"{zk_root}/shared"
    eager_client.ensure_path(path)
    first, again = threading.Event(), threading.Event()
    seen = []

    def one_shot(event):
        seen.append(event)
        first.set()

    eager_client.get_children(path, watch=one_shot)
    persistent, take, _ = _collect()
    assert add_persistent_watch(eager_client, path, persistent) is True
    try:
        assert first.wait(10), "the one-shot child watch was not told to arm again"
        assert seen[0].type == EventType.CHILD and seen[0].path == path
        # Armed again after the addWatch (as its owner does): a child change reaches it,
        # and the persistent watch still names the new child.
        eager_client.get_children(path, watch=lambda event: again.set())
        eager_client.create(f"{path}/child")
        assert again.wait(10), "the re-armed child watch missed a child change"
        assert take(1) == [(EventType.CREATED, f"{path}/child")]
    finally:
        remove_persistent_watch(eager_client, path, persistent)


# -- requests sent by the thread that makes them (send_now) ------------------------------


def _count_queued_sends(client, monkeypatch) -> list:
    """The requests kazoo's connection thread takes from its queue and sends."""
    sent = []
    send_request = client._connection._send_request

    def counting(read_timeout, connect_timeout):
        if client._queue:
            sent.append(client._queue[0][0])
        return send_request(read_timeout, connect_timeout)

    monkeypatch.setattr(client._connection, "_send_request", counting)
    return sent


def test_a_request_is_sent_by_the_thread_that_makes_it(eager_client, zk_root, monkeypatch):
    eager_client.ensure_path(zk_root)
    sent = _count_queued_sends(eager_client, monkeypatch)
    for i in range(50):
        eager_client.create(f"{zk_root}/n{i}", str(i).encode())
    assert [eager_client.get(f"{zk_root}/n{i}")[0] for i in range(50)] \
        == [str(i).encode() for i in range(50)]
    assert sent == []  # kazoo's connection thread was never asked to send one


def test_one_threads_requests_keep_their_order_across_a_dropped_connection(
        eager_client, zk_root, monkeypatch):
    """Sequential creates from one thread: 150 sent at once, then the connection dropped
    (kazoo's own test hook, through kazoo's queue), 100 made while it is down (they wait
    in kazoo's queue and go out on the next connection), then 150 more once it is back.
    Each request gets a reply or ConnectionLoss, none is left waiting, and the ones that
    were made got sequence numbers in the order they were asked for: direct sends and
    queued ones never overtake one another."""
    from kazoo.exceptions import ConnectionLoss
    from kazoo.protocol.connection import _CONNECTION_DROP  # kazoo's own test hook

    eager_client.ensure_path(f"{zk_root}/seq")
    sent = _count_queued_sends(eager_client, monkeypatch)
    suspended, issued, connected = threading.Event(), threading.Event(), threading.Event()

    def on_state(state):  # on kazoo's connection thread, which waits here to reconnect
        if state == KazooState.SUSPENDED:
            suspended.set()
            issued.wait(30)
        else:
            connected.set()

    def create(i):
        return eager_client.create_async(f"{zk_root}/seq/n-", str(i).encode(),
                                         sequence=True)

    results = [create(i) for i in range(150)]
    eager_client.add_listener(on_state)
    eager_client._call(_CONNECTION_DROP, eager_client.handler.async_result())
    assert suspended.wait(30)
    results += [create(i) for i in range(150, 250)]
    issued.set()
    assert connected.wait(30)
    eager_client.remove_listener(on_state)
    results += [create(i) for i in range(250, 400)]
    made, lost = [], []
    for i, result in enumerate(results):
        try:
            made.append((i, int(result.get(timeout=30).rsplit("-", 1)[1])))
        except ConnectionLoss:
            lost.append(i)
    assert made == sorted(made, key=lambda pair: pair[1])
    assert all(i < 150 for i in lost)  # only requests of the dropped connection
    assert len(sent) >= 101  # the drop, and the 100 made while down, from the queue
    assert [i for i, _ in made if i >= 150] == list(range(150, 400))
    children = eager_client.get_children(f"{zk_root}/seq")
    assert {int(c.rsplit("-", 1)[1]) for c in children} >= {seq for _, seq in made}


def test_threads_sending_at_once_while_the_connection_drops_get_every_reply(
        eager_client, zk_root):
    """Four threads send creates at once (each with a distinct payload) while the
    connection drops: every request ends (a path or ConnectionLoss) and each path got
    the data of the request it answers, so no reply was matched to another's request."""
    from kazoo.exceptions import ConnectionLoss
    from kazoo.protocol.connection import _CONNECTION_DROP

    eager_client.ensure_path(f"{zk_root}/many")
    outcomes: dict[str, str] = {}
    failures = []
    go = threading.Barrier(5)

    def send(name):
        go.wait()
        results = [(f"{name}-{i}", eager_client.create_async(
            f"{zk_root}/many/{name}-{i}", f"{name}-{i}".encode())) for i in range(250)]
        for payload, result in results:
            try:
                outcomes[payload] = result.get(timeout=30)
            except ConnectionLoss:
                pass
            except Exception as exc:  # noqa: BLE001 - the test reports it
                failures.append(exc)

    threads = [threading.Thread(target=send, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    go.wait()
    eager_client._call(_CONNECTION_DROP, eager_client.handler.async_result())
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert outcomes
    for payload, path in outcomes.items():
        assert path == f"{zk_root}/many/{payload}"
        assert eager_client.get(path)[0] == payload.encode()


def test_a_send_that_cannot_finish_ends_the_connection_and_fails_its_request():
    """A request sent at once into a frozen server: the socket's buffers fill, the send
    times out half written. The connection is ended (the stream is cut mid-message),
    the request fails with ConnectionLoss, and once the server answers again the same
    session carries on."""
    from kazoo.exceptions import ConnectionLoss

    server = ZooKeeperServer().start()
    options = Options.from_params("default", {"OPTIONS": {
        "HOSTS": server.hosts, "ROOT": "/connection-test", "SESSION_TIMEOUT": 15.0}})
    client = clients.new_client(options)
    try:
        clients.start(client, options)
        session_id = client.client_id[0]
        connection = client._connection
        connection._direct.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        connection._direct_timeout = 0.5
        server.pause()
        try:
            result = client.create_async("/big", secrets.token_bytes(BIG))
            # The send gave up inside create_async, in this thread: the connection is
            # ended, and the request fails once the connection thread has seen it.
            with pytest.raises(ConnectionLoss):
                result.get(timeout=30)
        finally:
            server.resume()
        client.ensure_path("/after")
        assert client.exists("/after") is not None
        assert client.client_id[0] == session_id
    finally:
        client.stop()
        client.close()
        server.close()


def test_a_request_sent_at_once_as_the_connection_ends_fails_and_is_not_carried_over(
        eager_client, zk_root):
    """The narrow window: another thread passed the 'connected' check and sends at once
    just after kazoo failed what was pending (kazoo calls its state listeners right
    then, on its connection thread: this test sends from there). That request must
    fail with ConnectionLoss, and must not stay pending into the next connection, where
    the first reply would be matched to it."""
    from kazoo.exceptions import ConnectionLoss
    from kazoo.protocol.connection import _CONNECTION_DROP
    from kazoo.protocol.serialization import Exists

    eager_client.ensure_path(zk_root)
    late = eager_client.handler.async_result()
    reconnected = threading.Event()

    def on_state(state):
        if state == KazooState.SUSPENDED and not late.ready():
            assert eager_client._connection.send_now(Exists(zk_root, None), late)
        elif state == KazooState.CONNECTED:
            reconnected.set()

    eager_client.add_listener(on_state)
    eager_client._call(_CONNECTION_DROP, eager_client.handler.async_result())
    with pytest.raises(ConnectionLoss):
        late.get(timeout=30)
    assert reconnected.wait(30)
    eager_client.remove_listener(on_state)
    for i in range(20):  # each reply is matched to its own request
        eager_client.create(f"{zk_root}/after-{i}", str(i).encode())
        assert eager_client.get(f"{zk_root}/after-{i}")[0] == str(i).encode()


def test_a_connection_that_ends_forgets_its_cached_selectors(own_server, zk_root,
                                                             monkeypatch):
    """When a connection ends, kazoo's connection thread drops the selectors it cached
    for it (see the unit test of forget_selectors for why): a server restart makes the
    client reconnect, and the thread that called it was kazoo's connection thread."""
    options = Options.from_params("default", {"OPTIONS": {"HOSTS": own_server.hosts,
                                                          "ROOT": zk_root,
                                                          "SESSION_TIMEOUT": 30}})
    client = clients.new_client(options)
    forgot = []
    forget = client.handler.forget_selectors

    def recording():
        forgot.append(threading.current_thread())
        forget()

    monkeypatch.setattr(client.handler, "forget_selectors", recording)
    clients.start(client, options)
    states = []
    back = threading.Event()

    def listener(state):
        states.append(state)
        if state == KazooState.CONNECTED and KazooState.SUSPENDED in states:
            back.set()

    client.add_listener(listener)
    try:
        assert client.exists("/") is not None and forgot == []
        own_server.restart()
        assert back.wait(60), states
        assert client.exists("/") is not None
        assert forgot and all(t is client._connection._connection_routine for t in forgot), \
            forgot
    finally:
        client.stop()
        client.close()
