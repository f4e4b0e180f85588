"""A real three-member ensemble in which one follower can be made to trail its leader.

ZooKeeper promises a session its own writes, not other sessions': a follower answers
reads from what it has applied, which may be behind the leader (up to syncLimit ×
tickTime). To make that happen on purpose, and not by luck, every member reaches the
others' quorum ports through a TCP proxy of this module. `trailing(follower)` holds what
the ensemble's leader sends that follower (proposals, commits, pings): the follower stays
up and in the quorum, keeps its clients' sessions and answers their reads from the state
it has, while the leader and the other follower commit without it. Letting go passes
the held bytes on, and the follower catches up.

Hold for well under syncLimit × tickTime (2 s here), or the leader drops the follower.
No mock: the members, the quorum protocol and the clients are all real; the proxies only
forward bytes, or hold them.
"""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from zktasks.testing import ZooKeeperEnsemble, ZooKeeperServer


class Relay:
    """A TCP proxy to a port; `hold` holds what comes back from it, and `rate` (bytes a
    second), when given, slows it down (tests/integration/test_slow_link.py)."""

    def __init__(self, target_port: int, rate: float | None = None):
        self.target = target_port
        self.rate = rate
        self.sent = 0  # bytes passed back
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.hold = threading.Event()
        self._released = threading.Condition()
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="lag-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            try:
                outbound = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                inbound.close()
                continue
            for sock in (inbound, outbound):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [inbound, outbound]
            for source, sink, holdable in ((inbound, outbound, False),
                                           (outbound, inbound, True)):
                threading.Thread(target=self._pump, args=(source, sink, holdable),
                                 name="lag-relay", daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, holdable: bool) -> None:
        try:
            while data := source.recv(65536):
                if holdable:
                    with self._released:
                        self._released.wait_for(
                            lambda: not self.hold.is_set() or self._closed)
                    if self.rate:
                        time.sleep(len(data) / self.rate)
                    self.sent += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        with self._released:
            self.hold.clear()
            self._released.notify_all()

    def close(self) -> None:
        self._closed = True
        self.release()
        with contextlib.suppress(OSError):
            self.listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


class TrailingEnsemble:
    """ZooKeeperEnsemble(3) whose members reach each other's quorum ports by Relays."""

    def __init__(self) -> None:
        self.ensemble = ZooKeeperEnsemble(3)
        self.servers = self.ensemble.servers
        quorum = {s.server_id: s.peers[s.server_id] for s in self.servers}
        self.relays: dict[tuple[int, int], Relay] = {}  # (from, to)
        for server in self.servers:
            for other, (quorum_port, election_port) in quorum.items():
                if other != server.server_id:
                    relay = Relay(quorum_port)
                    self.relays[(server.server_id, other)] = relay
                    server.peers[other] = (relay.port, election_port)

    def start(self) -> "TrailingEnsemble":
        self.ensemble.start()
        return self

    def leader(self) -> ZooKeeperServer:
        return self.ensemble.leader()

    def a_follower(self) -> ZooKeeperServer:
        leader = self.leader()
        return next(s for s in self.servers if s is not leader)

    @contextlib.contextmanager
    def trailing(self, follower: ZooKeeperServer,
                 release_after: float | None = None) -> Iterator[None]:
        """Hold what the leader sends `follower` inside the block (and no longer than
        `release_after` seconds, when given: a call that waits for the follower to catch
        up then returns)."""
        relay = self.relays[(follower.server_id, self.leader().server_id)]
        relay.hold.set()
        timer = None
        if release_after is not None:
            timer = threading.Timer(release_after, relay.release)
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            relay.release()

    def close(self) -> None:
        for relay in self.relays.values():
            relay.close()
        self.ensemble.close()
