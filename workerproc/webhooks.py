"""Webhook signatures (docs/protocol.md B20): how a delivery is signed and
how a receiver checks it.

A delivery is an HTTP POST whose body is the event's JSON; its ``Leasekeeper-Signature``
header is ``t=<unix seconds>,v1=<hex>``, where ``<hex>`` is the HMAC-SHA256, keyed with the
webhook's secret, of ``f"{t}.{body}"`` (the timestamp, a dot, the body's exact bytes). A
receiver recomputes it with ``verify`` and refuses a signature older (or newer) than its
tolerance, so a captured request cannot be replayed later; within the tolerance a replay is
the same signed body, with the same ``id``, which the receiver deduplicates on (the event id is
sent in the body only: an unsigned copy of it in a header could be changed by whoever replays).
"""

from __future__ import annotations

import math
import re
import time

__all__ = ["HEADER", "MAX_TOLERANCE", "SignatureError", "sign", "signature_header", "verify"]

HEADER = "Leasekeeper-Signature"
SCHEME = "v1"
MAX_TOLERANCE = 86_400  # seconds a receiver may accept at most (a day)
MAX_HEADER = 4096  # characters of a signature header read at most
_HEX = re.compile(r"[0-9a-fA-F]{64}")


class SignatureError(ValueError):
    """A delivery whose signature header is missing, malformed, stale or does not match."""


def _key(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("a webhook secret must not be empty")
    return key


def _body(body: str | bytes) -> bytes:
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"a body is text or bytes, not {type(body).__name__}")


def sign(secret: str | bytes, timestamp: int, body: str | bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}.{body}"`` keyed with ``secret``."""
    import hashlib  # noqa: PLC0415 - a worker that delivers nothing does not load them
    import hmac  # noqa: PLC0415

    message = str(int(timestamp)).encode() + b"." + _body(body)
    return hmac.new(_key(secret), message, hashlib.sha256).hexdigest()


def signature_header(secret: str | bytes, body: str | bytes, timestamp: int | None = None) -> str:
    """The ``Leasekeeper-Signature`` value for ``body``: ``t=<timestamp>,v1=<hex>``
    (``timestamp``: now, in whole seconds, unless given)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},{SCHEME}={sign(secret, t, body)}"


def verify(
    secret: str | bytes, header: str | bytes | None, body: str | bytes, tolerance: float = 300,
    *, now: float | None = None,
) -> int:  # fmt: skip
    """Check a delivery: ``header`` is its ``Leasekeeper-Signature`` value, ``body`` its raw
    body (the bytes as received, before any JSON parsing). Returns the signed timestamp;
    raises ``SignatureError``, and nothing else, for any header or body that is not one we
    signed: missing, malformed (not ASCII, a part that is not ``key=value``, no ``t=`` or two,
    a ``v1=`` that is not 64 hex digits), no ``v1`` signature that matches, or a timestamp
    more than ``tolerance`` whole seconds (0 to ``MAX_TOLERANCE``) away from ``now``'s (the
    wall clock unless given): 0 accepts only a signature made in the current second.
    ``ValueError`` only for the caller's own arguments (the tolerance, an empty secret).

    Deduplicate on the ``id`` of the body you verified (delivery is at least once): the body
    is what the signature covers."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float):
        raise ValueError(f"tolerance must be a number of seconds (got {tolerance!r})")
    if not 0 <= tolerance <= MAX_TOLERANCE:
        raise ValueError(f"tolerance must be from 0 to {MAX_TOLERANCE} seconds (got {tolerance!r})")
    key = _key(secret)
    text = _header(header)
    try:
        raw = _body(body)
    except (TypeError, UnicodeError) as exc:
        raise SignatureError(f"the body cannot be checked: {exc}") from None
    stamp, candidates = _parts(text)
    current = time.time() if now is None else now
    away = abs(math.floor(current) - stamp)
    if away > tolerance:
        raise SignatureError(
            f"the signature's timestamp is {away} s away from now (tolerance {tolerance:g} s)"
        )
    import hashlib  # noqa: PLC0415 - (see ``sign``)
    import hmac  # noqa: PLC0415

    expected = hmac.new(key, str(stamp).encode() + b"." + raw, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("the signature does not match the body (wrong secret, or altered)")
    return stamp


def _header(header: object) -> str:
    """The header as ASCII text, or ``SignatureError``."""
    if header is None or (isinstance(header, str | bytes | bytearray) and not header):
        raise SignatureError(f"no {HEADER} header")
    if isinstance(header, bytes | bytearray):
        try:
            header = bytes(header).decode("ascii")
        except UnicodeDecodeError:
            raise SignatureError(f"the {HEADER} header is not ASCII") from None
    if not isinstance(header, str):
        raise SignatureError(f"the {HEADER} header is not text ({type(header).__name__})")
    if len(header) > MAX_HEADER:
        raise SignatureError(f"the {HEADER} header is longer than {MAX_HEADER} characters")
    if not header.isascii():
        raise SignatureError(f"the {HEADER} header is not ASCII")
    return header


def _parts(header: str) -> tuple[int, list[str]]:
    """The timestamp and the ``v1`` signatures (lower-case hex) of an ASCII header."""
    stamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"malformed {HEADER} header: {part.strip()!r} is not key=value")
        if name == "t":
            if stamp is not None:
                raise SignatureError(f"malformed {HEADER} header: more than one t=")
            if not value.isdigit() or len(value) > 12:
                raise SignatureError(f"malformed {HEADER} header: t={value!r} is not a time")
            stamp = int(value)
        elif name == SCHEME:
            if not _HEX.fullmatch(value):
                raise SignatureError(
                    f"malformed {HEADER} header: a {SCHEME}= value is not 64 hex digits"
                )
            candidates.append(value.lower())
    if stamp is None:
        raise SignatureError(f"the {HEADER} header has no timestamp (t=...)")
    if not candidates:
        raise SignatureError(f"the {HEADER} header has no {SCHEME} signature")
    return stamp, candidates
