"""The supervisor's only way to the database: a short-lived store per step.

The parent must hold no connection when it forks (an SQLite handle carried across ``fork()``
corrupts databases; a PostgreSQL socket shared with a child mixes two sessions' messages), so
every use opens a store, does one thing and closes it. ``open_count``
lets the fork path assert that nothing is open.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from workerproc.identity import owner_is_dead
from workerproc.store import Stats, Store, open_store
from workerproc.store.sqlite_base import DEFAULT_BUSY_TIMEOUT

from ..errors import SupervisorError

# Inside the loop a step must not block on the write lock for long: signals, reaping, chaos
# resumes and the watchdog wait behind it. A step that finds the database busy (a backup, a
# writer paused inside a transaction) gives up quickly and retries on a later turn.
LOOP_BUSY_TIMEOUT = 0.5


class StoreGate:
    def __init__(self, db: str, busy_timeout: float = LOOP_BUSY_TIMEOUT) -> None:
        self.db = db
        self.busy_timeout = busy_timeout
        self.open_count = 0

    @contextlib.contextmanager
    def session(self, busy_timeout: float | None = None) -> Iterator[Store]:
        timeout = self.busy_timeout if busy_timeout is None else busy_timeout
        store = open_store(self.db, busy_timeout=timeout)
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
        """Leases of owners on this host whose process is gone (a restarted supervisor).
        Owners of other hosts (one PostgreSQL database, many hosts) are never judged from
        here. Runs once at start-up, before any fork: it may wait the store's full busy
        timeout."""
        with self.session(busy_timeout=DEFAULT_BUSY_TIMEOUT) as store:
            owners = sorted({lease.owner for lease in store.stats().leases})
            dead = [o for o in owners if owner_is_dead(o)]
            released = {owner: store.release_owner(owner) for owner in dead}
        return {o: n for o, n in released.items() if n}

    def stats(self) -> Stats:
        with self.session() as store:
            return store.stats()
