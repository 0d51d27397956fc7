"""The producer side of the SQLite backend: start runs, one or many, in the store's own
transaction or inside the caller's (transactional enqueue)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from ..base import DEFAULT_QUEUE
from ..errors import InvalidPayload, StoreError
from ..newrun import NewRun
from ..types import JSON
from . import sql as q
from .dialect import SQLiteBase, translate


def insert(run: NewRun, c: sqlite3.Connection, now: float) -> int:
    """Insert the run and its first task; with a key already taken, the first run's id."""
    params = {
        "state": run.state,
        "name": run.task,
        "queue": run.queue,
        "priority": run.priority,
        "key": run.key,
        "now": now,
    }
    row = c.execute(q.INSERT_RUN, params).fetchone()
    if row is None:  # the key names a run already there: create nothing
        (run_id,) = c.execute(q.FIND_BY_KEY, {"key": run.key}).fetchone()
        return int(run_id)
    task = {"run_id": row[0], "name": run.task, "payload": run.payload}
    c.execute(q.INSERT_TASK, {**task, "now": now, "delay": run.delay})
    return int(row[0])


class SQLiteProducer(SQLiteBase):
    def start_run(
        self,
        task: str,
        payload: JSON = None,
        state: JSON = None,
        delay: float = 0,
        *,
        key: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        tx: Any = None,
    ) -> int:
        (run_id,) = self._start(
            [NewRun.make(task, payload, state, delay, key, queue, priority)], tx
        )
        return run_id

    def start_runs(self, items: Iterable[Mapping[str, Any]], *, tx: Any = None) -> list[int]:
        return self._start([NewRun.from_item(item) for item in items], tx)

    def _start(self, runs: list[NewRun], tx: Any) -> list[int]:
        if tx is None:
            return self._write(lambda c, now: [insert(r, c, now) for r in runs], role="producer")
        conn = self._callers(tx)
        now = self._clock()
        # all or nothing inside the caller's transaction: a savepoint undoes the runs already
        # inserted when a later one fails (the caller's transaction goes on either way)
        try:
            conn.execute("SAVEPOINT leasekeeper_start")
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from None
        try:
            ids = [insert(r, conn, now) for r in runs]
        except BaseException as exc:
            conn.execute("ROLLBACK TO leasekeeper_start")
            conn.execute("RELEASE leasekeeper_start")
            if isinstance(exc, sqlite3.Error):  # the caller's transaction decides what is next
                raise translate(exc, self.path) from None
            if isinstance(exc, (UnicodeEncodeError, OverflowError)):
                raise InvalidPayload(f"a value cannot be written: {exc}") from None
            raise
        conn.execute("RELEASE leasekeeper_start")
        return ids

    def _callers(self, tx: Any) -> sqlite3.Connection:
        """The caller's connection, checked: same database file, inside a transaction."""
        if not isinstance(tx, sqlite3.Connection):
            raise StoreError("tx must be the caller's sqlite3.Connection to the same database")
        try:
            files = {row[1]: row[2] for row in tx.execute("PRAGMA database_list")}
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from None
        main = files.get("main") or ""
        if not main or not os.path.exists(main) or not os.path.samefile(main, self.path):
            raise StoreError(f"tx is connected to {main or 'a memory database'}, not {self.path}")
        autocommit = getattr(tx, "autocommit", None) is True or tx.isolation_level is None
        if autocommit and not tx.in_transaction:
            raise StoreError("tx is in autocommit mode: BEGIN a transaction first")
        return tx
