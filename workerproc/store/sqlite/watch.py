"""A descriptor that becomes readable when another process may have committed to the database:
an inotify watch (Linux) of the database's directory, for its file and its ``-wal``. SQLite
offers no notification across processes; every commit in WAL mode writes the ``-wal`` file (and
a checkpoint the database file), so a write there is the moment to read the change token
(``PRAGMA data_version``) again. Idle workers and ``wait`` sleep on it instead of polling the
token every few milliseconds.

Only a hint: a change seen here may be our own write or a checkpoint (the token tells), and an
idle waiter still reads the token now and then (``WATCHED_CHECK``), so a missed or coalesced
event costs latency, never a run. Where inotify is not there (another system, no free watch)
``open_watch`` answers None and the waiters poll the token as before. The descriptor belongs to
the process that opened it (a forked child opens its own) and is read by one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import struct
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

_IN_MODIFY, _IN_CREATE, _IN_MOVED_TO, _IN_Q_OVERFLOW = 0x2, 0x100, 0x80, 0x4000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


@cache
def _libc() -> ctypes.CDLL | None:
    """The C library's inotify calls: the process's own symbols first (``dlopen(NULL)``: no
    search, and no ``ctypes.util``, which loads tempfile, shutil, bz2 and lzma into every
    worker for it), else the library ``find_library`` names. ctypes is imported here, at the
    first watch: a command that never waits on the database does not load it."""
    import ctypes  # noqa: PLC0415

    libc: ctypes.CDLL | None = None
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(None, use_errno=True)
    if libc is None or not hasattr(libc, "inotify_init1"):
        libc = _found_libc()
    if libc is None or not hasattr(libc, "inotify_init1"):
        return None
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


def _found_libc() -> ctypes.CDLL | None:
    import ctypes  # noqa: PLC0415 - (_libc)
    from ctypes.util import find_library  # noqa: PLC0415 - only where dlopen(NULL) had no inotify

    name = find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)


class FileWatch:
    """Writes to the database's file or its ``-wal``, as a descriptor (``fileno``)."""

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self._fd = fd
        self._names = names
        self.pid = os.getpid()

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> bool:
        """Read every pending event; whether one was a write to the database (or events were
        lost: the kernel's queue overflowed, which counts as one)."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except (BlockingIOError, InterruptedError):
                return seen
            except OSError:
                return True  # (say "look": the token decides)
            if not data:
                return seen
            at = 0
            while at + _EVENT.size <= len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                seen = seen or bool(mask & _IN_Q_OVERFLOW) or name in self._names

    def close(self) -> None:
        if self.pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)


def open_watch(path: str) -> FileWatch | None:
    """A watch of ``path`` (a database file) and its ``-wal``; None where inotify cannot give
    one (not Linux, no free instance or watch)."""
    libc = _libc()
    if libc is None:
        return None
    directory, name = os.path.split(os.path.abspath(path))
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    mask = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO
    if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
        os.close(fd)  # no watch left (ENOSPC), or the directory is gone: the waiters poll
        return None
    raw = os.fsencode(name)
    return FileWatch(fd, frozenset({raw, raw + b"-wal"}))
