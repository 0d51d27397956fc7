"""Exponential backoff with jitter, the one rule every retry here follows: the ``n``-th retry
(1-based) waits ``base * 2**(n-1)``, capped at ``cap``, times a random factor within
``1 ± jitter``, so retries neither hammer what failed nor arrive as a herd."""

from __future__ import annotations

import random


def backoff(n: int, base: float, cap: float, jitter: float = 0.25) -> float:
    """Seconds to wait before retry number ``n`` (1 for the first retry)."""
    delay = min(cap, base * 2.0 ** max(0, n - 1))
    return delay * random.uniform(1.0 - jitter, 1.0 + jitter)
