"""The selector-caching kazoo handler reports readiness exactly as kazoo's own does."""

import socket

from kazoo.handlers.threading import SequentialThreadingHandler

from zktasks.handler import SelectorCachingHandler


def test_select_matches_kazoos_and_follows_a_new_socket():
    ours, theirs = SelectorCachingHandler(), SequentialThreadingHandler()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        for handler in (ours, theirs):
            assert handler.select([a, c], [], [], 0) == ([], [], [])
            assert handler.select([], [a], [], 0)[1] == [a]
        b.send(b"x")
        for _ in range(3):  # the cached selector keeps answering right
            assert ours.select([a, c], [], [], 0)[0] == theirs.select([a, c], [], [], 0)[0] == [a]
        a.recv(1)
        assert ours.select([a, c], [], [], 0)[0] == []
        # A new socket object (a reconnection) gets its own selector.
        e, f = socket.socketpair()
        f.send(b"y")
        assert ours.select([e, c], [], [], 0)[0] == [e]
        e.close(), f.close()
    finally:
        for s in (a, b, c, d):
            s.close()


def test_a_closed_socket_fails_as_with_kazoo():
    import pytest

    a, b = socket.socketpair()
    a.close()
    with pytest.raises((ValueError, OSError, TypeError)):
        SelectorCachingHandler().select([a], [], [], 0)
    b.close()
