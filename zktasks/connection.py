"""kazoo's connection handler, reading and writing before asking select().

kazoo's ConnectionHandler keeps its socket non-blocking, and calls select() before every
recv() and every send() on it: three selects per reply (the loop's own, then one before
the 4-byte length and one before the body, which came in the same segment) and one per
request. In a py-spy profile of a worker streaming no-op jobs (`bench/run.py --profile`,
the defaults row), select() and our handler's bookkeeping around it (handler.py) were
about 15 % of the worker's CPU. Here recv() and send() are tried first; only when the
socket would block (BlockingIOError) is select() called, with kazoo's timeout and
kazoo's time-out error. Everything else, including the loop's own select(), is kazoo's.

It also bounds one connection attempt's wait for ZooKeeper's answer to a third of the
session timeout (at least CONNECT_ATTEMPT_MIN seconds). kazoo waits `session timeout /
number of hosts` for it: with one host, the whole session. A server that accepted the
connection but does not answer (a frozen process, a restart caught half way: CI saw
both clients of a test lose their session this way after a ZooKeeper restart) then
costs the session, even when the next attempt would be answered at once. Given up
sooner, the attempt is retried while the session is still alive. The Java client has
the same `sessionTimeout / hosts`; Curator bounds the connection separately, too.

It also carries ZooKeeper 3.6's persistent recursive watches (`add_persistent_watch`),
which kazoo lacks (python-zk/kazoo#715 is still open): one watch on a parent that stays
armed and names every descendant created, changed or deleted. A worker uses it on its
assignments (worker.py), where a one-shot child watch cost a get_children per change:
two per job, one for the leader's assignment and one for the worker's own finish.

It also lets the thread that makes a request send it (`send_now`). kazoo's own `_call`
queues the request and writes a byte to a socket pair to wake the connection thread,
which then reads the byte and sends the request: two thread switches and three system
calls more per request than sending it at once. A sync create() costs its process
about a quarter less CPU sent at once (`bench/sync_requests.py`; figures in
bench/README, "Requests sent by the thread that makes them"). What kazoo
relies on is kept: requests go out in xid order with their `_pending` entry appended
first, under one lock that the connection thread's own sends take too; only on a
connection whose handshake and authentication are done (`_direct`), and only when
nothing waits in kazoo's queue, so one thread's requests keep their order. When a
connection ends, whatever was sent at once and is still pending fails with
ConnectionLoss, as kazoo fails its own pending requests.

kazoo offers no hook for its connection class, so `install()` swaps the class of the
handler a KazooClient made (and gives it its lock), and puts `send_now` in front of the
client's `_call`. A TLS socket keeps kazoo's methods: SSL framing makes "would block"
mean other things, and an SSL socket must not be written from two threads.
"""

import os
import socket
import threading
import weakref
from collections import namedtuple

from kazoo.exceptions import ConnectionDropped, ConnectionLoss
from kazoo.protocol.connection import (
    CHANGED_EVENT,
    CREATED_EVENT,
    DELETED_EVENT,
    ConnectionHandler,
)
from kazoo.protocol.serialization import Auth, Watch, int_struct, write_string
from kazoo.protocol.states import (
    EVENT_TYPE_MAP,
    Callback,
    EventType,
    KeeperState,
    WatchedEvent,
)

CONNECT_ATTEMPT_MIN = 1.0  # seconds: the floor of one attempt's wait for an answer


def attempt_timeout(session_timeout: float) -> float:
    """Seconds one connection attempt may take (a third of the session timeout, at least
    CONNECT_ATTEMPT_MIN): the connect and TLS handshake (handler.py), then the wait for
    the server's answer (EagerConnectionHandler._invoke), each."""
    return max(CONNECT_ATTEMPT_MIN, session_timeout / 3)

_PERSISTENT = "_zktasks_persistent"  # client attribute: {server path: (watch functions)}
PERSISTENT_RECURSIVE = 1             # ZooKeeper's AddWatchMode.PERSISTENT_RECURSIVE
# The WatcherType that removes it: Any (3.8 knows no other for persistent watches; it
# also removes a one-shot watch of this connection on the same path).
_WATCHER_ANY = 3
# What a recursive watch is told (ZooKeeper's own client delivers it these alone):
_RECURSIVE_EVENTS = (CREATED_EVENT, DELETED_EVENT, CHANGED_EVENT)


class _PathAndInt(namedtuple("_PathAndInt", "path value")):
    """A request of a path and an int whose reply has no body."""

    type = None

    def serialize(self):
        b = bytearray(write_string(self.path))
        b.extend(int_struct.pack(self.value))
        return b

    @classmethod
    def deserialize(cls, buffer, offset):
        return True


class AddWatch(_PathAndInt):
    """ZooKeeper's addWatch (opcode 106, since 3.6); the int is the AddWatchMode."""

    type = 106


class RemoveWatches(_PathAndInt):
    """ZooKeeper's removeWatches (opcode 18); the int is the WatcherType."""

    type = 18


