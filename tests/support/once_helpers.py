"""A lease, a task context and the calls' book for the tests of once-only (paid) calls."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from helpers import FakeClock
from store_backends import Backend

from workerproc.context import TaskContext
from workerproc.once import CallBook
from workerproc.store import Lease, Store

TTL = 30.0
REQ = {"model": "m", "prompt": "hello"}


@pytest.fixture
def book(backend: Backend, clock: FakeClock) -> Iterator[CallBook]:
    """The calls' book of a test's backend, closed after it."""
    calls = CallBook(lambda: backend.open(clock))
    yield calls
    calls.close()


def claim(s: Store, owner: str) -> Lease:
    lease = s.claim(owner, TTL)
    assert lease is not None
    return lease


def ctx_of(lease: Lease, book: CallBook) -> TaskContext:
    return TaskContext(lease, threading.Event(), calls=book)


class Bill:
    """A paid API: counts every call it answers."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, object]:
        self.calls += 1
        return {"text": f"answer {self.calls}"}
