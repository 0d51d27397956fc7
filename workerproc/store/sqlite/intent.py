"""Producers ahead of a busy pool on SQLite's one write lock.

A pool of short handlers keeps the write lock busy with batched exchanges (each commits and
claims up to a prefetch window of tasks), and a producer's one-run transaction would queue
behind them: at 8,000 runs/s its p99 enqueue grew past 70 ms. So a producer *announces* its
transaction with a shared ``flock`` on a small file beside the database (``DB-producers``) while
it waits for the lock and writes; a worker about to start an exchange first checks for an
announcement (a non-blocking exclusive ``flock`` that it drops at once) and, while one is there,
waits in short sleeps, for at most ``YIELD_MAX``. A worker that waits only gathers a bigger batch.

This is a priority hint, never a rule the protocol relies on: every wait is bounded, and
when the file cannot be opened (a read-only directory, a symlink in its place, another user's
file) nobody announces and nobody waits. Each thread has its own descriptor (``flock`` belongs
to an open file description), opened after fork and closed when its thread ends (a server that
starts a thread per request must not leak them); an inherited one is never used or unlocked.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import threading
import time
from collections.abc import Iterator

YIELD_MAX = 0.02  # a worker lets announced producers go first for at most this long
YIELD_SLEEP = 0.0005  # ... looking again every half millisecond
ANNOUNCE_MAX = 0.005  # a producer gives up announcing (a worker's probe is stuck) after this

_abandoned: list[io.FileIO] = []  # files inherited across fork(): kept open, never unlocked


class Intent:
    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._pid = os.getpid()

    def _fd(self) -> int | None:
        if self._pid != os.getpid():
            inherited = getattr(self._local, "file", None)
            if inherited is not None:
                _abandoned.append(inherited)  # unlocking it would unlock the parent's
            self._local = threading.local()
            self._pid = os.getpid()
        if not hasattr(self._local, "file"):
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                # a FileIO closes the descriptor when the thread's local storage goes
                self._local.file = io.FileIO(os.open(self.path, flags, 0o600), "r+")
            except OSError:
                self._local.file = None  # no announcements from this thread: no priority
        file: io.FileIO | None = self._local.file
        return None if file is None else file.fileno()

    @contextlib.contextmanager
    def announce(self) -> Iterator[None]:
        """Around a producer's transaction: workers let it go first."""
        fd = self._fd()
        held = False
        if fd is not None:
            deadline = time.monotonic() + ANNOUNCE_MAX
            while not held:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    held = True
                except BlockingIOError:  # a worker's probe, held for microseconds
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.0001)
                except OSError:
                    break
        try:
            yield
        finally:
            if held and fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def producers_waiting(self) -> bool:
        """Whether another process (or thread) has announced a producer's transaction."""
        fd = self._fd()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def yield_to_producers(self) -> float:
        """Before a worker's exchange: wait while producers are announced, at most
        ``YIELD_MAX``. Returns the seconds waited."""
        if not self.producers_waiting():
            return 0.0
        started = time.monotonic()
        deadline = started + YIELD_MAX
        while time.monotonic() < deadline:
            time.sleep(YIELD_SLEEP)
            if not self.producers_waiting():
                break
        return time.monotonic() - started

    def close(self) -> None:
        file = getattr(self._local, "file", None)
        if file is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                file.close()
        self._local = threading.local()
