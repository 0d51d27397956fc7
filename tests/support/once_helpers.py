"""A lease and a task context for the tests of once-only (paid) calls."""

from __future__ import annotations

import threading

from workerproc.context import TaskContext
from workerproc.once import CallBook
from workerproc.store import Lease, Store

TTL = 30.0


def claim(s: Store, owner: str) -> Lease:
    lease = s.claim(owner, TTL)
    assert lease is not None
    return lease


def ctx_of(lease: Lease, book: CallBook) -> TaskContext:
    return TaskContext(lease, threading.Event(), calls=book)
