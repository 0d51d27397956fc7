"""The worker lifecycle hooks (``@app.on_worker_start``, ``@app.on_worker_stop``), run in the
worker process after the fork: a plain hook on the calling thread, an ``async def`` one (or a
plain one that returns an awaitable) on the event loop that runs the worker's ``async def``
handlers, handed over by ``on_loop``. The worker and the test mode run them the same way."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .logs import event

log = logging.getLogger("workerproc.worker")

OnLoop = Callable[[Awaitable[Any]], Any]  # run an awaitable on the handlers' loop, wait for it


def name_of(hook: Callable[..., Any]) -> str:
    return str(getattr(hook, "__qualname__", None) or getattr(hook, "__name__", repr(hook)))


def is_async(hooks: Sequence[Callable[..., Any]]) -> bool:
    """Whether any hook is an ``async def`` one (the loop must then exist before the first)."""
    return any(inspect.iscoroutinefunction(h) for h in hooks)


def call(hook: Callable[[], Any], on_loop: OnLoop) -> None:
    """Run one hook: a plain one here, an awaitable it returns (an ``async def`` one's
    coroutine) on the handlers' loop; whatever it raises propagates."""
    result = hook()
    if inspect.isawaitable(result):
        on_loop(result)


def start(hooks: Sequence[Callable[[], Any]], on_loop: OnLoop) -> BaseException | None:
    """Run the start hooks in order; the first that raises stops the rest and is returned
    (logged, with what it was) so the worker exits before it claims anything."""
    for hook in hooks:
        try:
            call(hook, on_loop)
        except BaseException as exc:  # a user's hook, whatever it raised
            event(log, "worker_start_hook_failed",
                  f"worker start hook {name_of(hook)} raised {type(exc).__name__}: {exc}",
                  level=logging.ERROR, hook=name_of(hook), error=type(exc).__name__,
                  exc_info=exc)  # fmt: skip
            return exc
    return None


def stop(hooks: Sequence[Callable[[], Any]], on_loop: OnLoop) -> None:
    """Run the stop hooks in reverse order, every one of them: one that raises is logged."""
    for hook in reversed(hooks):
        try:
            call(hook, on_loop)
        except BaseException as exc:  # a user's hook, whatever it raised
            event(log, "worker_stop_hook_failed",
                  f"worker stop hook {name_of(hook)} raised {type(exc).__name__}: {exc}",
                  level=logging.WARNING, hook=name_of(hook), error=type(exc).__name__,
                  exc_info=exc)  # fmt: skip
