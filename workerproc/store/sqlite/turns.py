"""The write lock's turns between the threads of one process, on one SQLite file.

SQLite's write lock has no queue: a writer that finds it taken sleeps and tries again (see
``dialect.py``: 0.5 to 5 ms for a newcomer). Between processes nothing better is at hand, but
the threads of one process (a worker's exchanges, its heartbeat and its stream writer; the
async store's threads) take turns on a lock of the process first: a thread that waits for
another of its process sleeps on that lock and is woken at its commit, instead of polling the
file and oversleeping a transaction of a millisecond by several. Only one thread of a process
then competes for the file with the other processes, as before.

One lock per file and process: a child after ``fork`` makes its own (the parent's may have been
held by a thread the child does not have).
"""

from __future__ import annotations

import os
import threading

_turns: dict[tuple[str, int], threading.RLock] = {}
_guard = threading.Lock()


def turn(path: str) -> threading.RLock:
    """The lock this process's writers of the file at ``path`` (absolute) take turns on."""
    key = (path, os.getpid())
    found = _turns.get(key)
    if found is None:
        with _guard:
            found = _turns.setdefault(key, threading.RLock())
    return found


def _forked() -> None:
    global _guard
    _guard = threading.Lock()
    _turns.clear()


os.register_at_fork(after_in_child=_forked)
