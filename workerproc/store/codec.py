"""JSON in and out of the store: the only encoding payloads, state and results get (no pickle:
loading a pickle from a shared database is code execution)."""

from __future__ import annotations

import json

from .errors import InvalidPayload
from .types import JSON


def dumps(value: JSON, what: str) -> str:
    """JSON-encode ``value`` or raise InvalidPayload naming ``what``."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serializable: {exc}") from None


def loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)
