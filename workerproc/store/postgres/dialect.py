"""PostgreSQL plumbing: one connection per thread (and per process after fork), prepared
statements, reconnection with backoff, transactions, migrations under an advisory lock, and the
LISTEN connection (``postgres_listen``) that makes ``change_token`` free and ``wait_change`` a
sleep. Connections are in autocommit mode: a read is one round trip; a write is an explicit
transaction (a renewal, one idempotent statement, runs on its own).

Failures: a connection that dies before our COMMIT was sent lost nothing (the server rolls the
transaction back), so the transaction is retried once on a new connection; one that dies while
committing is ambiguous and raises ``StoreUnavailable`` (the caller's fence makes a retry safe).
A deadlock or serialization failure is retried; a lock wait past ``busy_timeout`` raises
``StoreUnavailable``.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from ..base import Clock
from ..errors import InvalidPayload, SchemaTooNew, StoreCorrupt, StoreError, StoreUnavailable
from ..urls import redact, split_query
from .listen import END, WORK, Listener, _abandoned
from .schema import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE
from .sql import END_CHANNEL, LOCK_RUNS, NOTIFY_CHANNEL, NOW_QUERY

T = TypeVar("T")
Params = dict[str, Any]
Cursor = psycopg.Cursor[Any]

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_SCHEMA = "leasekeeper"
# A frozen process (SIGSTOP, a debugger, a frozen VM) inside one of our transactions must not
# hold a run's row lock for long: the server ends such a session (and rolls its transaction
# back). Our transactions never wait on user code, so the bound can be tight: a worker asks for
# a quarter of its lease ttl (``idle_in_transaction``; runner.run_worker), so a run locked by a
# stopped exchange is free again long before its lease could be taken over.
IDLE_IN_TRANSACTION = 5.0
_OUR_OPTIONS = ("schema", "busy_timeout", "idle_in_transaction")
# at most 40 characters: the notification channels ("leasekeeper.<schema>.end") must stay
# within PostgreSQL's 63-byte identifiers
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_RETRIES = 5  # deadlocks, serialization failures, one lost connection
_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 1.0


def _unavailable(exc: BaseException, where: str) -> StoreUnavailable:
    return StoreUnavailable(f"{where}: {str(exc).strip() or type(exc).__name__}")


class PostgresBase:
    """Connections, transactions and migrations for the PostgreSQL store."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        busy_timeout: float | str = DEFAULT_BUSY_TIMEOUT,
        schema: str | None = None,
        migrate: bool = True,
        idle_in_transaction: float | str = IDLE_IN_TRANSACTION,
    ) -> None:
        conninfo, ours = split_query(url, _OUR_OPTIONS)
        schema = schema or ours.get("schema") or DEFAULT_SCHEMA
        if not _SCHEMA_NAME.fullmatch(schema):
            raise StoreError(f"schema must match {_SCHEMA_NAME.pattern} (got {schema!r})")
        try:
            timeout = float(ours.get("busy_timeout", busy_timeout))
        except ValueError:
            raise StoreError("busy_timeout must be a number of seconds") from None
        if not 0 < timeout <= 3600:
            raise StoreError("busy_timeout must be above 0 and at most 3600 seconds")
        try:
            idle = float(ours.get("idle_in_transaction", idle_in_transaction))
        except ValueError:
            raise StoreError("idle_in_transaction must be a number of seconds") from None
        if not 0.01 <= idle <= 3600:
            raise StoreError("idle_in_transaction must be from 0.01 to 3600 seconds")
        self.idle_in_transaction = idle
        self.conninfo = conninfo
        self.schema = schema
        self.busy_timeout = timeout
        # the URL this store reports opens the same database and schema again
        parts = urlsplit(conninfo)
        query = "&".join(q for q in (parts.query, urlencode({"schema": schema})) if q)
        self.url = urlunsplit(parts._replace(query=query))
        self.where = redact(self.url)
        self._clock = clock
        self._local = threading.local()
        self._pid = os.getpid()
        self._closed = False
        self._listener = Listener(
            conninfo,
            {WORK: NOTIFY_CHANNEL.format(schema=schema), END: END_CHANNEL.format(schema=schema)},
        )
        self._migrate(create=migrate)

    # -- connections ---------------------------------------------------------------------------
    def _conn(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError("the store is closed")
        if self._pid != os.getpid():  # a forked child: never touch inherited connections
            old = getattr(self._local, "conn", None)
            if old is not None:
                _abandoned.append(old)
            self._listener.abandon()
            self._local = threading.local()
            self._pid = os.getpid()
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and conn.broken:
            conn.close()
            conn = None
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def _connect(self) -> psycopg.Connection[Any]:
        """Connect, retrying with backoff until busy_timeout (a restarting server, say)."""
        deadline = time.monotonic() + self.busy_timeout
        backoff = _BACKOFF_MIN
        while True:
            try:
                conn = psycopg.connect(
                    self.conninfo,
                    autocommit=True,  # transactions are explicit (see _run)
                    prepare_threshold=0,  # every statement is prepared on first use
                    connect_timeout=max(2, int(self.busy_timeout + 0.999)),
                    application_name="leasekeeper",
                    options=(
                        f"-c search_path={self.schema}"
                        f" -c lock_timeout={int(self.busy_timeout * 1000)}"
                        f" -c idle_in_transaction_session_timeout="
                        f"{max(10, int(self.idle_in_transaction * 1000))}"
                    ),
                )
                return conn
            except psycopg.OperationalError as exc:
                if time.monotonic() + backoff >= deadline:
                    raise _unavailable(exc, f"{self.where}: cannot connect") from None
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, _BACKOFF_MAX)
            except psycopg.Error as exc:
                raise StoreError(f"{self.where}: {exc}") from None

    # -- transactions --------------------------------------------------------------------------
    def _now_param(self) -> float | None:
        return None if self._clock is None else self._clock()

    def _write(
        self,
        fn: Callable[[Cursor, float | None], T],
        *,
        runs: Sequence[int] = (),
        single: bool = False,
    ) -> T:
        """One transaction: ``fn(cursor, now)`` where ``now`` is the injected clock or None
        (the statements read the database clock themselves, after their locks). ``runs``: the
        runs the transaction will write, locked first in id order when there are several (two
        batches never wait on each other in a cycle) or when the injected clock must be read
        after the lock. ``single``: ``fn`` sends one idempotent statement that locks what it
        needs itself (a renewal), so without an injected clock it runs on its own
        (autocommit: no BEGIN, no COMMIT round trip; a lost connection retries it)."""
        if single and self._clock is None:
            return self._transaction(fn, (), "statement")
        ids = sorted(set(runs))
        lock = ids if len(ids) > 1 or (ids and self._clock is not None) else []
        return self._transaction(fn, lock, "write")

    def _read(self, fn: Callable[[Cursor, float | None], T], *, snapshot: bool = False) -> T:
        """Reads: each statement on its own (autocommit: one round trip), or with ``snapshot``
        all of them in one REPEATABLE READ transaction."""
        return self._transaction(fn, (), "snapshot" if snapshot else "read")

    def _transaction(
        self, fn: Callable[[Cursor, float | None], T], lock: Sequence[int], mode: str
    ) -> T:
        attempt = 0
        while True:
            attempt += 1
            conn = self._conn()
            done = False  # fn returned: an error now comes from COMMIT (ambiguous)
            try:
                if mode in ("read", "statement"):
                    with conn.cursor() as cur:
                        result = fn(cur, self._now_param())
                        done = True
                        return result
                with conn.transaction(), conn.cursor() as cur:
                    if mode == "snapshot":
                        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    if lock:
                        cur.execute(LOCK_RUNS, {"run_ids": lock}, prepare=True)
                    result = fn(cur, self._now_param())
                    done = True
                return result
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt >= _RETRIES:
                    raise _unavailable(exc, self.where) from None
                time.sleep(random.uniform(0.001, 0.01) * attempt)
            except pg_errors.LockNotAvailable as exc:
                msg = f"{self.where}: a lock was held past {self.busy_timeout:g} s ({exc})"
                raise StoreUnavailable(msg) from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if (done and mode != "read") or attempt >= 2 or not conn.broken:
                    raise _unavailable(exc, self.where) from None
                # the server never saw our COMMIT: nothing was written; try a new connection
            except psycopg.DataError as exc:  # a value PostgreSQL cannot take (NUL in text)
                raise InvalidPayload(f"a value cannot be written: {str(exc).strip()}") from None
            except psycopg.Error as exc:
                raise StoreError(f"{self.where}: {str(exc).strip()}") from None

    # -- migrations ----------------------------------------------------------------------------
    def _version(self, cur: Cursor) -> int:
        cur.execute("SELECT to_regclass(%s)", (f"{self.schema}.{VERSION_TABLE}",))
        row = cur.fetchone()
        if row is None or row[0] is None:
            cur.execute("SELECT to_regclass(%s)", (f"{self.schema}.runs",))
            found = cur.fetchone()
            if found is not None and found[0] is not None:
                raise StoreCorrupt(
                    f"{self.where}: schema {self.schema} has a runs table that is not "
                    "leasekeeper's (no version table)"
                )
            return 0
        cur.execute(sql.SQL("SELECT max(version) FROM {}").format(sql.Identifier(VERSION_TABLE)))
        got = cur.fetchone()
        return int(got[0]) if got is not None and got[0] is not None else 0

    def _migrate(self, *, create: bool) -> None:
        def check(cur: Cursor, _now: float | None) -> int:
            return self._version(cur)

        version = self._read(check)
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"{self.where}: schema v{version} is newer than this leasekeeper")
        if not create:
            raise StoreError(
                f"{self.where}: no leasekeeper schema {self.schema!r} at v{SCHEMA_VERSION} "
                f"(found v{version}); `supervisor start` or `enqueue` creates it"
            )
        self._write(self._migrate_locked)

    def _migrate_locked(self, cur: Cursor, _now: float | None) -> None:
        # Two hosts starting at once: the second waits here, then finds nothing left to do.
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"leasekeeper:{self.schema}",))
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        version = self._version(cur)
        if version == 0:
            cur.execute(
                sql.SQL(
                    "CREATE TABLE {} (version integer PRIMARY KEY,"
                    " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
                ).format(sql.Identifier(VERSION_TABLE))
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            cur.execute(MIGRATIONS[target - 1].encode(), prepare=False)  # a script: no parameters
            cur.execute(
                sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(
                    sql.Identifier(VERSION_TABLE)
                ),
                (target,),
            )

    # -- time, notifications, closing ----------------------------------------------------------
    def now(self) -> float:
        if self._clock is not None:
            return self._clock()

        def read(cur: Cursor, now: float | None) -> float:
            cur.execute(NOW_QUERY, {"now": now}, prepare=True)
            row = cur.fetchone()
            assert row is not None
            return float(row[0])

        return self._read(read)

    def change_token(self) -> int:
        self._alive()
        return self._listener.token()

    def wait_change(self, token: int, timeout: float) -> int:
        """Sleep on LISTEN until a notification moves the token, or ``timeout`` passes."""
        self._alive()
        return self._listener.wait(token, max(0.0, timeout))

    def _alive(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
        if self._pid != os.getpid():
            self._conn()  # resets per-process state (the listener too)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if self._pid == os.getpid():
            if conn is not None:
                conn.close()
            self._listener.close()
        self._local = threading.local()
        self._closed = True
