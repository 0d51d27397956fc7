"""Backends the store test suites run against: one entry in BACKENDS per backend.

A backend knows how to open a store on a fresh database and offers the two things a protocol
test cannot do through the Store interface: put a second pending task into one run (the API
keeps one pending task per run, yet the serial-run rule must hold for many), and hold the write
lock from another connection (to show "now" is read only after the lock is taken).
"""

from __future__ import annotations

import abc
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pg_session
import psycopg

from workerproc.store import (
    CasResult,
    ClaimRequest,
    Clock,
    Commit,
    CommitOutcome,
    Lease,
    Store,
    open_store,
)
from workerproc.store.dialect import Tx
from workerproc.store.protocol.failures import fail_run as protocol_fail_run
from workerproc.store.protocol.operators import status
from workerproc.store.types import JSON


class Backend(abc.ABC):
    name: str

    @abc.abstractmethod
    def open(self, clock: Clock | None = None) -> Store:
        """A store on this backend's database (the same database on every call)."""

    @abc.abstractmethod
    def add_task(self, run_id: int, name: str, available_at: float, created_at: float) -> int:
        """Insert one more pending task into ``run_id`` and return its id."""

    @abc.abstractmethod
    @contextmanager
    def hold_write_lock(self) -> Iterator[None]:
        """Hold the database's write lock from another connection while the block runs."""

    @abc.abstractmethod
    def write_json(self, table: str, column: str, run_id: int, text: str) -> None:
        """Write ``text`` into a JSON column of ``table`` (``runs`` or ``tasks``) for one run,
        behind the store's back (what an old version or a hand edit might have left)."""

    @abc.abstractmethod
    def tamper(self, sql: str) -> None:
        """Run ``sql`` (no parameters) behind the store's back: what an older version's bug or
        a hand edit might have left in the database."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """What another process passes to ``open_store`` to reach this database."""

    @abc.abstractmethod
    def app_connection(self) -> Any:
        """An application's own DB-API connection to this database, as a caller of
        transactional enqueue holds it (a ``sqlite3.Connection`` here), outside any
        transaction."""

    @abc.abstractmethod
    def app_table(self, conn: Any) -> None:
        """Create the application's own table ``orders(id INTEGER PRIMARY KEY, item TEXT)``
        on ``conn`` (committed), for the transactional enqueue tests."""


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "protocol.db")

    def open(self, clock: Clock | None = None) -> Store:
        return open_store(self.path, clock=clock)

    def add_task(self, run_id: int, name: str, available_at: float, created_at: float) -> int:
        with sqlite3.connect(self.path, isolation_level=None) as conn:
            cur = conn.execute(
                "INSERT INTO tasks (run_id, name, available_at, created_at) VALUES (?, ?, ?, ?)",
                (run_id, name, available_at, created_at),
            )
            assert cur.lastrowid is not None
            task_id = cur.lastrowid
        conn.close()
        return task_id

    @contextmanager
    def hold_write_lock(self) -> Iterator[None]:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    def write_json(self, table: str, column: str, run_id: int, text: str) -> None:
        key = "id" if table == "runs" else "run_id"
        with sqlite3.connect(self.path) as conn:
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (text, run_id))
        conn.close()

    def tamper(self, sql: str) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute(sql)
        conn.close()

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def app_connection(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)  # Python's default: implicit BEGIN on DML

    def app_table(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
        conn.commit()


class PostgresBackend(Backend):
    """A fresh schema on this pytest session's database (see pg_session)."""

    name = "postgres"

    def __init__(self, directory: str) -> None:
        self._url = pg_session.schema_url()
        self.schema = self._url.rsplit("schema=", 1)[1]

    @property
    def url(self) -> str:
        return self._url

    def open(self, clock: Clock | None = None) -> Store:
        return open_store(self.url, clock=clock)

    def connect(self) -> Any:
        conn = psycopg.connect(pg_session.database_url(), autocommit=True)
        conn.execute(f"SET search_path = {self.schema}")
        return conn

    def add_task(self, run_id: int, name: str, available_at: float, created_at: float) -> int:
        """A task written by hand, as the schema asks of it since v3: in the same transaction
        as the run's head columns (the store's own statements set them; no trigger does)."""
        with self.connect() as conn, conn.transaction():
            conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (run_id,))
            row = conn.execute(
                "INSERT INTO tasks (run_id, name, available_at, created_at) "
                "VALUES (%s, %s, %s, %s) RETURNING id",
                (run_id, name, available_at, created_at),
            ).fetchone()
            conn.execute(
                "UPDATE runs SET (head_at, head_created, head_id) = (SELECT available_at, "
                "created_at, id FROM tasks WHERE run_id = runs.id AND done_at IS NULL "
                "ORDER BY available_at, created_at, id LIMIT 1) "
                "WHERE id = %s AND status = 'pending'",
                (run_id,),
            )
        assert row is not None
        return int(row[0])

    def write_json(self, table: str, column: str, run_id: int, text: str) -> None:
        key = "id" if table == "runs" else "run_id"
        with self.connect() as conn:
            conn.execute(f"UPDATE {table} SET {column} = %s::json WHERE {key} = %s", (text, run_id))

    def tamper(self, sql: str) -> None:
        with self.connect() as conn:
            conn.execute(sql)

    @contextmanager
    def hold_write_lock(self) -> Iterator[None]:
        """Block every write (EXCLUSIVE allows plain reads only) until the block ends."""
        with self.connect() as conn, conn.transaction():
            conn.execute("LOCK TABLE runs, tasks IN EXCLUSIVE MODE")
            yield

    def app_connection(self) -> psycopg.Connection[Any]:
        """psycopg's default: a transaction begins with the first statement. The application
        keeps its tables in its own schema: nothing of ours is on its search path."""
        conn = psycopg.connect(pg_session.database_url(), autocommit=True)
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}_app")
        conn.close()
        return psycopg.connect(
            pg_session.database_url(), options=f"-c search_path={self.schema}_app"
        )

    def app_table(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, item text)")
        conn.commit()


