"""Where handlers run: one executor per ``Mode``, behind one interface.

- **inline** (``inline.py``): with one slot, a plain ``def`` handler runs on the main thread, the
  conductor's, as it always did: a lost lease interrupts it (``LeaseLost``), QUIT abandons it
  (``Abort``).
- **thread** (``threads.py``): with several slots, plain handlers run on a pool of threads. A
  thread cannot be stopped from outside: a lost lease sets ``ctx.lease_lost`` and its next
  ``ctx`` call raises ``LeaseLost``; its result is discarded either way.
- **async** (``aio.py``): ``async def`` handlers run on one event loop thread; a lost lease, a
  timeout or QUIT cancels the coroutine. One handler can block the loop, and so every other.

The worker talks to each the same way: ``submit`` an execution, ``interrupt`` it (after a lost
lease, a timeout, QUIT), ask whether one handler holds the whole executor (``blocked``) or
whether it died (``dead``), ``close`` it. Each reports every ending as an event
(``TaskFinished``, ``events.py``) through the ``post`` it was built with.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from ..execution import Execution, Mode, Stopped

BLOCKED_AFTER = 1.0  # an executor held this long by one handler is reported blocked


class Executor(abc.ABC):
    """Runs the handlers of one ``Mode`` for one worker."""

    mode: ClassVar[Mode]
    # Its handlers run on the conductor's own thread: while one runs, nothing else of the worker
    # does, and one that cannot be stopped leaves the process no way on but out.
    on_conductor: ClassVar[bool] = False

    @abc.abstractmethod
    def submit(self, ex: Execution) -> None:
        """Run ``ex``'s handler (inline: now, on this thread), if it may still begin; record
        its ending on ``ex`` and post it (``TaskFinished``)."""

    def interrupt(self, ex: Execution, why: Stopped) -> bool:
        """Tell ``ex``'s handler to stop for ``why`` (from any thread; for ``LOST``, its
        ``lost`` flag is set already). True when that reaches it: it ends, and its ending says
        why. False when this kind of slot cannot stop a running call."""
        return False

    def blocked(self, after: float = BLOCKED_AFTER) -> tuple[float, Execution | None] | None:
        """(seconds, the execution) when one handler has held every slot of this executor for
        ``after`` seconds (an async handler blocking the event loop); None otherwise."""
        return None

    def dead(self) -> BaseException | None:
        """Why this executor can no longer run handlers (None: it can)."""
        return None

    def close(self) -> None:  # noqa: B027 - most executors hold nothing to close
        """Let idle threads end; a handler still running is abandoned with the process."""


class Executors(dict[Mode, Executor]):
    """A worker's executors, one per mode (a plain mapping: one lookup per task)."""

    def __init__(self, *executors: Executor) -> None:
        super().__init__((executor.mode, executor) for executor in executors)
        assert set(self) == set(Mode), "one executor per mode"

    def dead(self) -> BaseException | None:
        return next((died for e in self.values() if (died := e.dead()) is not None), None)

    def blocked(self, after: float = BLOCKED_AFTER) -> tuple[float, Execution | None] | None:
        return next((held for e in self.values() if (held := e.blocked(after)) is not None), None)

    def close(self) -> None:
        for executor in self.values():
            executor.close()
