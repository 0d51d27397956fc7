"""Webhook signatures (issue 26, item 4; docs/protocol.md B19): how a delivery is signed and
how a receiver checks it.

A delivery is an HTTP POST whose body is the event's JSON; its ``Leasekeeper-Signature``
header is ``t=<unix seconds>,v1=<hex>``, where ``<hex>`` is the HMAC-SHA256, keyed with the
webhook's secret, of ``f"{t}.{body}"`` (the timestamp, a dot, the body's exact bytes). A
receiver recomputes it with ``verify`` and refuses a signature older (or newer) than its
tolerance, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["HEADER", "MAX_TOLERANCE", "SignatureError", "sign", "signature_header", "verify"]

HEADER = "Leasekeeper-Signature"
SCHEME = "v1"
MAX_TOLERANCE = 86_400  # seconds a receiver may accept at most (a day)
MAX_HEADER = 4096  # characters of a signature header read at most


class SignatureError(ValueError):
    """A delivery whose signature header is missing, malformed, stale or does not match."""


def _key(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("a webhook secret must not be empty")
    return key


def _body(body: str | bytes) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


def sign(secret: str | bytes, timestamp: int, body: str | bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}.{body}"`` keyed with ``secret``."""
    message = str(int(timestamp)).encode() + b"." + _body(body)
    return hmac.new(_key(secret), message, hashlib.sha256).hexdigest()


def signature_header(secret: str | bytes, body: str | bytes, timestamp: int | None = None) -> str:
    """The ``Leasekeeper-Signature`` value for ``body``: ``t=<timestamp>,v1=<hex>``
    (``timestamp``: now, in whole seconds, unless given)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},{SCHEME}={sign(secret, t, body)}"


def verify(
    secret: str | bytes, header: str | None, body: str | bytes, tolerance: float = 300,
    *, now: float | None = None,
) -> int:  # fmt: skip
    """Check a delivery: ``header`` is its ``Leasekeeper-Signature`` value, ``body`` its raw
    body (the bytes as received, before any JSON parsing). Returns the signed timestamp;
    raises ``SignatureError`` when the header is missing or malformed, when no ``v1``
    signature in it matches, or when its timestamp is more than ``tolerance`` seconds (0 to
    ``MAX_TOLERANCE``) away from ``now`` (the wall clock unless given)."""
    if isinstance(tolerance, bool) or not 0 <= tolerance <= MAX_TOLERANCE:
        raise ValueError(f"tolerance must be from 0 to {MAX_TOLERANCE} seconds (got {tolerance!r})")
    if not header:
        raise SignatureError(f"no {HEADER} header")
    if len(header) > MAX_HEADER:
        raise SignatureError(f"the {HEADER} header is longer than {MAX_HEADER} characters")
    stamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"malformed {HEADER} header: {part.strip()!r} is not key=value")
        if name == "t":
            if not value.isascii() or not value.isdigit() or len(value) > 12:
                raise SignatureError(f"malformed {HEADER} header: t={value!r} is not a time")
            stamp = int(value)
        elif name == SCHEME:
            candidates.append(value)
    if stamp is None:
        raise SignatureError(f"the {HEADER} header has no timestamp (t=...)")
    if not candidates:
        raise SignatureError(f"the {HEADER} header has no {SCHEME} signature")
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance:
        raise SignatureError(
            f"the signature's timestamp is {abs(current - stamp):.0f} s away from now "
            f"(tolerance {tolerance:g} s)"
        )
    expected = sign(secret, stamp, body)
    if not any(hmac.compare_digest(expected, c.lower()) for c in candidates):
        raise SignatureError("the signature does not match the body (wrong secret, or altered)")
    return stamp
