"""Flow control for paid APIs, the handler's side: ``app.limit(...)`` declares a
limit, ``@app.task(limits=[...], tokens=...)`` puts a task behind it, ``ctx.usage(tokens=n)``
reports what a call used, and ``raise RetryAfter(seconds)`` gives the task back (a provider's
429) without spending an attempt. The database keeps the numbers and the claim enforces them,
for every worker on every host (``workerproc/store/protocol/gates.py``)."""

from __future__ import annotations

import math

from .store.limits import MAX_LIMITS, LimitSpec, check_limit_name

MAX_RETRY_AFTER = 86_400.0

__all__ = ["MAX_LIMITS", "LimitSpec", "RetryAfter", "check_task_limits"]


class RetryAfter(Exception):
    """Raise in a handler when a limit said "not now" (an API's 429): the task goes back after
    ``seconds`` without spending an attempt, and, unless ``limit=False``, every limit of the
    task (for its key) pauses that long for every worker on every host."""

    def __init__(self, seconds: float, *, limit: bool = True) -> None:
        try:  # a bool is no number of seconds (True would have meant 1 s)
            value = math.nan if isinstance(seconds, bool) else float(seconds)
        except (TypeError, ValueError):
            value = math.nan
        if not 0 <= value <= MAX_RETRY_AFTER:
            raise ValueError(f"RetryAfter takes 0 to {MAX_RETRY_AFTER:g} seconds (got {seconds!r})")
        super().__init__(f"retry after {value:g} s")
        self.seconds = value
        self.limit = bool(limit)


def check_task_limits(
    task: str, limits: object, tokens: object
) -> tuple[tuple[str, ...] | None, int | None]:
    """``@app.task(limits=..., tokens=...)``, checked (ValueError names the bad value). An
    empty list means no limits, as None does."""
    names: tuple[str, ...] | None = None
    if limits is not None:
        if isinstance(limits, str) or not hasattr(limits, "__iter__"):
            raise ValueError(f"@app.task({task!r}): limits must be a list of limit names")
        try:
            names = tuple(check_limit_name(n) for n in limits)
        except ValueError as exc:
            raise ValueError(f"@app.task({task!r}): {exc}") from None
        if len(set(names)) != len(names) or len(names) > MAX_LIMITS:
            raise ValueError(
                f"@app.task({task!r}): limits names at most {MAX_LIMITS} different limits"
            )
        names = names or None
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= 10**9
    ):
        raise ValueError(f"@app.task({task!r}): tokens must be a whole number from 0")
    if tokens is not None and names is None:
        raise ValueError(f"@app.task({task!r}): tokens reserve from limits: give limits too")
    return names, tokens
