"""How a worker with free slots waits for work without touching the write lock (R7).

It sleeps on its self-pipe and on the store's change watch (SQLite: an inotify watch of the
database's files; PostgreSQL: the LISTEN connection's socket), and reads the database's cheap
change token (SQLite: ``PRAGMA data_version``; PostgreSQL: a counter its LISTEN connection
bumps) when the watch says something may have changed, and every ``WATCHED_CHECK`` seconds
anyway (without a watch: every ``CHANGE_CHECK`` seconds), until the next delayed task or
expiring lease of its queues is due, or the poll interval passes, or a signal or a finished
slot wakes it. So an idle worker costs next to no CPU. A claim just answered "nothing", so a
due time already past never cuts the wait short: that would spin on the write lock.

At the poll interval it looks before it claims: one read (``ready_in``: ``NEXT_READY`` and the
clock it judged by, one statement on PostgreSQL) says whether anything of its queues is
claimable now. Nothing is: no claim (on SQLite no write lock, on PostgreSQL no transaction of
seven statements); the worker waits another interval from that look (``Look``). Something is,
or the look failed: the worker claims, as at every interval before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .outage import Outage
from .signals import Signals, Waker
from .store import CHANGE_CHECK, StoreCorrupt, StoreError, WorkerStore
from .store.dialect import SETTLE, WATCHED_CHECK, ChangeWatch


@dataclass(frozen=True, slots=True)
class Look:
    """What the look at a poll interval found: nothing claimable now. ``token``: the change
    token before it; ``due_in``: seconds from ``at`` (monotonic) until something may be (None:
    nothing pending). The next wait starts from it instead of reading both again."""

    token: int
    due_in: float | None
    at: float


def watch_for_work(
    store: WorkerStore,
    waker: Waker,
    signals: Signals,
    *,
    deadline: float,
    queues: Sequence[str] | None,
    interrupted: Callable[[], bool],
    outage: Outage,
    looked: Look | None = None,
) -> Look | None:
    """Return at ``deadline`` (monotonic), when another connection made work claimable, or
    when a signal or ``interrupted()`` (a slot finished, the worker must exit) says so: None
    (claim now). At ``deadline`` it looks first: nothing claimable, it returns that ``Look``
    (no claim; pass it to the next wait as ``looked``)."""
    watch = _watch(store, outage)  # (before the token: a commit between is seen either way)
    try:
        if looked is not None:
            token, due_in, at = looked.token, looked.due_in, looked.at
        else:
            token, due_in, at = store.change_token(), store.ready_in(queues), time.monotonic()
            outage.answered()
        if due_in is not None and due_in > 0:
            deadline = min(deadline, at + due_in)
    except StoreCorrupt:
        raise
    except StoreError as exc:
        outage.failed("idle check", exc)
        token = -1
    look_at = 0.0  # when the token is read even if the watch said nothing
    hot_until = 0.0  # after the watch saw a write: poll until then (the commit may not be done)
    while not signals.asked and not interrupted():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None if token == -1 else _look(store, queues, outage)
        fd = None if watch is None else watch.fileno()
        polling = fd is None or time.monotonic() < hot_until
        woke = waker.wait(min(CHANGE_CHECK if polling else WATCHED_CHECK, remaining), also=fd)
        signals.absorb(woke)
        if woke:
            return None
        if watch is not None and fd is not None:
            if watch.drain():
                hot_until = time.monotonic() + SETTLE
            elif not polling and time.monotonic() < look_at:
                continue
        look_at = time.monotonic() + WATCHED_CHECK
        try:
            current = store.change_token()
            if current != token:
                token = current
                due_in = store.ready_in(queues)
                outage.answered()
                if due_in is not None and due_in <= 0:
                    return None
                if due_in is not None:  # a new delayed task, due before the deadline
                    deadline = min(deadline, time.monotonic() + due_in)
        except StoreCorrupt:
            raise  # never waited out: the worker exits STORE_CORRUPT
        except StoreError as exc:  # the database is busy or gone: wait out the interval, then
            outage.failed("idle check", exc)  # claim; told like any part's failure (an idle
            continue  # worker's claim may come when a reconnect rides out the rest of it)
    return None


def _look(store: WorkerStore, queues: Sequence[str] | None, outage: Outage) -> Look | None:
    """The poll interval's look: None when something is claimable now (or the look failed:
    the claim tries), else what it found."""
    try:
        token = store.change_token()  # (before the read: a commit between moves it)
        due_in = store.ready_in(queues)
    except StoreCorrupt:
        raise
    except StoreError as exc:
        outage.failed("idle check", exc)
        return None
    outage.answered()
    if due_in is not None and due_in <= 0:
        return None
    return Look(token, due_in, time.monotonic())


def _watch(store: WorkerStore, outage: Outage) -> ChangeWatch | None:
    """The store's change watch, or None (poll): a store that cannot give one now (its
    database unreachable) is polled, as before."""
    try:
        return store.change_watch()
    except StoreCorrupt:
        raise
    except StoreError as exc:
        outage.failed("idle check", exc)
        return None
