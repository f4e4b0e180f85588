"""Build and share KazooClients: the only place one is created.

Django builds task backends per thread and rebuilds them whenever TASKS changes, so a
ZooKeeper session must not belong to a backend instance. Instead each process keeps one
started client per connection key (hosts, auth, session timeout), rebuilt after a fork
(kazoo's threads and socket do not survive one), and closes those the settings no longer
name.
"""

import logging
import os
import threading
import time

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from . import connection
from .conf import Options
from .exceptions import ZooKeeperUnavailableError
from .handler import SelectorCachingHandler

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_clients: dict[tuple, KazooClient] = {}
_key_locks: dict[tuple, threading.Lock] = {}
_pid = os.getpid()


def new_client(options: Options) -> KazooClient:
    """Return an unstarted client for `options`, with digest auth and ACL when AUTH is set."""
    kwargs = {}
    if options.auth:
        user, _, password = options.auth.partition(":")
        kwargs["auth_data"] = [("digest", options.auth)]
        kwargs["default_acl"] = [make_digest_acl(user, password, all=True)]
    client = KazooClient(
        hosts=options.hosts,
        timeout=options.session_timeout,
        handler=SelectorCachingHandler(),
        # Reconnect forever; callers bound their own waits. max_delay keeps the
        # reconnection loop responsive once the ensemble is back.
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
        **kwargs,
    )
    connection.install(client)  # recv/send before select (connection.py)
    return client


def start(client: KazooClient, options: Options,
          abort: threading.Event | None = None) -> KazooClient | None:
    """Start `client`, raising a clear error if ZooKeeper does not answer in time.

    With `abort`, return None (the client closed) once it is set: kazoo's start() waits
    out its whole timeout, and a worker asked to stop meanwhile should not.
    """
    try:
        if abort is None:
            client.start(timeout=options.connect_timeout)
        elif not _start_unless(client, options.connect_timeout, abort):
            client.stop()
            client.close()
            return None
    except KazooTimeoutError as exc:
        client.stop()
        client.close()
        raise ZooKeeperUnavailableError(
            f"Could not connect to ZooKeeper at {options.hosts!r} within "
            f"{options.connect_timeout:g}s; start it, or fix "
            f"TASKS[{options.alias!r}]['OPTIONS']['HOSTS']."
        ) from exc
    return client


def _start_unless(client: KazooClient, timeout: float, abort: threading.Event) -> bool:
    """kazoo's start(), waiting in short steps; False if `abort` was set first."""
    connected = client.start_async()
    deadline = time.monotonic() + timeout
    while not connected.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
        if abort.is_set():
            return False
        if time.monotonic() >= deadline:
            break
    if not client.connected:
        raise client.handler.timeout_exception("Connection time-out")
    return True


def get_client(options: Options) -> KazooClient:
    """Return this process's started client for `options`' connection key.

    Connecting can take up to CONNECT_TIMEOUT: it happens under a lock of its own key,
    so one unreachable ensemble does not stall callers of other keys.
    """
    global _pid
    key = options.client_key
    with _lock:
        if os.getpid() != _pid:
            # Inherited from the parent: its threads are gone here. Drop without closing,
            # which would touch the parent's session.
            _clients.clear()
            _key_locks.clear()
            _pid = os.getpid()
        client = _clients.get(key)
        if client is not None:
            return client
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        with _lock:
            client = _clients.get(key)
        if client is None:
            client = start(new_client(options), options)
            with _lock:
                _clients[key] = client
        return client


def close_clients(keep: set[tuple] | None = None) -> None:
    """Close the shared clients whose key is not in `keep` (all of them by default)."""
    with _lock:
        for key in [k for k in _clients if not keep or k not in keep]:
            client = _clients.pop(key)
            try:
                client.stop()
                client.close()
            except Exception:  # closing must not mask the caller's work
                # The hosts only: the key holds AUTH's password too.
                logger.debug("closing ZooKeeper client failed hosts=%s", key[0],
                             exc_info=True)


def _on_setting_changed(*, setting, **kwargs):
    if setting != "TASKS":
        return
    from django.conf import settings

    from .conf import Options as _Options

    keep = set()
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if str(params.get("BACKEND", "")).startswith("zktasks."):
            try:
                keep.add(_Options.from_params(alias, params).client_key)
            except Exception:
                continue
    close_clients(keep)


def connect_signals() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(_on_setting_changed, dispatch_uid="zktasks.client")
