"""The write lock handed over at a commit: a waiter wakes when the holder commits, not when its
back-off ends.

SQLite's write lock has no queue and no wake-up: a writer that finds it taken sleeps and tries
again (``dialect.py``), and two busy worker processes each slept about a quarter of a drain
there, often past the other's commit. So every write transaction of ours, once it committed or
rolled back (the lock is free), opens and closes a small file beside the database (the
producers' file, ``DB-producers``: ``intent.py``), and a process's writer that waits for the
lock waits on an inotify watch of that file's opens instead of sleeping: it wakes at the next
commit of any of our processes, or when its back-off ends, whichever comes first.

Only a wake-up, never a lock: every wait is the back-off it replaces, at most, so a holder that
is stopped (SIGSTOP) or dead (the kernel released SQLite's lock, nobody opened the file), a
writer that is not ours (the ``sqlite3`` shell) or a lost event cost what they cost before:
the waiter tries again after its back-off, and gives up at ``busy_timeout``. (A blocking
``fcntl`` lock on the side file would hand over as well, but Python has no bounded wait on one
without a signal handler, which a library cannot own.)

Fairness stays as it was (``dialect.py``'s ageing): a newcomer woken by a commit waits another
0.2 ms before it tries, so a writer that has waited past its age, woken by the same commit, tries
first (without it, whichever process the scheduler ran first won, and at -n 8 some processes
did three times the work of others).

One watch per process and file, used by the thread whose turn it is (``turns.py``: one writer
of a process competes for the file at a time); made at its first wait, again after a fork.
Where it cannot be made (not Linux, no free inotify instance, no side file yet) waiters sleep
(and it is tried again a second later).
The watch never follows a symlink (``IN_DONT_FOLLOW``), nor does the open (``O_NOFOLLOW``,
read-only, never creating). An open, not a write nor a change of the file's times: either is
a journaled change of its inode, which waits behind the other writers' fsyncs (measured at 8
processes: a write-lock probe's p50 from 0.1 ms to 14-30 ms); and the watches of the
database's directory (``watch.py``) see writes, so every commit would wake the supervisor's
drain and each idle waiter once more.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time

from .watch import _libc

_IN_OPEN, _IN_DONT_FOLLOW = 0x20, 0x02000000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, 0o2000000
_DEFER = 0.0002  # a newcomer woken by a commit lets older waiters try first for this long
_RETRY = 1.0  # seconds before a watch that could not be made (no side file yet) is tried again


class Handoff:
    """Waits for the next commit of our writers to the database whose side file is ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = os.getpid()
        self._retry_at = 0.0  # (a watch that could not be made is tried again a second later)
        self._guard = threading.Lock()

    def _watch(self) -> int | None:
        if self._pid != os.getpid():  # a forked child: the parent's descriptor is the parent's
            self._fd, self._retry_at, self._pid = None, 0.0, os.getpid()
            self._guard = threading.Lock()
        if self._fd is None and time.monotonic() >= self._retry_at:
            with self._guard:
                if self._fd is None and time.monotonic() >= self._retry_at:
                    self._retry_at = time.monotonic() + _RETRY
                    self._fd = _open(self.path)
        return self._fd

    def wait(self, seconds: float, defer: float = 0.0) -> None:
        """Sleep at most ``seconds``, less if one of our writers commits meanwhile: then
        ``defer`` more (within ``seconds``), which lets a writer that waited longer try first.
        (A wake-up left from a commit before the caller's last try costs one early try.)"""
        fd = self._watch()
        if fd is None:
            time.sleep(seconds)
            return
        started = time.monotonic()
        try:
            ready, _, _ = select.select([fd], [], [], seconds)
        except (OSError, ValueError):  # (closed by another thread's close)
            time.sleep(seconds)
            return
        if ready:
            _drain(fd)
            if defer > 0.0:
                time.sleep(max(0.0, min(defer, started + seconds - time.monotonic())))

    def newcomer(self, seconds: float) -> None:
        """A newcomer's wait (``dialect._retrying``): woken by a commit, it lets the writers
        that waited past their age (polling, not deferring) take the lock first."""
        self.wait(seconds, _DEFER)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        self._retry_at = float("inf")
        if fd is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(fd)


def _open(path: str) -> int | None:
    """An inotify descriptor watching writes to ``path``; None where there can be none."""
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(path), _IN_OPEN | _IN_DONT_FOLLOW) < 0:
        os.close(fd)  # no such file, no watch left: the waiters sleep
        return None
    return int(fd)


def _drain(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
