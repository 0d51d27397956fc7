"""The producer side of the PostgreSQL backend: start runs, one or many, in one statement, in
the store's own transaction or inside the caller's (transactional enqueue on the caller's
psycopg connection), and wait for a run's end on LISTEN/NOTIFY."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from ..base import DEFAULT_QUEUE, check_timeout
from ..errors import RunNotFound, StoreError
from ..newrun import NewRun
from ..types import JSON, Run
from .dialect import Cursor, PostgresBase
from .listen import END
from .schema import SCHEMA_VERSION, VERSION_TABLE
from .sql import _CLOCK

# Every run of the batch in one statement. Ids are drawn from the runs' sequence in the items'
# order first, so run (and first-task) ids follow the items; a key already taken (by a run
# that exists, or by an earlier item of the same batch) inserts nothing and FIND_BY_KEYS,
# a second statement with a fresh snapshot, answers the first run's id. ``{s}``: the schema
# prefix (empty on our own connections, whose search path is the schema; the caller's
# connection gets qualified names).
START_RUNS = f"""
WITH clock AS MATERIALIZED (SELECT {_CLOCK} AS now),
i AS MATERIALIZED (
    SELECT i.*, nextval(pg_get_serial_sequence('{{s}}runs', 'id')) AS id
    FROM unnest(%(states)s::text[], %(tasks)s::text[], %(payloads)s::text[],
                %(delays)s::float8[], %(keys)s::text[], %(queues)s::text[],
                %(priorities)s::int[])
         WITH ORDINALITY AS i(state, task, payload, delay, key, queue, priority, n)
    ORDER BY i.n),
new_runs AS (
    INSERT INTO {{s}}runs (id, state, task, queue, priority, key, created_at, updated_at)
    SELECT i.id, i.state::json, i.task, i.queue, i.priority, i.key, clock.now, clock.now
    FROM i, clock ORDER BY i.n
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING RETURNING id),
first_tasks AS (
    INSERT INTO {{s}}tasks (run_id, name, payload, available_at, created_at)
    SELECT i.id, i.task, i.payload::json, clock.now + i.delay, clock.now
    FROM i JOIN new_runs USING (id), clock ORDER BY i.n)
SELECT i.id, new_runs.id IS NOT NULL FROM i LEFT JOIN new_runs USING (id) ORDER BY i.n"""
FIND_BY_KEYS = "SELECT key, id FROM {s}runs WHERE key = ANY(%(keys)s::text[])"
# the caller's connection reaches our schema, at our version, in our database
CALLERS_DATABASE = f"""SELECT current_database(),
    (SELECT max(version) FROM {{s}}{VERSION_TABLE})"""
# wait(): from now on, this run's end sends a NOTIFY on the end channel
WATCH_RUN = "UPDATE runs SET watched = true WHERE id = %(run_id)s AND NOT watched"


class PostgresProducer(PostgresBase):
    _database: str | None = None

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
        if not runs:
            return []
        if tx is None:
            return self._write(lambda c, now: self._insert(c, runs, now, ""))
        conn = self._callers(tx)
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                return self._insert(cur, runs, self._now_param(), f'"{self.schema}".')
        except psycopg.Error as exc:  # the caller's transaction decides what happens next
            raise StoreError(f"{self.where}: {str(exc).strip()}") from None

    @staticmethod
    def _insert(c: Cursor, runs: list[NewRun], now: float | None, schema: str) -> list[int]:
        params = {
            "states": [r.state for r in runs],
            "tasks": [r.task for r in runs],
            "payloads": [r.payload for r in runs],
            "delays": [r.delay for r in runs],
            "keys": [r.key for r in runs],
            "queues": [r.queue for r in runs],
            "priorities": [r.priority for r in runs],
            "now": now,
        }
        rows = c.execute(START_RUNS.format(s=schema), params).fetchall()
        ids = [int(run_id) for run_id, _ in rows]
        taken = [i for i, (_, inserted) in enumerate(rows) if not inserted]
        if taken:  # keys that name a run already there: the first run's id, nothing created
            keys = [runs[i].key for i in taken]
            found = dict(c.execute(FIND_BY_KEYS.format(s=schema), {"keys": keys}).fetchall())
            for i in taken:
                if runs[i].key not in found:
                    raise StoreError(f"{runs[i].key!r}: a run with this key was not found")
                ids[i] = int(found[runs[i].key])
        return ids

    def _callers(self, tx: Any) -> psycopg.Connection[Any]:
        """The caller's connection, checked: a psycopg connection to our database and schema,
        inside a transaction (or about to begin one with its first statement)."""
        if not isinstance(tx, psycopg.Connection):
            raise StoreError("tx must be the caller's psycopg.Connection to the same database")
        status = tx.info.transaction_status
        if status == TransactionStatus.INERROR:
            raise StoreError("tx's transaction has failed: roll it back first")
        if status == TransactionStatus.IDLE and tx.autocommit:
            raise StoreError(
                "tx is in autocommit mode: begin a transaction first (with tx.transaction())"
            )
        if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
            raise StoreError("tx is busy or closed: pass a connection between statements")
        try:
            with tx.cursor(row_factory=tuple_row) as cur:
                found = cur.execute("SELECT current_database(), to_regclass(%s) IS NOT NULL",
                                    (f'"{self.schema}".{VERSION_TABLE}',)).fetchone()  # fmt: skip
                assert found is not None
                database, ours = found
                if database == self._our_database() and ours:
                    row = cur.execute(CALLERS_DATABASE.format(s=f'"{self.schema}".')).fetchone()
                    ours = row is not None and row[1] == SCHEMA_VERSION
        except psycopg.Error as exc:
            raise StoreError(f"tx cannot be used: {str(exc).strip()}") from None
        if database != self._our_database() or not ours:
            raise StoreError(
                f"tx is connected to database {database!r}, not to {self.where} "
                f"(schema {self.schema})"
            )
        return tx

    def _our_database(self) -> str:
        if self._database is None:
            row = self._read(lambda c, _now: c.execute("SELECT current_database()").fetchone())
            assert row is not None
            self._database = str(row[0])
        return self._database

    # -- waiting -------------------------------------------------------------------------------
    get_run: Any  # PostgresReads

    def wait(self, run_id: int, timeout: float | None = None) -> Run:
        """As ``Store.wait``, asleep on the end channel: the run is marked watched first, so its
        end sends a NOTIFY (unwatched runs end without one)."""
        timeout = check_timeout(timeout)
        self._alive()
        run: Run | None = self.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.terminal:
            return run
        self._listener.token(END)  # LISTEN before the mark: no end can slip between
        self._write(lambda c, _now: c.execute(WATCH_RUN, {"run_id": run_id}), single=True)
        return self._wait_on(run_id, timeout)

    def _wait_on(self, run_id: int, timeout: float | None) -> Run:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            token = self._listener.token(END)
            run: Run | None = self.get_run(run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.terminal:
                return run
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run {run_id} is still {run.status} after {timeout:g} s")
            self._listener.wait(token, min(left, 3600.0), END)
