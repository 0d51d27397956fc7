"""A self-pipe that wakes the worker's main thread: written by signal handlers (it is the
``signal.set_wakeup_fd`` target, so the C-level handler writes the signal number even when a
Python-level handler is delayed) and by the heartbeat thread (a zero byte)."""

from __future__ import annotations

import contextlib
import os
import select


class Waker:
    def __init__(self) -> None:
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is already a pending wake-up
            os.write(self.wfd, b"\0")

    def wait(self, timeout: float) -> set[int]:
        """Sleep up to ``timeout`` seconds or until woken; return the signal numbers seen."""
        if timeout > 0:
            select.select([self.rfd], [], [], timeout)
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
