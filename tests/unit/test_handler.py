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


def test_a_socket_at_a_reused_id_and_fd_is_seen_once_the_selectors_are_forgotten():
    """A connection's next socket can get both the old one's id() and its fd. The cached
    selector's epoll dropped the old fd when it closed, so it would never report the new
    one readable; forget_selectors() (called when a connection ends) makes select()
    build a new one."""
    import os

    class Conn:  # one object, seen again at the same id() with a new socket inside
        def __init__(self, sock):
            self.sock = sock

        def fileno(self):
            return self.sock.fileno()

    handler = SelectorCachingHandler()
    a, b = socket.socketpair()
    conn = Conn(a)
    assert handler.select([conn], [], [], 0)[0] == []  # a selector cached for (id, fd)
    fd = a.fileno()
    a.close()  # the connection ends: epoll forgets the fd
    c, d = socket.socketpair()
    if c.fileno() != fd:  # the kernel reuses the lowest number; make sure of it
        os.dup2(c.fileno(), fd)
        c.close()
        c = socket.socket(fileno=fd)
    conn.sock = c  # the next socket, at the old number
    try:
        d.send(b"x")
        assert handler.select([conn], [], [], 0)[0] == []  # blind: the stale selector
        handler.forget_selectors()
        assert handler.select([conn], [], [], 0)[0] == [conn]
    finally:
        for s in (b, conn.sock, d):
            s.close()


def test_a_closed_socket_fails_as_with_kazoo():
    import pytest

    a, b = socket.socketpair()
    a.close()
    with pytest.raises((ValueError, OSError, TypeError)):
        SelectorCachingHandler().select([a], [], [], 0)
    b.close()


# -- the Latch and the AsyncResult built on it ------------------------------------------


def test_latch_opens_once_for_every_waiter():
    import threading

    from zktasks.latch import Latch

    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0) is False
    assert latch.wait(0.01) is False
    passed = []
    arrived = threading.Barrier(9)

    def waiter():
        arrived.wait()
        passed.append(latch.wait())

    threads = [threading.Thread(target=waiter) for _ in range(8)]
    for t in threads:
        t.start()
    arrived.wait()
    latch.set()
    latch.set()  # a second set is harmless
    for t in threads:
        t.join(10)
    assert passed == [True] * 8
    assert latch.is_set() and latch.wait(0) and latch.wait()


def test_latch_survives_racing_sets_and_waits():
    import threading

    from zktasks.latch import Latch

    def race(latch, go, results):
        def setter():
            go.wait()
            latch.set()

        def waiter():
            go.wait()
            results.append(latch.wait(10))

        threads = [threading.Thread(target=f) for f in (setter, setter, waiter, waiter)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)

    for _ in range(200):
        latch, results = Latch(), []
        race(latch, threading.Barrier(4), results)
        assert results == [True, True]
        assert latch.wait(0)  # and it stays open


def test_async_result_behaves_as_kazoos():
    import threading

    import pytest
    from kazoo.handlers.threading import KazooTimeoutError

    handler = SelectorCachingHandler()
    handler.start()
    try:
        result = handler.async_result()
        assert not result.ready()
        with pytest.raises(KazooTimeoutError):
            result.get(block=False)
        with pytest.raises(KazooTimeoutError):
            result.get(timeout=0.01)
        assert result.wait(0.01) is False
        done = threading.Event()
        seen = []
        result.rawlink(lambda r: (seen.append(r.get()), done.set()))
        threading.Thread(target=result.set, args=(42,)).start()
        assert result.get() == 42
        assert done.wait(10)  # the callback ran on kazoo's completion thread
        assert seen == [42] and result.successful() and result.wait(0)

        failed = handler.async_result()
        failed.set_exception(ValueError("boom"))
        with pytest.raises(ValueError, match="boom"):
            failed.get()
        assert failed.ready() and not failed.successful()
        assert isinstance(failed.exception, ValueError)

        unlinked = handler.async_result()
        calls = []
        callback = calls.append
        unlinked.rawlink(callback)
        unlinked.unlink(callback)
        unlinked.set(1)
        handler.completion_queue.put(done.clear)  # a marker behind any callback
        handler.completion_queue.put(done.set)
        assert done.wait(10) and calls == []
    finally:
        handler.stop()
    # A stopped handler runs callbacks at once, as kazoo's does; one that links again
    # from inside its callback does not deadlock.
    inline = handler.async_result()
    calls = []

    def relink(r):
        calls.append(r.value)
        if len(calls) == 1:
            r.rawlink(lambda r2: calls.append("again"))

    inline.rawlink(relink)
    inline.set(7)
    assert calls[0] == 7 and "again" in calls


def test_a_failed_tls_handshake_is_reported_once_a_minute_but_not_a_dropped_one(
        caplog, monkeypatch):
    """A dropped handshake (SSLEOFError) is what a server shutting down does too: a
    rolling restart must not read as a TLS misconfiguration. An SSLError built in Python
    has no `reason`: the report must not raise in its place."""
    import ssl

    from zktasks import handler

    monkeypatch.setattr(handler, "_tls_reported", {})
    with caplog.at_level("ERROR", logger="zktasks.handler"):
        handler.report_tls_failure(("127.0.0.1", 2281), ssl.SSLEOFError(8, "EOF"))
        for _ in range(3):
            handler.report_tls_failure(("127.0.0.1", 2281), ssl.SSLError("no reason here"))
    assert [r.getMessage() for r in caplog.records] == [
        "TLS handshake with 127.0.0.1:2281 failed: no reason here. This client keeps "
        "trying the hosts; check OPTIONS['TLS'] (CA, CERTFILE, KEYFILE) against the "
        "servers' certificates (manage.py zktasks status names the cause)."]
