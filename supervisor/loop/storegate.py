"""The supervisor's only way to the database: a short-lived store per step, or the one kept
store of the looks that come often.

The parent must hold no connection when it forks (an SQLite handle carried across ``fork()``
corrupts databases; a PostgreSQL socket shared with a child mixes two sessions' messages), so
every use opens a store, does one thing and closes it; ``open_count`` lets the fork path assert
that nothing is open. The looks the loop takes often (the progress watch's each second while
the pool is idle, the drain's after each commit) share one store instead (``kept``): opening one
costs about a millisecond of CPU on SQLite and a new server process on PostgreSQL, the look
itself microseconds. ``before_fork`` closes it first.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence

from workerproc.identity import owner_is_dead
from workerproc.store import (
    DEFAULT_BUSY_TIMEOUT,
    Operator,
    Stats,
    StoreCorrupt,
    StoreUnavailable,
    open_store,
    sqlite_file,
)

from ..errors import SupervisorError
from .pinned import PinnedFile

# Inside the loop a step must not block on the write lock for long: signals, reaping, chaos
# resumes and the watchdog wait behind it. A step that finds the database busy (a backup, a
# writer paused inside a transaction) gives up quickly and retries on a later turn.
LOOP_BUSY_TIMEOUT = 0.5


def db_file(db: str) -> str | None:
    """The file behind a path or SQLite URL (None for PostgreSQL): the store's own parser."""
    return sqlite_file(db)


class StoreGate:
    def __init__(self, db: str, busy_timeout: float = LOOP_BUSY_TIMEOUT) -> None:
        self.db = db
        self.busy_timeout = busy_timeout
        self.open_count = 0
        self.file = db_file(db)
        self.pinned = PinnedFile(self.file)  # the file we serve, once pinned
        self.corrupt: str | None = None  # the first "malformed" any session met
        self._kept: Operator | None = None  # the looks' store (``kept``), None when closed

    def pin(self) -> None:
        """Remember which file the path names now: from here on it must stay that file."""
        self.pinned.pin()

    def file_problem(self) -> str | None:
        """Why the path no longer names the database we opened (deleted, replaced); None if it
        still does. One ``stat``: cheap enough for every turn of the loop."""
        return self.pinned.problem("the pool")

    @contextlib.contextmanager
    def session(self, busy_timeout: float | None = None) -> Iterator[Operator]:
        problem = self.file_problem()
        if problem:  # never open (and so never create) whatever the path names now
            raise StoreUnavailable(problem)
        timeout = self.busy_timeout if busy_timeout is None else busy_timeout
        try:
            store = open_store(self.db, busy_timeout=timeout)
        except StoreCorrupt as exc:
            self.corrupt = self.corrupt or str(exc)
            raise
        self.open_count += 1
        try:
            yield store
        except StoreCorrupt as exc:
            self.corrupt = self.corrupt or str(exc)
            raise
        finally:
            self.open_count -= 1
            store.close()

    @contextlib.contextmanager
    def kept(self) -> Iterator[Operator]:
        """The store the frequent looks share, opened at its first use and kept open until
        ``close_kept`` (before every fork: ``before_fork``). Like ``session`` it never opens
        a path that no longer names the pinned file, and an error closes it: the next look
        opens a fresh one."""
        problem = self.file_problem()
        if problem:
            self.close_kept()
            raise StoreUnavailable(problem)
        try:
            store = self._kept
            if store is None:
                store = self._kept = open_store(self.db, busy_timeout=self.busy_timeout)
            yield store
        except StoreCorrupt as exc:
            self.corrupt = self.corrupt or str(exc)
            self.close_kept()
            raise
        except BaseException:
            self.close_kept()
            raise

    def close_kept(self) -> None:
        store, self._kept = self._kept, None
        if store is not None:
            with contextlib.suppress(Exception):  # (closing what failed may fail too)
                store.close()

    def before_fork(self) -> None:
        """No connection may cross a fork: the kept store closes, and no session is open."""
        self.close_kept()
        self.assert_closed()

    def assert_closed(self) -> None:
        if self.open_count or self._kept is not None:
            raise SupervisorError("refusing to fork with a database connection open")

    def release_owners(self, owners: list[str]) -> dict[str, int]:
        """Expire the leases of dead owners; return how many each held."""
        with self.session() as store:
            return {owner: store.release_owner(owner) for owner in owners}

    def quick_check(self) -> list[str]:
        """The store's quick integrity check (every page read once), before any fork."""
        try:
            with self.session(busy_timeout=DEFAULT_BUSY_TIMEOUT) as store:
                return store.check_integrity(quick=True, limit=10)
        except StoreCorrupt as exc:  # too damaged to open
            return [str(exc)]

    def ready_now(self, queues: Sequence[str] | None = None) -> bool:
        """Is some task of ``queues`` (None: any) claimable right now? One index lookup per
        queue, no write, on the kept store (the progress watch asks each second)."""
        with self.kept() as store:
            due_in = store.ready_in(queues)
            return due_in is not None and due_in <= 0

    def lease_counts(self, owners: list[str]) -> dict[str, int]:
        """How many live leases each owner holds; nothing is written."""
        with self.session() as store:
            stats = store.stats()
        held = Counter(lease.owner for lease in stats.leases if lease.expires_at > stats.now)
        return {owner: held.get(owner, 0) for owner in owners}

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
