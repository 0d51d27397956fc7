"""The supervisor's only way to the database: a short-lived store per step.

The parent must hold no connection when it forks (an SQLite handle carried across ``fork()``
corrupts databases), so every use opens a store, does one thing and closes it. ``open_count``
lets the fork path assert that nothing is open.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from workerproc.identity import owner_is_dead
from workerproc.store import Stats, Store, open_store

from .errors import SupervisorError


class StoreGate:
    def __init__(self, db: str) -> None:
        self.db = db
        self.open_count = 0

    @contextlib.contextmanager
    def session(self) -> Iterator[Store]:
        store = open_store(self.db)
        self.open_count += 1
        try:
            yield store
        finally:
            self.open_count -= 1
            store.close()

    def assert_closed(self) -> None:
        if self.open_count:
            raise SupervisorError("refusing to fork with a database connection open")

    def release_owners(self, owners: list[str]) -> dict[str, int]:
        """Expire the leases of dead owners; return how many each held."""
        with self.session() as store:
            return {owner: store.release_owner(owner) for owner in owners}

    def release_dead_owners(self) -> dict[str, int]:
        """Leases of owners on this host whose process is gone (a restarted supervisor)."""
        with self.session() as store:
            owners = sorted({lease.owner for lease in store.stats().leases})
            dead = [o for o in owners if owner_is_dead(o)]
            released = {owner: store.release_owner(owner) for owner in dead}
        return {o: n for o, n in released.items() if n}

    def stats(self) -> Stats:
        with self.session() as store:
            return store.stats()
