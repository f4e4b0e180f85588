"""Parse and validate a ZooKeeperBackend's OPTIONS; nothing here is read at import time."""

import math
import re
from dataclasses import dataclass, field

from django.conf import settings

from .exceptions import ConfigurationError

# jute.maxbuffer defaults to 0xfffff bytes; a request over it is answered by closing the
# connection, which kazoo retries forever. Leave room for the rest of a multi's request.
DEFAULT_MAX_RECORD_BYTES = 1_000_000

_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    alias: str
    hosts: str
    root: str
    session_timeout: float
    connect_timeout: float
    result_ttl: int
    # Secrets stay out of repr(): error pages and error trackers print the locals.
    auth: str | None = field(repr=False)
    signing_key: str = field(repr=False)
    max_record_bytes: int
    signing_key_fallbacks: tuple[str, ...] = field(default=(), repr=False)
    dead_letter_ttl: float | None = 30 * 86400
    dead_letter_limit: int = 1000
    schedules: tuple = ()

    @property
    def client_key(self) -> tuple:
        """Identify the ZooKeeper session these options need (shared by equal backends)."""
        return (self.hosts, self.auth, self.session_timeout)

    @property
    def verify_keys(self) -> tuple[str, ...]:
        """The keys a signature is checked against: SIGNING_KEY, then its fallbacks."""
        return (self.signing_key, *self.signing_key_fallbacks)

    @classmethod
    def from_params(cls, alias: str, params: dict) -> "Options":
        """Build options from a TASKS entry, raising ConfigurationError on bad values."""
        raw = dict(params.get("OPTIONS") or {})
        where = f"TASKS[{alias!r}]['OPTIONS']"
        known = {
            "HOSTS", "ROOT", "SESSION_TIMEOUT", "CONNECT_TIMEOUT", "RESULT_TTL", "AUTH",
            "SIGNING_KEY", "SIGNING_KEY_FALLBACKS", "MAX_RECORD_BYTES", "SCHEDULES",
            "DEAD_LETTER_TTL", "DEAD_LETTER_LIMIT",
        }
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown keys {unknown!r}; the known ones are {sorted(known)!r}."
            )
        hosts = raw.get("HOSTS", "127.0.0.1:2181")
        if not isinstance(hosts, str) or not hosts.strip():
            raise ConfigurationError(
                f"{where}['HOSTS'] is {hosts!r}; give 'host:port[,host:port...]'."
            )
        hosts, _, chroot = hosts.strip().partition("/")
        for host in hosts.split(","):
            if not _HOST_RE.match(host.strip()):
                raise ConfigurationError(
                    f"{where}['HOSTS'] has {host!r}, which is not 'host:port'."
                )
        if chroot:
            raise ConfigurationError(
                f"{where}['HOSTS'] has a chroot '/{chroot}'; put the path in ROOT instead."
            )
        root = raw.get("ROOT", "/zktasks")
        if (
            not isinstance(root, str)
            or not root.startswith("/")
            or root == "/"
            or root.endswith("/")
            or "//" in root
        ):
            raise ConfigurationError(
                f"{where}['ROOT'] is {root!r}; give an absolute znode path such as '/zktasks'."
            )
        session_timeout = _positive(raw.get("SESSION_TIMEOUT", 10.0), where, "SESSION_TIMEOUT")
        connect_timeout = _positive(
            raw.get("CONNECT_TIMEOUT", session_timeout), where, "CONNECT_TIMEOUT"
        )
        result_ttl = _positive(raw.get("RESULT_TTL", 86400), where, "RESULT_TTL")
        auth = raw.get("AUTH")
        if auth is not None and (not isinstance(auth, str) or ":" not in auth):
            raise ConfigurationError(f"{where}['AUTH'] must be 'user:password' or None.")
        signing_key = raw.get("SIGNING_KEY") or settings.SECRET_KEY
        if not signing_key:
            raise ConfigurationError(
                f"{where}['SIGNING_KEY'] is empty and so is SECRET_KEY; payloads must be signed."
            )
        fallbacks = _fallbacks(raw, where)
        max_record = _whole(raw.get("MAX_RECORD_BYTES", DEFAULT_MAX_RECORD_BYTES))
        if max_record is None or not 10_000 <= max_record <= 0xFFFFF:
            raise ConfigurationError(
                f"{where}['MAX_RECORD_BYTES'] is "
                f"{raw.get('MAX_RECORD_BYTES', DEFAULT_MAX_RECORD_BYTES)!r}; give a whole "
                f"number of bytes between 10000 and {0xFFFFF} (ZooKeeper's default "
                "jute.maxbuffer)."
            )
        dead_letter_ttl = raw.get("DEAD_LETTER_TTL", 30 * 86400)
        if dead_letter_ttl is not None:
            dead_letter_ttl = float(_positive(dead_letter_ttl, where, "DEAD_LETTER_TTL"))
        dead_letter_limit = raw.get("DEAD_LETTER_LIMIT", 1000)
        if isinstance(dead_letter_limit, bool) or not isinstance(dead_letter_limit, int) \
                or dead_letter_limit < 1:
            raise ConfigurationError(
                f"{where}['DEAD_LETTER_LIMIT'] is {dead_letter_limit!r}; give a whole number "
                "of entries, at least 1 (each holds at most 64 KB of ZooKeeper's heap)."
            )
        from .schedules import parse_schedules

        return cls(
            alias=alias,
            schedules=parse_schedules(alias, raw.get("SCHEDULES")),
            hosts=hosts,
            root=root,
            session_timeout=float(session_timeout),
            connect_timeout=float(connect_timeout),
            # Whole seconds, rounded up like a task's own result_ttl (tree.ttl_seconds):
            # a result is never dropped before its TTL, and 0.5 does not become 0.
            result_ttl=math.ceil(result_ttl),
            auth=auth,
            signing_key=str(signing_key),
            signing_key_fallbacks=fallbacks,
            max_record_bytes=max_record,
            dead_letter_ttl=dead_letter_ttl,
            dead_letter_limit=dead_letter_limit,
        )


def _fallbacks(raw: dict, where: str) -> tuple[str, ...]:
    """SIGNING_KEY_FALLBACKS, or Django's SECRET_KEY_FALLBACKS while SIGNING_KEY is
    SECRET_KEY: rotating SECRET_KEY the way Django documents then keeps the jobs and
    results signed with the old key readable."""
    if "SIGNING_KEY_FALLBACKS" in raw:
        value, name = raw["SIGNING_KEY_FALLBACKS"], f"{where}['SIGNING_KEY_FALLBACKS']"
    elif raw.get("SIGNING_KEY"):
        return ()
    else:
        value, name = getattr(settings, "SECRET_KEY_FALLBACKS", ()), "SECRET_KEY_FALLBACKS"
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(
            isinstance(key, str) and key for key in value):
        raise ConfigurationError(
            f"{name} is {value!r}; give a list of the previous keys (non-empty strings), "
            "newest first, or [].")
    return tuple(value)


def _positive(value, where, key):
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"{where}[{key!r}] is {value!r}; give a finite positive number of seconds.")
    return value


def _whole(value) -> int | None:
    """An int, or the digits of one in a string (settings read from the environment);
    None for anything else (a float, a bool, None, other text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdecimal():
        return int(value.strip())
    return None