class PgBouncerBackend(PostgresBackend):
    """A fresh schema, reached through a PgBouncer in transaction mode (``pgbouncer.running``):
    the store keeps nothing in a session. What the tests do behind the store's back goes
    straight to the server."""

    name = "pgbouncer"

    def __init__(self, directory: str, bouncer_url: Callable[[str], str]) -> None:
        super().__init__(directory)
        self._url = bouncer_url(self._url)


BACKENDS: dict[str, Callable[[str], Backend]] = {
    "sqlite": SQLiteBackend,
    "postgres": PostgresBackend,
}


# -- helpers the protocol suites share ----------------------------------------------------------
TTL = 60.0


def claim(s: Store, owner: str = "w1", ttl: float = TTL, **kw: int) -> Lease:
    """Claim, asserting there was something to claim."""
    lease = s.claim(owner, ttl, **kw)
    assert lease is not None, "expected a claimable task"
    return lease


def snapshot(s: Store, *run_ids: int) -> list[object]:
    """Everything the store says about ``run_ids``: to show that nothing changed."""
    return [(s.get_run(r), s.get_tasks(r)) for r in run_ids]


# -- calls the product has no caller for, written over what it has ------------------------------
def commit(s: Store, last_word: Commit, *, claim: ClaimRequest | None = None) -> CommitOutcome:
    """One commit under its lease and, in the same transaction, the next claim."""
    out = s.commit_many((last_word,), claim=claim)
    return CommitOutcome(out.results[0], out.leases[0] if out.leases else None)


def advance(
    s: Store,
    lease: Lease,
    expected_revision: int,
    new_state: JSON,
    next_task: str,
    payload: JSON = None,
    delay: float = 0,
) -> CasResult:
    step = Commit(lease, "advance", expected_revision=expected_revision, new_state=new_state,
                  next_task=next_task, next_payload=payload, delay=delay)  # fmt: skip
    return commit(s, step).result


def finish(
    s: Store, lease: Lease, expected_revision: int, new_state: JSON, result: JSON = None
) -> CasResult:
    step = Commit(lease, "finish", expected_revision=expected_revision, new_state=new_state,
                  result=result)  # fmt: skip
    return commit(s, step).result


def renew_until(s: Store, lease: Lease, ttl: float) -> float | None:
    """Renew one lease: its new expiry, or None when it is lost or expired."""
    return s.renew_many([lease], ttl)[0]


def fail_run(s: Store, run_id: int, reason: str, error: str | None = None) -> bool:
    """An operator's fail of a live run (the store ends it as it cancels one, and counts it)."""

    def end(tx: Tx) -> bool:
        _, queue = status(tx, run_id)
        return protocol_fail_run(tx, run_id, queue, reason, error) == 1

    return s.dialect.write(end, runs=[run_id])
