"""How a worker with free slots waits for work without touching the write lock (R7).

It reads the database's cheap change token (SQLite: ``PRAGMA data_version``; PostgreSQL: a
counter its LISTEN connection bumps) every ``CHANGE_CHECK`` seconds (the store declares it), and
sleeps until the next delayed task or expiring lease of its queues is due, or the poll interval
passes, or a signal or a finished slot wakes it. A claim just answered "nothing", so a due time
already past never cuts the wait short: that would spin on the write lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .outage import Outage
from .signals import Signals, Waker
from .store import CHANGE_CHECK, StoreCorrupt, StoreError, WorkerStore


def watch_for_work(
    store: WorkerStore,
    waker: Waker,
    signals: Signals,
    *,
    deadline: float,
    queues: Sequence[str] | None,
    interrupted: Callable[[], bool],
    outage: Outage,
) -> None:
    """Return at ``deadline`` (monotonic), when another connection made work claimable, or
    when a signal or ``interrupted()`` (a slot finished, the worker must exit) says so."""
    try:
        token = store.change_token()
        due = store.next_ready_at(queues)
        if due is not None and (wait := due - store.now()) > 0:
            deadline = min(deadline, time.monotonic() + wait)
    except StoreCorrupt:
        raise
    except StoreError as exc:
        outage.failed("idle check", exc)
        token = -1
    while not signals.asked and not interrupted():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        woke = waker.wait(min(CHANGE_CHECK, remaining))
        signals.absorb(woke)
        if woke:
            return
        try:
            current = store.change_token()
            if current != token:
                token = current
                due = store.next_ready_at(queues)
                if due is not None and due <= store.now():
                    return
        except StoreCorrupt:
            raise  # never waited out: the worker exits STORE_CORRUPT
        except StoreError:
            continue  # the database is busy or gone: wait out the interval, then claim
