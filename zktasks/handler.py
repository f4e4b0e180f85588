"""kazoo's threading handler, with a select() that keeps its epoll objects and cheaper
thread hand-offs.

kazoo's `selector_select` builds a new selector, registers the sockets, polls once and
closes it, for every call. Its connection thread calls it for each request it writes and
each response it reads: about twenty times per job in a worker, measured at 0.4 ms of
CPU per job (cProfile of a worker draining 3,000 jobs: 58,800 selector constructions).
The sets it selects on are few and stable (the server socket, the wake-up socket), so
this handler keeps one selector per set and thread, and builds a new one only when a
socket object changes (a reconnection). Semantics are kazoo's: same readiness lists,
same errors for a closed socket. (connection.py then removes most of those calls: it
reads and writes before asking select(), 5 → 2 calls per synchronous request.)

Every request also crosses threads twice (the caller hands it to kazoo's connection
thread, which sets the reply on an AsyncResult the caller waits on), and every watch and
completion callback goes through one of kazoo's queues. kazoo builds both on Condition
(queue.Queue, AsyncResult): Python code per put, per wait and per wake-up. Here the
reply waits on a Latch (latch.py) and the callback queues are SimpleQueues, both in C:
profiles of a busy worker put Condition.wait/notify at a fifth of its samples. kazoo
offers these as the handler's `queue_impl` and `async_result()`; the AsyncResult keeps
kazoo's semantics (value or exception set once, callbacks through the completion queue,
or at once when the handler is stopped).

kazoo hands every watch event from its connection thread to its callback thread, which
calls the watch function. Ours only signal the thread that does the work (set an Event,
put on a queue): a watch function marked with `inline_watch` runs on the connection
thread itself, one thread hand-off fewer per event (a job sees two: the leader's on its
pending shard, the worker's on its assignments; a waiter sees a third). Such a function
must not block or call ZooKeeper (rule 5); kazoo's recipes and unmarked watches keep
kazoo's callback thread.

It also opens the client's connections (`create_connection`): within a third of the
session timeout, as connection.py bounds the wait for the server's answer (kazoo gives
the TCP connect and, with TLS, the handshake the whole session timeout, and a frozen
server held a TLS handshake that long, costing the session), and with the SSL context of
conf.tls_context (only the CA given is trusted).
"""

import logging
import queue
import selectors
import socket
import ssl
import threading
import time

from kazoo.handlers import utils
from kazoo.handlers.threading import AsyncResult, KazooTimeoutError, SequentialThreadingHandler

from .conf import tls_context
from .connection import attempt_timeout
from .latch import Latch

logger = logging.getLogger(__name__)

_KEEP = 4  # selectors kept per thread: kazoo uses three sets per connection
TLS_REPORT_EVERY = 60.0  # seconds between two ERROR lines for the same failing handshake
_tls_reported: dict[tuple, float] = {}
_tls_reported_lock = threading.Lock()


def report_tls_failure(address, exc: ssl.SSLError) -> None:
    """Say at ERROR why a TLS handshake failed, once a minute per host and reason.

    kazoo only logs "Connection dropped: ..." at WARNING and tries the next host, so a
    running worker whose reconnections all fail (a server certificate that expired or was
    replaced by one from another CA, a client certificate the servers stopped accepting)
    read like a flaky network until its session expired.
    """
    if isinstance(exc, ssl.SSLEOFError):
        # A server shutting down or over maxClientCnxns drops a handshake the same way
        # as a plain port: a rolling restart would read as a TLS misconfiguration.
        return
    reason = (getattr(exc, "verify_message", None) or getattr(exc, "reason", None)
              or exc.strerror or " ".join(map(str, exc.args)) or type(exc).__name__)
    key = (tuple(address[:2]), reason)
    now = time.monotonic()
    with _tls_reported_lock:
        if now - _tls_reported.get(key, -TLS_REPORT_EVERY) < TLS_REPORT_EVERY:
            return
        if len(_tls_reported) > 64:
            _tls_reported.clear()
        _tls_reported[key] = now
    logger.error("TLS handshake with %s:%s failed: %s. This client keeps trying the hosts; "
                 "check OPTIONS['TLS'] (CA, CERTFILE, KEYFILE) against the servers' "
                 "certificates (manage.py zktasks status names the cause).",
                 address[0], address[1], reason)
_INLINE = "_zktasks_inline"


def inline_watch(func):
    """Mark a watch function to run on kazoo's connection thread (see the module's doc):
    it may only signal another thread, never block or call ZooKeeper."""
    setattr(func, _INLINE, True)
    return func


class _Queue(queue.SimpleQueue):
    """kazoo's worker threads call task_done(); a SimpleQueue has nothing to count."""

    def task_done(self) -> None:
        pass


