"""A worker's signal plumbing: handlers that only record, a self-pipe that wakes the conductor,
and the one interruption a handler may get (``LeaseLost`` or ``Abort``, raised only inside an
inline handler on the main thread).

- TERM / INT: finish the running tasks, then exit 0 (``stop``).
- QUIT: abandon the running tasks at once (``quit``): an inline handler gets ``Abort``.
- USR1 (``INTERRUPT``): sent by the heartbeat thread to the main thread when the lease of the
  inline handler is lost; the handler gets ``LeaseLost``. Never raised outside a handler.
- The parent's signals (HUP, TTIN, TTOU, USR2) are ignored; CHLD is default.

``signal.set_wakeup_fd`` makes the C-level handler write the signal number to the pipe even
when a Python-level handler is delayed (one that raises can delay another), so the conductor
also reads TERM and QUIT from the pipe (``absorb``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType

from .store.readiness import readable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
PARENT_SIGNALS = (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD, signal.SIGUSR2)
INTERRUPT = signal.SIGUSR1  # heartbeat thread -> main thread: abort the inline handler


def main_thread_only() -> None:
    """Called first by every helper thread of a worker (heartbeat, slots, the event loop): the
    worker's signals are delivered to the main thread, whose handlers record them and whose
    blocking calls they interrupt (an inline handler's QUIT, say)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {*STOP_SIGNALS, *PARENT_SIGNALS, INTERRUPT})


class Abort(BaseException):
    """QUIT arrived while an inline handler ran: abandon it (its lease is released)."""


class Waker:
    """A self-pipe: written by signal handlers (the wakeup fd) and by other threads (a zero
    byte: a slot finished, a lease was lost); the conductor sleeps on it."""

    def __init__(self) -> None:
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is already a pending wake-up
            os.write(self.wfd, b"\0")

    def wait(self, timeout: float, also: int | None = None) -> set[int]:
        """Sleep up to ``timeout`` seconds or until woken (or until descriptor ``also`` is
        readable: the store's change watch); return the signal numbers seen."""
        if timeout > 0:
            fds = (self.rfd,) if also is None else (self.rfd, also)
            with contextlib.suppress(OSError, ValueError):  # ``also`` closed: look again
                readable(fds, timeout)
        return self.drain()

    def drain(self) -> set[int]:
        seen: set[int] = set()
        while True:
            try:
                data = os.read(self.rfd, 512)
            except (BlockingIOError, InterruptedError):
                return seen
            if not data:
                return seen
            seen.update(b for b in data if b)

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)


class Signals:
    """What the signals asked for. Handlers record; the conductor acts."""

    def __init__(self) -> None:
        self.stop: int | None = None  # TERM/INT: finish the running tasks, then stop
        self.quit = False  # QUIT: abandon the running tasks now
        self.in_handler = False  # an inline handler runs on the main thread now
        self.interrupt: type[BaseException] | None = None  # what INTERRUPT raises in it

    def on_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        self.stop = signum

    def on_quit(self, _signum: int, _frame: FrameType | None = None) -> None:
        self.quit = True
        if self.in_handler:
            raise Abort()

    def on_interrupt(self, _signum: int, _frame: FrameType | None = None) -> None:
        # Raise only inside an inline handler, never in the worker's own bookkeeping.
        if self.in_handler and self.interrupt is not None:
            exc, self.interrupt = self.interrupt, None
            raise exc()

    def absorb(self, seen: set[int]) -> None:
        """Signals read from the wakeup fd: a belt to the Python handlers' braces."""
        if signal.SIGTERM in seen or signal.SIGINT in seen:
            self.stop = self.stop or signal.SIGTERM
        if signal.SIGQUIT in seen:
            self.quit = True

    @property
    def asked(self) -> bool:
        return self.stop is not None or self.quit

    def install(self, waker: Waker) -> None:
        """The worker's own handlers, then unblock what the supervisor blocked across fork."""
        signal.signal(signal.SIGTERM, self.on_stop)
        signal.signal(signal.SIGINT, self.on_stop)
        signal.signal(signal.SIGQUIT, self.on_quit)
        signal.signal(INTERRUPT, self.on_interrupt)
        for sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)  # the supervisor's business, not ours
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(waker.wfd, warn_on_full_buffer=False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {*STOP_SIGNALS, *PARENT_SIGNALS, INTERRUPT})
