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

kazoo offers no hook for its connection class, so `install()` swaps the class of the
handler a KazooClient made (the subclass adds no state, only methods). A TLS
socket keeps kazoo's methods: SSL framing makes "would block" mean other things.
"""

from kazoo.exceptions import ConnectionDropped
from kazoo.protocol.connection import ConnectionHandler

CONNECT_ATTEMPT_MIN = 1.0  # seconds: the floor of one attempt's wait for an answer


class EagerConnectionHandler(ConnectionHandler):
    """ConnectionHandler whose _read/_write try the socket before select(), and whose
    connection attempts give up after a third of the session timeout."""

    def _invoke(self, timeout, request, xid=None):
        # kazoo calls this only to connect (and to authenticate right after).
        session = self.client._session_timeout / 1000.0
        return super()._invoke(min(timeout, max(CONNECT_ATTEMPT_MIN, session / 3)),
                               request, xid)

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


def install(client) -> bool:
    """Make `client` (an unstarted KazooClient) use EagerConnectionHandler; False (kazoo's
    own handler kept) if this kazoo's connection handler is not the one it was written
    for."""
    handler = getattr(client, "_connection", None)
    if type(handler) is not ConnectionHandler or not all(
            hasattr(handler, name) for name in ("_socket", "_socket_error_handling")):
        return False
    handler.__class__ = EagerConnectionHandler
    return True