class EagerConnectionHandler(ConnectionHandler):
    """ConnectionHandler whose _read/_write try the socket before select(), and whose
    connection attempts give up after a third of the session timeout."""

    def _invoke(self, timeout, request, xid=None):
        # kazoo calls this only to connect (and to authenticate right after).
        session = self.client._session_timeout / 1000.0
        return super()._invoke(min(timeout, attempt_timeout(session)), request, xid)

    # Set by install(): _send_lock (every write to the socket, and the xid and _pending
    # that go with it) and _direct (the socket requests may be sent on at once, or None).

    def _connect(self, host, hostip, port):
        timeouts = super()._connect(host, hostip, port)
        sock = self._socket
        if not hasattr(sock, "pending"):  # not TLS
            with self._send_lock:
                self._direct, self._direct_timeout = sock, timeouts[1] / 1000.0
        return timeouts

    def _connect_attempt(self, host, hostip, port, retry):
        try:
            return super()._connect_attempt(host, hostip, port, retry)
        finally:
            forget = getattr(self.client.handler, "forget_selectors", None)
            if forget is not None:
                forget()  # on kazoo's connection thread, whose cache it is
            # The connection is over (kazoo has failed what it knew to be pending): no
            # more sends at once, and what was sent at once since then fails too, or
            # its replies would be looked for on the next connection.
            with self._send_lock:
                self._direct = None
                stranded = list(self.client._pending)
                self.client._pending.clear()
            for _request, async_object, _xid in stranded:
                if async_object is not None:
                    async_object.set_exception(ConnectionLoss())

    def _send_request(self, read_timeout, connect_timeout):
        with self._send_lock:
            return super()._send_request(read_timeout, connect_timeout)

    def _send_ping(self, connect_timeout):
        with self._send_lock:
            return super()._send_ping(connect_timeout)

    def send_now(self, request, async_object) -> bool:
        """Send `request` from this thread, as kazoo's connection thread would; False
        (nothing done) when it must go through kazoo's queue instead."""
        client = self.client
        if self._direct is None:  # also in a forked child: see _forget_sockets_in_child
            return False
        # Outside the lock, and before anything is recorded: a request that cannot be
        # serialized raises here, to its caller (in kazoo's thread it would end the loop).
        body = request.serialize()
        with self._send_lock:
            sock = self._direct
            if sock is None or client._queue:
                return False
            self._xid = xid = (self._xid % 2147483647) + 1
            # Before the send: the reply may be read before this thread runs again.
            client._pending.append((request, async_object, xid))
            header = int_struct.pack(len(body) + 8) + int_struct.pack(xid) \
                + int_struct.pack(request.type)
            try:
                self._send_all(sock, header + body, self._direct_timeout)
            except Exception:  # noqa: BLE001 - any failure ends the connection
                # The message may be cut short: end the connection, as kazoo does when
                # its own write fails. The connection thread sees it, reconnects, and
                # fails what is pending (this request too) with ConnectionLoss.
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return True

    def _read_watch_event(self, buffer, offset):
        # kazoo's one-shot watchers first, as kazoo does it; then the persistent ones
        # whose parent the event's path is under (the event is parsed twice: a few bytes).
        super()._read_watch_event(buffer, offset)
        registry = getattr(self.client, _PERSISTENT, None)
        if not registry:
            return
        client = self.client
        watch, _ = Watch.deserialize(buffer, offset)
        if watch.type not in _RECURSIVE_EVENTS:
            # A child event is for a one-shot child watch on the same node: the server
            # sends one notification per connection, whichever watches it stands for.
            return
        path, funcs = watch.path, []
        for root, watchers in registry.items():
            if path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
                funcs.extend(watchers)
        if not funcs or client._stopped.is_set():
            return
        event = WatchedEvent(EVENT_TYPE_MAP[watch.type], client._state,
                             client.unchroot(path))
        for func in funcs:
            client.handler.dispatch_callback(Callback("watch", func, (event,)))

    def _read(self, length, timeout):
        sock = self._socket
        if hasattr(sock, "pending"):  # TLS
            return super()._read(length, timeout)
        parts = []
        remaining = length
        with self._socket_error_handling():
            while remaining > 0:
                try:
                    chunk = sock.recv(remaining)
                except BlockingIOError:
                    if not self.handler.select([sock], [], [], timeout)[0]:
                        raise self.handler.timeout_exception(
                            "socket time-out during read") from None
                    continue
                if not chunk:
                    raise ConnectionDropped("socket connection broken")
                parts.append(chunk)
                remaining -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _write(self, msg, timeout):
        sock = self._socket
        if hasattr(sock, "pending"):  # TLS
            return super()._write(msg, timeout)
        return self._send_all(sock, msg, timeout)

    def _send_all(self, sock, msg, timeout):
        view = memoryview(msg)
        sent = 0
        with self._socket_error_handling():
            while sent < len(view):
                try:
                    count = sock.send(view[sent:])
                except BlockingIOError:
                    if not self.handler.select([], [sock], [], timeout)[1]:
                        raise self.handler.timeout_exception(
                            "socket time-out during write") from None
                    continue
                if not count:
                    raise ConnectionDropped("socket connection broken")
                sent += count
        return None


