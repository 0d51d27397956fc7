"""PostgreSQL plumbing: one connection per thread (and per process after fork), prepared
statements, reconnection with backoff, transactions, migrations under an advisory lock, and the
LISTEN connection that makes ``change_token`` free. Connections are in autocommit mode: a read
is one round trip; a write is an explicit transaction.

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
import select
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql
from psycopg.conninfo import make_conninfo

from .base import Clock
from .errors import SchemaTooNew, StoreCorrupt, StoreError, StoreUnavailable
from .postgres_schema import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE
from .postgres_sql import LOCK_RUN, NOTIFY_CHANNEL, NOW_QUERY
from .urls import redact, split_query

T = TypeVar("T")
Params = dict[str, Any]
Cursor = psycopg.Cursor[Any]

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_SCHEMA = "leasekeeper"
# A frozen process (SIGSTOP, a debugger) inside one of our transactions must not hold a run's
# row lock for long: the server ends such a session. Our transactions never wait on user code.
IDLE_IN_TRANSACTION = 5.0
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_RETRIES = 5  # deadlocks, serialization failures, one lost connection
_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 1.0
_OUR_OPTIONS = ("schema", "busy_timeout")

# Connections inherited across fork() are kept referenced forever in the child: closing (or
# garbage-collecting) one there would send a Terminate on the parent's socket.
_abandoned: list[object] = []


def _unavailable(exc: BaseException, where: str) -> StoreUnavailable:
    return StoreUnavailable(f"{where}: {str(exc).strip() or type(exc).__name__}")


class Listener:
    """A raw libpq connection that LISTENs while its store is idle. Notifications bump a counter
    that ``change_token`` reads after a zero-timeout ``select``: no round trip per call.
    LISTEN is sent on the first call of an idle spell; a successful claim UNLISTENs (without
    waiting), so busy workers are not signalled on every commit."""

    def __init__(self, conninfo: str, channel: str) -> None:
        self.conninfo = conninfo
        self.channel = channel
        self.count = 0
        self._conn: pq.abc.PGconn | None = None
        self._listening = False
        self._retry_at = 0.0
        self._backoff = _BACKOFF_MIN

    def token(self) -> int:
        if self._conn is None:
            if time.monotonic() < self._retry_at:
                return self.count
            self._connect()
        if self._conn is None:
            return self.count
        try:
            if not self._listening:
                self._listen()
            self._drain()
        except (psycopg.Error, OSError):
            self._drop()
        return self.count

    def idle_over(self) -> None:
        """A claim found work: stop listening until the next idle spell (fire and forget)."""
        conn = self._conn
        if conn is None or not self._listening:
            return
        try:
            self._drain()  # the previous UNLISTEN's result, if any
            conn.send_query(b"UNLISTEN *")
            for _ in range(10):  # nonblocking: push the query out (a few bytes: at once)
                if conn.flush() == 0:
                    break
                select.select([], [conn.socket], [], 0.1)
            self._listening = False
        except (psycopg.Error, OSError):
            self._drop()

    def _connect(self) -> None:
        try:
            info = make_conninfo(self.conninfo, application_name="leasekeeper", connect_timeout=2)
            conn = pq.PGconn.connect(info.encode())
            if conn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError(conn.get_error_message())
            conn.nonblocking = 1
            self._conn = conn
            self._backoff = _BACKOFF_MIN
            self.count += 1  # notifications may have been missed while disconnected
        except psycopg.Error:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _BACKOFF_MAX)

    def _listen(self) -> None:
        assert self._conn is not None
        self._drain()
        for _ in range(20):  # an UNLISTEN still in flight: let it finish first
            if not self._conn.is_busy():
                break
            select.select([self._conn.socket], [], [], 0.1)
            self._drain()
        else:
            raise psycopg.OperationalError("the listening connection does not answer")
        self._conn.nonblocking = 0
        try:
            ident = sql.Identifier(self.channel).as_string(None).encode()
            result = self._conn.exec_(b"LISTEN " + ident)
        finally:
            self._conn.nonblocking = 1
        if result.status != pq.ExecStatus.COMMAND_OK:
            raise psycopg.OperationalError(self._conn.get_error_message())
        self._listening = True

    def _drain(self) -> None:
        conn = self._conn
        assert conn is not None
        ready, _, _ = select.select([conn.socket], [], [], 0)
        if ready:
            conn.consume_input()
            if conn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listening connection was lost")
            while not conn.is_busy() and conn.get_result() is not None:
                pass  # results of a fire-and-forget UNLISTEN
        while conn.notifies() is not None:
            self.count += 1

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.finish()
        self._conn = None
        self._listening = False
        self.count += 1  # look again: something may have changed while we could not hear

    def abandon(self) -> None:
        if self._conn is not None:
            _abandoned.append(self._conn)
        self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.finish()
        self._conn = None


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
        self._listener = Listener(conninfo, NOTIFY_CHANNEL.format(schema=schema))
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
                        f"{int(IDLE_IN_TRANSACTION * 1000)}"
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

    def _write(self, fn: Callable[[Cursor, float | None], T], *, run_id: int | None = None) -> T:
        """One transaction: ``fn(cursor, now)`` where ``now`` is the injected clock (read after
        the run row is locked when ``run_id`` is given) or None: the statements read the
        database clock themselves, after their locks."""
        return self._transaction(fn, run_id, "write")

    def _read(self, fn: Callable[[Cursor, float | None], T], *, snapshot: bool = False) -> T:
        """Reads: each statement on its own (autocommit: one round trip), or with ``snapshot``
        all of them in one REPEATABLE READ transaction."""
        return self._transaction(fn, None, "snapshot" if snapshot else "read")

    def _transaction(
        self, fn: Callable[[Cursor, float | None], T], run_id: int | None, mode: str
    ) -> T:
        attempt = 0
        while True:
            attempt += 1
            conn = self._conn()
            done = False  # fn returned: an error now comes from COMMIT (ambiguous)
            try:
                if mode == "read":
                    with conn.cursor() as cur:
                        result = fn(cur, self._now_param())
                        done = True
                        return result
                with conn.transaction(), conn.cursor() as cur:
                    if mode == "snapshot":
                        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    if run_id is not None and self._clock is not None:
                        cur.execute(LOCK_RUN, {"run_id": run_id}, prepare=True)
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
                if (done and mode == "write") or attempt >= 2 or not conn.broken:
                    raise _unavailable(exc, self.where) from None
                # the server never saw our COMMIT: nothing was written; try a new connection
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
        if self._closed:
            raise StoreError("the store is closed")
        if self._pid != os.getpid():
            self._conn()  # resets per-process state (the listener too)
        return self._listener.token()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if self._pid == os.getpid():
            if conn is not None:
                conn.close()
            self._listener.close()
        self._local = threading.local()
        self._closed = True
