"""Sign and verify the pickled parts of records, and (de)serialize them with dill.

An envelope is {"mac": hex, "data": base64}: the MAC is HMAC-SHA256 over the kind
("payload" or "result"), the job id and the bytes, keyed by SIGNING_KEY, so a payload
copied to another job, a result passed off as a payload, or bytes written by anyone
without the key are refused before dill sees them.

Envelopes are always sealed with SIGNING_KEY and opened with it or any of
SIGNING_KEY_FALLBACKS, as django.core.signing does with SECRET_KEY_FALLBACKS: a key can
be rotated without failing the jobs and results signed before.
"""

import base64
import binascii
import functools
import hashlib
import hmac
from collections.abc import Sequence

from django.utils.crypto import constant_time_compare

from .exceptions import PayloadVerificationError
from .serialization import loads

PAYLOAD = "payload"
RESULT = "result"
_SALT = "zktasks.envelope"


@functools.lru_cache(maxsize=8)
def _derived_key(key: str) -> bytes:
    # What django.utils.crypto.salted_hmac derives on every call, kept per key: the
    # same MACs, one hash less per payload and per result.
    return hashlib.sha256((_SALT + key).encode()).digest()


def _mac(blob: bytes, *, job_id: str, kind: str, key: str) -> str:
    # salted_hmac(_SALT, message, secret=key, algorithm="sha256"): salted_hmac defaults
    # to SHA-1; the contract asks for SHA-256.
    message = f"{kind}\x00{job_id}\x00".encode() + blob
    return hmac.new(_derived_key(key), message, hashlib.sha256).hexdigest()


def seal(blob: bytes, *, job_id: str, kind: str, key: str) -> dict:
    """Wrap bytes in a signed envelope bound to one job and one kind."""
    return {  # keys in sorted order: a record encodes it as it is (records._in_order)
        "data": base64.b64encode(blob).decode("ascii"),
        "mac": _mac(blob, job_id=job_id, kind=kind, key=key),
    }


def open_envelope(envelope, *, job_id: str, kind: str, keys: Sequence[str]) -> bytes:
    """Return the verified bytes of an envelope, or raise PayloadVerificationError.

    `keys`: the current key first, then the fallbacks (conf.Options.verify_keys).
    """
    if isinstance(keys, str):  # one key: iterating it would try each character
        keys = (keys,)
    if not isinstance(envelope, dict) or not envelope.get("mac") or "data" not in envelope:
        raise PayloadVerificationError(
            f"The {kind} of job {job_id!r} is not signed; it will not be loaded."
        )
    try:
        blob = base64.b64decode(envelope["data"], validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise PayloadVerificationError(
            f"The {kind} of job {job_id!r} is not valid base64; it will not be loaded."
        ) from exc
    mac = str(envelope["mac"])
    if not any(constant_time_compare(_mac(blob, job_id=job_id, kind=kind, key=key), mac)
               for key in keys):
        raise PayloadVerificationError(
            f"The {kind} of job {job_id!r} fails its signature check (tampered, copied from "
            "another job, or signed with another SIGNING_KEY: after a rotation, list the "
            "old key in SIGNING_KEY_FALLBACKS); it will not be loaded."
        )
    return blob


def load(envelope, *, job_id: str, kind: str, keys: Sequence[str]):
    """Verify an envelope, then unpickle it."""
    return loads(open_envelope(envelope, job_id=job_id, kind=kind, keys=keys))