def add_persistent_watch(client, path: str, func, timeout: float | None = None) -> bool:
    """Arm a persistent recursive watch on `path`: `func(WatchedEvent)` for every node
    created, changed or deleted under it (and for `path` itself), until removed or the
    connection drops. False if this client cannot (kazoo's own connection handler,
    install()); a server older than 3.6 raises kazoo's UnimplementedError or, if it
    drops the request, leaves it unanswered for `timeout`.

    The server forgets the watch with the connection, and kazoo does not arm it again
    (nor its one-shot watches: it sends no SetWatches): after a reconnection the caller
    adds it again, then reads what it missed. Adding it again is harmless.
    """
    if not isinstance(client._connection, EagerConnectionHandler):
        return False
    full = _server_path(client, path)
    # Before the request: an event may come before its reply.
    added = _register(client, full, func, add=True)
    try:
        reply = client.handler.async_result()
        client._call(AddWatch(full, PERSISTENT_RECURSIVE), reply)
        reply.get(timeout=timeout)
    except BaseException:
        if added:
            _register(client, full, func, add=False)
        raise
    # ZooKeeper before 3.9 keeps one watch mode per connection and path (ZOOKEEPER-4466):
    # this addWatch turned any one-shot child watch this connection had on `path` (the
    # leader's, when a worker and the leader share a client) into a recursive one, which
    # is never told of child changes. Seen after reconnections, where the two re-arm in
    # either order: the leader missed a worker's finishes and assigned it nothing until
    # its 30 s full read. Those watches get their event now, as if the children had
    # changed (events are hints): their owners list again and arm them back.
    event = WatchedEvent(EventType.CHILD, client._state, path)
    for watcher in client._child_watchers.pop(full, ()):
        client.handler.dispatch_callback(Callback("watch", watcher, (event,)))
    return True


def remove_persistent_watch(client, path: str, func) -> None:
    """Stop calling `func` for events under `path`. When it was the last function there,
    the server is asked to forget the watch too (not waited for: it goes with the
    connection anyway), so that it stops sending what nobody reads. ZooKeeper 3.8 can
    only be asked to forget every watch of this connection on `path`: a one-shot watch
    on `path` itself goes too (the worker removes its watch only from the assignments
    of an identity it has left, which the leader no longer watches once it re-reads)."""
    full = _server_path(client, path)
    if not _register(client, full, func, add=False):
        return
    if full in getattr(client, _PERSISTENT, {}):
        return  # other functions still want it
    try:
        client._call(RemoveWatches(full, _WATCHER_ANY),
                     client.handler.async_result())
    except Exception:  # closed, or never connected: the server has nothing to forget
        pass


_registry_lock = threading.Lock()


def _register(client, full: str, func, *, add: bool) -> bool:
    """Add or drop `func` for `full`; True if that changed anything.

    Copy on write: kazoo's connection thread reads the registry without a lock
    (_read_watch_event), so it is replaced whole, never changed in place.
    """
    with _registry_lock:
        registry = getattr(client, _PERSISTENT, None) or {}
        funcs = registry.get(full, ())
        if (func in funcs) == add:
            return False
        funcs = (*funcs, func) if add else tuple(f for f in funcs if f != func)
        registry = {k: v for k, v in registry.items() if k != full}
        if funcs:
            registry[full] = funcs
        setattr(client, _PERSISTENT, registry)
        return True


def _server_path(client, path: str) -> str:
    return client.chroot + path if client.chroot else path


# Every installed handler, so that a forked child can stop sending from them. A client
# made before a fork (gunicorn --preload, a multiprocessing "fork" child) holds its
# parent's socket: a request written to it from the child is answered to the parent,
# whose reader takes a reply it never asked for (its connection loop dies on the xid).
# In the child, requests go through kazoo's queue instead, which its never-started
# connection thread does not serve: a client must be made after the fork, as
# get_client() does. A hook at fork time, not a pid check per request.
_INSTALLED: "weakref.WeakSet[EagerConnectionHandler]" = weakref.WeakSet()


def _forget_sockets_in_child() -> None:
    for handler in list(_INSTALLED):
        handler._direct = None


os.register_at_fork(after_in_child=_forget_sockets_in_child)


def install(client) -> bool:
    """Make `client` (an unstarted KazooClient) use EagerConnectionHandler; False (kazoo's
    own handler kept) if this kazoo's connection handler is not the one it was written
    for."""
    handler = getattr(client, "_connection", None)
    if type(handler) is not ConnectionHandler or not all(
            hasattr(handler, name) for name in ("_socket", "_socket_error_handling")):
        return False
    handler.__class__ = EagerConnectionHandler
    handler._send_lock, handler._direct, handler._direct_timeout = threading.Lock(), None, 10.0
    _INSTALLED.add(handler)
    kazoo_call = client._call

    def _call(request, async_object):
        # kazoo's own checks (closed, expired, auth failed) and queue unless connected.
        if (client._state == KeeperState.CONNECTED
                and getattr(request, "type", None) not in (None, Auth.type)
                and handler.send_now(request, async_object)):
            return None
        return kazoo_call(request, async_object)

    client._call = _call
    return True
