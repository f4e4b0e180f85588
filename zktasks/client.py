"""Build and share KazooClients: the only place one is created.

Django builds task backends per thread and rebuilds them whenever TASKS changes, so a
ZooKeeper session must not belong to a backend instance. Instead each process keeps one
started client per connection key (hosts, auth, session timeout), rebuilt after a fork
(kazoo's threads and socket do not survive one), and closes those the settings no longer
name.
"""

import logging
import os
import socket
import ssl
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
    if options.tls:
        kwargs.update(options.tls.client_kwargs())
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
        trouble = tls_trouble(options) if options.tls else ""
        raise ZooKeeperUnavailableError(
            f"Could not connect to ZooKeeper at {options.hosts!r} within "
            f"{options.connect_timeout:g}s; "
            + (trouble or f"start it, or fix TASKS[{options.alias!r}]['OPTIONS']['HOSTS'].")
        ) from exc
    return client


def tls_trouble(options: Options, timeout: float = 2.0) -> str:
    """Shake hands with the hosts and say why TLS fails, or "" if it does not.

    kazoo only logs a failed handshake ("Connection dropped: ...") and tries again until
    the timeout, so a wrong CA or a missing client certificate would read as a server
    that is down. Under TLS 1.3 a server refuses a client certificate with an alert
    after the handshake, hence the one read (a healthy server says nothing before the
    client's ConnectRequest, so that read times out). The first host that speaks TLS
    with us ends the search: TLS is then not what keeps the client out.
    """
    where = f"TASKS[{options.alias!r}]['OPTIONS']['TLS']"
    for host in options.hosts.split(","):
        name, _, port = host.strip().rpartition(":")
        name = name.strip("[]")
        try:
            with socket.create_connection((name, int(port)), timeout=timeout) as raw, \
                    options.tls.context().wrap_socket(raw, server_hostname=name) as tls:
                tls.settimeout(timeout / 2)
                try:
                    if tls.recv(1) == b"":
                        return (f"{host} closed the connection after the TLS handshake: it "
                                "may want a client certificate (set CERTFILE and KEYFILE in "
                                f"{where}).")
                except TimeoutError:
                    return ""
        except ssl.SSLCertVerificationError as exc:
            return _verify_failure(host, name, exc, where)
        except ssl.SSLEOFError as exc:
            # What a plain clientPort does with a ClientHello; a server over its
            # maxClientCnxns, or shutting down, drops it the same way.
            return (f"{host} dropped the connection during the TLS handshake ({exc.reason}): "
                    "is that the servers' secureClientPort? A plain clientPort does this "
                    "(so does a server over maxClientCnxns).")
        except ssl.SSLError as exc:
            reason = exc.reason or str(exc)
            if "CERTIFICATE" in reason.upper() or "UNKNOWN_CA" in reason.upper():
                return (f"TLS with {host} failed: the server refused this client's "
                        f"certificate ({reason}). Set CERTFILE and KEYFILE in {where} to a "
                        "certificate the server's trust store accepts.")
            if "WRONG_VERSION" in reason.upper() or "RECORD_LAYER" in reason.upper():
                return (f"{host} does not speak TLS on that port ({reason}): list the "
                        "servers' secureClientPort in HOSTS, or drop TLS.")
            return f"TLS with {host} failed: {exc}."
        except (OSError, ValueError):
            continue  # not reachable at all: the plain message says it
    return ""


# OpenSSL's X509_V_ERR_* codes that have a more precise advice than "another CA".
_EXPIRED, _NOT_YET_VALID = 10, 9
_NAME_MISMATCH = {62, 64}  # hostname, IP address


def _verify_failure(host: str, name: str, exc: ssl.SSLCertVerificationError,
                    where: str) -> str:
    said = f"TLS with {host} failed: {str(exc.verify_message).rstrip('.')}."
    if exc.verify_code == _EXPIRED:
        return f"{said} The server's certificate has expired: renew it on the server."
    if exc.verify_code == _NOT_YET_VALID:
        return (f"{said} The server's certificate is not valid yet: check the clocks of "
                "this machine and of the one that made it.")
    if exc.verify_code in _NAME_MISMATCH:
        return (f"{said} The server's certificate does not name {name!r}: list the name it "
                f"has in HOSTS, or set CHECK_HOSTNAME False in {where}.")
    return (f"{said} The server's certificate is not signed by a CA that {where}['CA'] "
            "lists (or, without CA, by one this machine trusts).")


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
