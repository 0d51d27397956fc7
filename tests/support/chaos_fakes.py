"""The chaos verdict's lease ttl and a store gate over a real store where work is always ready."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from supervisor_fakes import FakeGate

from workerproc.store import Store

TTL = 1.0


class StoreGate(FakeGate):
    """Work is always ready; the chaos step's sessions are the test's store."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store

    def ready_now(self, queues: object = None) -> bool:
        return True

    @contextmanager
    def session(self, **_: object) -> Iterator[Store]:
        yield self.store

    kept = session  # (the frequent looks' store: the same one here)