class LatchAsyncResult(AsyncResult):
    """kazoo's AsyncResult, waiting on a Latch instead of a Condition."""

    def __init__(self, handler):  # no super(): it would build the Condition we avoid
        self._handler = handler
        self._exception = utils._NONE  # kazoo's "not set yet" sentinel, as its base uses
        self._callbacks = []
        self._timeout_factory = KazooTimeoutError
        self.value = None
        # set() against rawlink()/unlink(); re-entrant as kazoo's Condition, for a callback
        # run inline (handler stopped) that links again.
        self._guard = threading.RLock()
        self._done = Latch()

    def set(self, value=None):
        with self._guard:
            self.value = value
            self._exception = None
            self._do_callbacks()
        self._done.set()

    def set_exception(self, exception):
        with self._guard:
            self._exception = exception
            self._do_callbacks()
        self._done.set()

    def get(self, block=True, timeout=None):
        if block and self._exception is utils._NONE:
            self._done.wait(timeout)
        exception = self._exception
        if exception is None:
            return self.value
        if exception is not utils._NONE:
            raise exception
        raise self._timeout_factory()

    def wait(self, timeout=None):
        return self._done.wait(timeout)

    def rawlink(self, callback):
        with self._guard:
            if callback not in self._callbacks:
                self._callbacks.append(callback)
            if self.ready():
                self._do_callbacks()

    def unlink(self, callback):
        with self._guard:
            if not self.ready() and callback in self._callbacks:
                self._callbacks.remove(callback)


class SelectorCachingHandler(SequentialThreadingHandler):
    queue_impl = _Queue

    def __init__(self):
        super().__init__()
        self._local = threading.local()

    def create_connection(self, address, hostname=None, timeout=None, use_ssl=False,
                          **tls):
        """A connected socket to `address` for kazoo's connection loop (see the module's
        docstring); `timeout` is the session timeout kazoo passes."""
        if timeout is not None:
            timeout = attempt_timeout(timeout)
        if not use_ssl:
            return utils.create_tcp_connection(socket, address, hostname, timeout)
        context = tls_context(**tls)  # built again per connection: rotated files are read
        family = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)[0][0]
        conn = context.wrap_socket(socket.socket(family), server_hostname=hostname)
        try:
            conn.settimeout(timeout)
            conn.connect(address)  # TCP, then the handshake, within `timeout`
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as kazoo does
        except BaseException as exc:
            conn.close()
            if isinstance(exc, ssl.SSLError):
                report_tls_failure(address, exc)
            raise
        return conn

    def forget_selectors(self) -> None:
        """Close this thread's cached selectors. Called when a connection ends: a socket
        made next may get both the old one's id() and its fd, and a selector cached for
        the old one (epoll dropped the closed fd) would never report it readable."""
        cache = getattr(self._local, "cache", None)
        if cache:
            for old in cache.values():
                old.close()
            cache.clear()

    def select(self, rlist, wlist, xlist, timeout=None):
        if xlist or (timeout is not None and timeout < 0):
            return super().select(rlist, wlist, xlist, timeout)
        try:
            key = (tuple((id(o), o.fileno()) for o in rlist),
                   tuple((id(o), o.fileno()) for o in wlist))
        except (AttributeError, OSError, ValueError):
            return super().select(rlist, wlist, xlist, timeout)
        if any(fd < 0 for part in key for _, fd in part):
            return super().select(rlist, wlist, xlist, timeout)  # closed: kazoo's error
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = {}
        selector = cache.get(key)
        if selector is None:
            selector = self._build(rlist, wlist)
            if len(cache) >= _KEEP:
                for old in cache.values():
                    old.close()
                cache.clear()
            cache[key] = selector
        try:
            ready = selector.select(timeout)
        except (OSError, ValueError):
            # The socket went away under us: forget the selector, let kazoo see why.
            cache.pop(key, None)
            selector.close()
            return super().select(rlist, wlist, xlist, timeout)
        readable, writable = [], []
        for selector_key, events in ready:
            objs = selector_key.data
            if events & selectors.EVENT_READ:
                readable.extend(o for o, e in objs if e == selectors.EVENT_READ)
            if events & selectors.EVENT_WRITE:
                writable.extend(o for o, e in objs if e == selectors.EVENT_WRITE)
        return readable, writable, []

    def async_result(self):
        return LatchAsyncResult(self)

    def dispatch_callback(self, callback):
        if callback.type == "watch" and getattr(callback.func, _INLINE, False):
            try:
                callback.func(*callback.args)
            except Exception:  # never into kazoo's connection loop
                logger.exception("watch function %r failed", callback.func)
            return
        super().dispatch_callback(callback)

    @staticmethod
    def _build(rlist, wlist) -> selectors.BaseSelector:
        by_fd: dict[int, list] = {}
        for event, objs in ((selectors.EVENT_READ, rlist), (selectors.EVENT_WRITE, wlist)):
            for obj in objs:
                by_fd.setdefault(obj.fileno(), []).append((obj, event))
        selector = selectors.DefaultSelector()
        for fd, objs in by_fd.items():
            mask = 0
            for _, event in objs:
                mask |= event
            selector.register(fd, mask, objs)
        return selector
