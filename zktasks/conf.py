"""Parse and validate a ZooKeeperBackend's OPTIONS; nothing here is read at import time."""

import hashlib
import hmac
import math
import os
import re
import secrets
import ssl
from dataclasses import dataclass, field

from django.conf import settings
from django.tasks.base import DEFAULT_TASK_QUEUE_NAME

from .exceptions import ConfigurationError
from .tree import is_znode_name

# jute.maxbuffer defaults to 0xfffff bytes; a request over it is answered by closing the
# connection, which kazoo retries forever. Leave room for the rest of a multi's request.
DEFAULT_MAX_RECORD_BYTES = 1_000_000
JUTE_MAXBUFFER = 0xFFFFF
# The largest MAX_RECORD_BYTES: a record's multi also carries its path, the index entry,
# the assignment it deletes and a running record's few more fields (a few hundred bytes).
MAX_RECORD_LIMIT = JUTE_MAXBUFFER - 8 * 1024

# Keys the digest of AUTH in Options.client_key: per process, like the client registry.
_KEY_SALT = secrets.token_bytes(32)

_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}\Z")


# The keys of a zktasks TASKS entry's OPTIONS.
OPTION_KEYS = frozenset({
    "HOSTS", "ROOT", "SESSION_TIMEOUT", "CONNECT_TIMEOUT", "RESULT_TTL", "AUTH",
    "SIGNING_KEY", "SIGNING_KEY_FALLBACKS", "MAX_RECORD_BYTES", "SCHEDULES",
    "DEAD_LETTER_TTL", "DEAD_LETTER_LIMIT", "TLS", "RATE_LIMITS",
})
# The keys of a TASKS entry itself that Django's tasks framework reads.
ENTRY_KEYS = frozenset({"BACKEND", "QUEUES", "OPTIONS"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsOptions:
    """OPTIONS['TLS']: how the client speaks TLS to ZooKeeper's secureClientPort."""

    ca: str | None = None             # PEM file of the only CAs trusted; None: the system's
    certfile: str | None = None       # this client's certificate (mutual TLS)
    keyfile: str | None = None        # its private key; None: in certfile
    keyfile_password: str | None = field(default=None, repr=False)
    verify: bool = True               # check the server's certificate
    check_hostname: bool = True       # ... and that it names the host in HOSTS

    def client_kwargs(self) -> dict:
        """KazooClient's TLS arguments (handler.SelectorCachingHandler.create_connection
        turns them into tls_context(), not kazoo)."""
        return {"use_ssl": True, "ca": self.ca, "certfile": self.certfile,
                # kazoo hands a certificate on only with a key file: one PEM holding
                # both is given as both.
                "keyfile": self.keyfile or self.certfile,
                "keyfile_password": self.keyfile_password,
                "verify_certs": self.verify, "check_hostname": self.check_hostname}

    def context(self) -> ssl.SSLContext:
        return tls_context(**self.client_kwargs())


def tls_context(*, ca=None, certfile=None, keyfile=None, keyfile_password=None,
                verify_certs=True, check_hostname=False, options=None, ciphers=None,
                use_ssl=True) -> ssl.SSLContext:
    """The client's SSL context, from kazoo's TLS arguments, as kazoo builds it
    (kazoo.handlers.utils.create_tcp_connection) but for two things:

    * with a CA given, only that CA is trusted. kazoo loads the system's CAs as well
      whatever `ca` says, so any CA of the machine (a public one, a TLS-inspecting
      proxy's) could vouch for a man in the middle;
    * a key without its password fails at once: OpenSSL's default, with password None,
      is to prompt on the terminal, which hung a worker's start.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if options is not None:
        context.options = options
    if ciphers:
        context.set_ciphers(ciphers)
    if ca:
        context.load_verify_locations(ca)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED if verify_certs else ssl.CERT_NONE
    if certfile:
        context.load_cert_chain(certfile, keyfile,
                                "" if keyfile_password is None else keyfile_password)
    return context


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
    # queue -> ratelimit.RateLimit; left out of the hash (a dict cannot be hashed)
    rate_limits: dict = field(default_factory=dict, hash=False)
    tls: TlsOptions | None = None

    @property
    def client_key(self) -> tuple:
        """Identify the ZooKeeper session these options need (shared by equal backends).

        AUTH is in it as a keyed digest, not in clear: the key is a local of the frames
        that connect, and Django's error pages and error trackers show frame locals
        (an unreachable ZooKeeper raises through them from a view).
        """
        auth = None if self.auth is None else hmac.new(
            _KEY_SALT, self.auth.encode(), hashlib.sha256).hexdigest()
        return (self.hosts, auth, self.session_timeout, self.tls)

    @property
    def verify_keys(self) -> tuple[str, ...]:
        """The keys a signature is checked against: SIGNING_KEY, then its fallbacks."""
        return (self.signing_key, *self.signing_key_fallbacks)

    @classmethod
    def from_params(cls, alias: str, params: dict) -> "Options":
        """Build options from a TASKS entry, raising ConfigurationError on bad values."""
        where = f"TASKS[{alias!r}]['OPTIONS']"
        raw = params.get("OPTIONS") or {}
        if not isinstance(raw, dict):
            raise ConfigurationError(
                f"{where} is of type {type(raw).__name__}; give a dict, e.g. "
                "{'HOSTS': 'zk1:2181,zk2:2181,zk3:2181'}.")
        raw = dict(raw)
        known = OPTION_KEYS
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
            if host.count(":") > 1 and not host.strip().startswith("["):
                raise ConfigurationError(
                    f"{where}['HOSTS'] has {host!r}: write an IPv6 address in brackets, "
                    "as in '[::1]:2181'."
                )
            if not 1 <= int(host.strip().rpartition(":")[2]) <= 65535:
                raise ConfigurationError(
                    f"{where}['HOSTS'] has {host!r}, whose port is not between 1 and 65535."
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
        # What ZooKeeper itself refuses or keeps for itself, said here rather than as a
        # kazoo error at a worker's first call.
        if not all(is_znode_name(part) for part in root[1:].split("/")) \
                or root == "/zookeeper" or root.startswith("/zookeeper/"):
            raise ConfigurationError(
                f"{where}['ROOT'] is {root!r}: ZooKeeper refuses '.' and '..' as names and "
                "control characters in them, and keeps /zookeeper for itself; give a path "
                "such as '/zktasks'."
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
        if max_record is None or not 10_000 <= max_record <= MAX_RECORD_LIMIT:
            raise ConfigurationError(
                f"{where}['MAX_RECORD_BYTES'] is "
                f"{raw.get('MAX_RECORD_BYTES', DEFAULT_MAX_RECORD_BYTES)!r}; give a whole "
                f"number of bytes between 10000 and {MAX_RECORD_LIMIT} (ZooKeeper's default "
                f"jute.maxbuffer, {JUTE_MAXBUFFER}, less 8 KiB for the rest of a request)."
            )
        dead_letter_ttl = raw.get("DEAD_LETTER_TTL", 30 * 86400)
        if dead_letter_ttl is not None:
            dead_letter_ttl = float(_positive(dead_letter_ttl, where, "DEAD_LETTER_TTL"))
        dead_letter_limit = raw.get("DEAD_LETTER_LIMIT", 1000)
        if isinstance(dead_letter_limit, bool) or not isinstance(dead_letter_limit, int) \
                or dead_letter_limit < 1:
            raise ConfigurationError(
                f"{where}['DEAD_LETTER_LIMIT'] is {dead_letter_limit!r}; give a whole number "
                "of entries, at least 1 (each holds up to about 90 KB of ZooKeeper's heap)."
            )
        from .ratelimit import parse_rate_limits
        from .schedules import parse_schedules

        return cls(
            alias=alias,
            schedules=parse_schedules(alias, raw.get("SCHEDULES")),
            # Django's default QUEUES is ["default"]; [] accepts any queue name.
            rate_limits=parse_rate_limits(alias, raw.get("RATE_LIMITS"),
                                          params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])),
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
            tls=_tls(raw.get("TLS"), f"{where}['TLS']"),
        )


_TLS_KEYS = {"CA", "CERTFILE", "KEYFILE", "KEYFILE_PASSWORD", "VERIFY", "CHECK_HOSTNAME"}


def _tls(value, where: str) -> TlsOptions | None:
    """OPTIONS['TLS']: None or False (plain TCP), True (TLS, trusting the system's CAs),
    or a dict of _TLS_KEYS. The files are loaded here, so a wrong path, a key that does
    not match its certificate or a wrong password is said at startup, not as a
    connection that never comes up."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where} is {value!r}; give True, or a dict with some of "
                                 f"{sorted(_TLS_KEYS)}.")
    unknown = sorted(set(value) - _TLS_KEYS)
    if unknown:
        raise ConfigurationError(f"{where} has unknown keys {unknown!r}; the known ones are "
                                 f"{sorted(_TLS_KEYS)!r}.")
    files = {}
    for key in ("CA", "CERTFILE", "KEYFILE", "KEYFILE_PASSWORD"):
        item = value.get(key)
        if key != "KEYFILE_PASSWORD" and isinstance(item, os.PathLike):
            item = os.fspath(item)  # BASE_DIR / "ca.pem"
        if item is not None and (not isinstance(item, str) or not item):
            # A password is not shown: check() messages end up in deploy and CI logs.
            shown = _kind(item) if key == "KEYFILE_PASSWORD" else repr(item)
            raise ConfigurationError(f"{where}[{key!r}] is {shown}; give a path (a "
                                     "password for KEYFILE_PASSWORD) or None.")
        files[key] = item
    flags = {}
    for key in ("VERIFY", "CHECK_HOSTNAME"):
        item = value.get(key, True)
        if not isinstance(item, bool):
            raise ConfigurationError(f"{where}[{key!r}] is {item!r}; give True or False.")
        flags[key] = item
    if flags["CHECK_HOSTNAME"] and not flags["VERIFY"]:
        raise ConfigurationError(f"{where} has VERIFY False: set CHECK_HOSTNAME False too "
                                 "(a name cannot be checked on an unverified certificate).")
    for key in ("KEYFILE", "KEYFILE_PASSWORD"):
        if files[key] and not files["CERTFILE"]:
            raise ConfigurationError(f"{where} has a {key} but no CERTFILE: give the "
                                     "certificate that goes with the key.")
    tls = TlsOptions(ca=files["CA"], certfile=files["CERTFILE"], keyfile=files["KEYFILE"],
                     keyfile_password=files["KEYFILE_PASSWORD"], verify=flags["VERIFY"],
                     check_hostname=flags["CHECK_HOSTNAME"])
    for key in ("CA", "CERTFILE", "KEYFILE"):
        path = files[key]
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            hint = (" kazoo takes one PEM file, not a directory: put the CA certificates "
                    "in one file." if os.path.isdir(path) else "")
            raise ConfigurationError(f"{where}[{key!r}] is {path!r}, which is not a readable "
                                     f"file.{hint}")
    # Loaded one by one, to name what is wrong.
    steps = [("['CA']", "a PEM file of CA certificates",
              lambda: tls_context(ca=tls.ca))] if tls.ca else []
    if tls.certfile:
        steps.append(("['CERTFILE']" if not tls.keyfile else "['CERTFILE'] with ['KEYFILE']",
                      "a PEM certificate and the private key that matches it (in the "
                      "same file or in KEYFILE), and KEYFILE_PASSWORD if the key is "
                      "encrypted",
                      lambda: tls_context(certfile=tls.certfile, keyfile=tls.keyfile,
                                          keyfile_password=tls.keyfile_password)))
    for key, wanted, load in steps:
        try:
            load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"{where}{key} does not load ({exc}); give "
                                     f"{wanted}.") from exc
    return tls


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
    # What is wrong is said without the value: a fallback still verifies signatures, so
    # printing it (check() messages land in deploy and CI logs) would hand out a key.
    if not isinstance(value, list | tuple):
        wrong = f"is {_kind(value)}, not a list"
    else:
        bad = [i for i, key in enumerate(value) if not isinstance(key, str) or not key]
        wrong = f"entry {bad[0]} is {_kind(value[bad[0]])}" if bad else None
    if wrong:
        raise ConfigurationError(
            f"{name} {wrong}; give a list of the previous keys (non-empty strings), "
            "newest first, or [].")
    return tuple(value)


def _kind(value) -> str:
    """A setting's value described without showing it (for secrets)."""
    if isinstance(value, str) and not value:
        return "an empty string"
    return f"of type {type(value).__name__}"


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
