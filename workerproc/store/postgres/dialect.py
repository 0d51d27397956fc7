"""PostgreSQL under the protocol: one connection per thread (and per process after fork),
prepared statements, reconnection with backoff, transactions, and the LISTEN connection
(``listen``) that makes ``change_token`` free and ``wait_change`` a sleep. Connections are in
autocommit mode: a read is one round trip; a write is an explicit transaction (a renewal, one
idempotent statement, runs on its own).

Failures: a connection is used only while it is healthy (not broken, idle, out of pipeline
mode: ``_healthy``); after any failure that is not a clean answer of the server (a broken or
terminated connection, an aborted pipeline, a transaction left open) it is closed and a new one
is made before the next try, so a failed connection is never used again. A connection that dies
before our COMMIT was sent lost nothing (the server rolls the transaction back), so the
transaction is retried once on a new connection; one that dies while committing is ambiguous
and raises ``StoreUnavailable`` (the caller's fence makes a retry safe, and its retries back
off). A deadlock or serialization failure is retried; a lock wait past ``busy_timeout`` raises
``StoreUnavailable``. Messages keep the driver's first line (libpq adds hints on others).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.rows import tuple_row

from ..dialect import Channel, Dialect, Intent, Tx
from ..errors import InvalidOption, InvalidPayload, SchemaTooNew, StoreError, StoreUnavailable
from ..redaction import redact, redact_url, scrub
from ..settings import PostgresOptions
from ..types import Clock
from . import admin
from .listen import ABANDONED, END, WORK, Listener, ListenWatch
from .ops_sql import SNAPSHOT, WATCH_RUN
from .pooling import Poller, begins, listen_at, pooled, reopen_query, set_local, settings
from .schema import SCHEMA_VERSION
from .sql import END_CHANNEL, LOCK_RUNS, NOTIFY_CHANNEL
from .tx import PostgresTx, begin_locked, commit, forget_prepared

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]

_RETRIES = 5  # deadlocks, serialization failures, one lost connection
_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 1.0


def _said(exc: BaseException) -> str:
    """What the driver said, in its first line (libpq adds hints such as "This probably means
    ..." on others) and without a password (libpq quotes the URL it could not read)."""
    text = str(exc).strip()
    return redact(text.splitlines()[0].strip() if text else type(exc).__name__)


def _healthy(conn: psycopg.Connection[Any]) -> bool:
    """Fit for the next transaction: open, idle (no transaction left open or aborted, no result
    pending) and out of pipeline mode. A connection that failed in any other way is never used
    again: libpq can leave one in an aborted pipeline that refuses every later query."""
    return (
        not conn.broken
        and conn.info.transaction_status == TransactionStatus.IDLE
        and conn.pgconn.pipeline_status == PipelineStatus.OFF
    )


def _rollback(conn: psycopg.Connection[Any], cur: Cursor) -> None:
    """Roll back a transaction a failure left open, on a connection still fit to say so (one
    that is not is discarded by the caller: the server rolls back itself)."""
    if conn.broken or conn.pgconn.pipeline_status != PipelineStatus.OFF:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        forget_prepared(conn)  # the driver deallocates them after a ROLLBACK
        with contextlib.suppress(psycopg.Error):
            cur.execute("ROLLBACK")


class PostgresDialect(Dialect):
    """Connections, transactions, notifications for the PostgreSQL store."""

    ordered_events = False  # B18: a reader numbers committed events first (events_sql)

    def __init__(
        self, conninfo: str, options: PostgresOptions | None = None, *, clock: Clock | None = None
    ) -> None:
        """``conninfo``: a libpq URL or connection string, without our options. Nothing is
        opened yet: the first statement connects."""
        options = options or PostgresOptions()
        self.conninfo = conninfo
        self.schema = options.schema
        self.busy_timeout = options.busy_timeout
        self.idle_in_transaction = options.idle_in_transaction
        # ours unless the URL sets one itself (libpq's keyword arguments win over the URL)
        given = conninfo_to_dict(conninfo)
        self.network = {
            k: v for k, v in network_params(options.network_timeout).items() if k not in given
        }
        # the URL this store reports opens the same database, schema and route again
        glue = "&" if "?" in conninfo else "?"
        self.url = f"{conninfo}{glue}{reopen_query(options)}"
        self.where = redact_url(self.url)
        self._clock = clock
        self._local = threading.local()
        self._pid = os.getpid()
        self._closed = False
        self._create = options.migrate
        self._database: str | None = None
        self._change_watch: ListenWatch | None = None
        self.pooled, listen = pooled(options), listen_at(conninfo, options)
        names = {WORK: NOTIFY_CHANNEL.format(schema=self.schema),
                 END: END_CHANNEL.format(schema=self.schema)}  # fmt: skip
        self._listener: Listener | Poller = (
            Poller(self._snapshot) if listen is None else Listener(listen, names, self.network)
        )
        ours = settings(self.schema, self.busy_timeout, self.idle_in_transaction)
        self._options = " ".join(f"-c {name}={value}" for name, value in ours.items())
        self._begin = begins(ours if self.pooled else {})
        self.local = "; ".join(set_local(ours)) if self.pooled else ""  # (the async store's)
        self.listen_at = listen

    def said(self, exc: BaseException) -> str:
        """What the driver said (``_said``), without any secret of our URL: libpq may quote a
        part of it (a password as written, say)."""
        return scrub(_said(exc), self.conninfo)

    def _unavailable(self, exc: BaseException, where: str) -> StoreUnavailable:
        return StoreUnavailable(f"{where}: {self.said(exc)}")

    # -- connections ---------------------------------------------------------------------------
    def _conn(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError("the store is closed")
        if self._pid != os.getpid():  # a forked child: never touch inherited connections
            old = getattr(self._local, "conn", None)
            if old is not None:
                ABANDONED.append(old)
            self._listener.abandon()
            self._local = threading.local()
            self._pid = os.getpid()
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and not _healthy(conn):
            self._discard(conn)
            conn = None
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def _discard(self, conn: psycopg.Connection[Any]) -> None:
        """Close a connection that failed and forget it: the next try makes a new one."""
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with contextlib.suppress(Exception):  # closing what already failed may fail too
            conn.close()

    def session(self) -> dict[str, Any]:
        """How every connection of this store is opened (the async store's too): straight to
        the server, with our settings as startup options and every statement prepared on
        first use; behind a transaction pooler with neither (``begin``)."""
        opened: dict[str, Any] = {
            "autocommit": True,  # transactions are explicit (see _run)
            "prepare_threshold": None if self.pooled else 0,
            "connect_timeout": max(2, int(self.busy_timeout + 0.999)),
            "application_name": "leasekeeper",
            **self.network,
        }
        if not self.pooled:
            opened["options"] = self._options
        return opened

    def begin(self, mode: str = "write") -> str:
        """The query that opens a transaction of ``mode`` (behind a pooler: with our
        settings for it)."""
        return self._begin[mode]

    def _connect(self) -> psycopg.Connection[Any]:
        """Connect, retrying with backoff until busy_timeout (a restarting server, say)."""
        deadline = time.monotonic() + self.busy_timeout
        backoff = _BACKOFF_MIN
        while True:
            try:
                conn = psycopg.connect(self.conninfo, **self.session())
                return conn
            except psycopg.OperationalError as exc:
                if time.monotonic() + backoff >= deadline:
                    raise self._unavailable(exc, f"{self.where}: cannot connect") from None
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, _BACKOFF_MAX)
            except psycopg.ProgrammingError as exc:  # libpq cannot read the URL: a usage error
                raise InvalidOption(f"{self.where}: {self.said(exc)}") from None
            except psycopg.Error as exc:
                raise StoreError(f"{self.where}: {self.said(exc)}") from None

    # -- transactions --------------------------------------------------------------------------
    def _now_param(self) -> float | None:
        return None if self._clock is None else self._clock()

    def write(
        self, fn: Callable[[Tx], T], *, runs: Iterable[int] = (), intent: Intent = "write",
        caller: object = None,
    ) -> T:  # fmt: skip
        """One transaction: ``fn(tx)`` where ``tx.now`` is the injected clock or None (the
        statements read the database clock themselves, after their locks). ``runs``: the runs
        the transaction will write, locked first in id order when there are several (two
        batches never wait on each other in a cycle) or when the injected clock must be read
        after the lock. A ``"statement"`` sends one idempotent statement that locks what it
        needs itself (a renewal): without an injected clock it runs on its own (autocommit: no
        BEGIN, no COMMIT round trip; a lost connection retries it)."""
        if caller is not None:
            return self._within(caller, fn)
        if intent == "statement" and self._clock is None:
            return self._transaction(fn, (), "statement")
        ids = sorted(set(runs))
        lock = ids if len(ids) > 1 or (ids and self._clock is not None) else []
        return self._transaction(fn, lock, "write")

    def read(self, fn: Callable[[Tx], T], *, snapshot: bool = False, bare: bool = False) -> T:
        """Reads: each statement on its own (autocommit: one round trip), or with ``snapshot``
        all of them in one REPEATABLE READ transaction. Behind a pooler, in a transaction
        that sets our settings first, unless ``bare`` (statements that need none)."""
        return self._transaction(fn, (), "bare" if bare else "snapshot" if snapshot else "read")

    def _transaction(self, fn: Callable[[Tx], T], lock: Sequence[int], mode: str) -> T:
        attempt = 0
        while True:
            attempt += 1
            conn = self._conn()
            done = False  # fn returned: an error now comes from COMMIT (ambiguous)
            try:
                if mode == "bare" or (mode in ("read", "statement") and not self.pooled):
                    with conn.cursor() as cur:
                        tx = PostgresTx(cur, self._now_param())
                        result = fn(tx)
                        if tx.events or tx.deferred or tx.ahead:  # no transaction for them: our bug
                            raise StoreError("events emitted outside a write transaction")
                        done = True
                        return result
                with conn.cursor() as cur:
                    if self.pooled:
                        cur.execute(self._begin[mode])
                    try:
                        if lock and not self.pooled:  # BEGIN and the lock: one round trip
                            begin_locked(conn, self._begin[mode], lock)
                        elif lock:
                            cur.execute(LOCK_RUNS, {"run_ids": lock}, prepare=False)
                        tx = PostgresTx(cur, self._now_param(), pooled=self.pooled)
                        if not lock and not self.pooled:  # sent with its first query
                            tx.begin = self._begin[mode]
                        result = fn(tx)
                        done = True
                        commit(conn, cur, tx)
                    except BaseException:
                        _rollback(conn, cur)
                        raise
                return result
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                self._unless_healthy(conn)
                if attempt >= _RETRIES:
                    raise self._unavailable(exc, self.where) from None
                time.sleep(random.uniform(0.001, 0.01) * attempt)
            except pg_errors.InvalidSqlStatementName as exc:
                # a statement this session had prepared is gone (deallocated by someone the
                # driver did not see): nothing was written; the session starts its prepared
                # statements afresh (the driver's own with them) and tries once more
                self._unless_healthy(conn)
                forget_prepared(conn)
                if not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("DEALLOCATE ALL", prepare=False)
                if attempt >= 2:
                    raise StoreError(f"{self.where}: {self.said(exc)}") from None
            except pg_errors.LockNotAvailable as exc:
                self._unless_healthy(conn)
                msg = f"{self.where}: a lock was held past {self.busy_timeout:g} s"
                raise StoreUnavailable(f"{msg} ({self.said(exc)})") from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self._discard(conn)  # terminated, broken or wedged: never used again
                if (done and mode not in ("read", "bare")) or attempt >= 2:
                    raise self._unavailable(exc, self.where) from None
                # the server never saw our COMMIT: nothing was written; try a new connection
            except psycopg.DataError as exc:  # a value PostgreSQL cannot take (NUL in text)
                self._unless_healthy(conn)
                raise InvalidPayload(f"a value cannot be written: {self.said(exc)}") from None
            except psycopg.Error as exc:
                self._unless_healthy(conn)
                raise StoreError(f"{self.where}: {self.said(exc)}") from None
            except (UnicodeEncodeError, OverflowError) as exc:  # a value it cannot bind
                self._unless_healthy(conn)
                raise InvalidPayload(f"a value cannot be written: {exc}") from None
            except BaseException:  # an interrupt mid-transaction: the state is unknown
                self._discard(conn)
                raise

    def _snapshot(self) -> str:
        """The server's snapshot (what a poller compares): one statement on its own, which
        needs no setting of ours (``pooling.Poller``)."""
        row = self.read(lambda tx: tx.execute(SNAPSHOT, {}).fetchone(), bare=True)
        assert row is not None
        return str(row[0])

    def _unless_healthy(self, conn: psycopg.Connection[Any]) -> None:
        """After a clean answer of the server the connection stays; after anything that left
        it open, busy or in pipeline mode, it goes."""
        if not _healthy(conn):
            self._discard(conn)

    def _within(self, caller: object, fn: Callable[[Tx], T]) -> T:
        """``fn`` on the caller's own connection, inside the caller's transaction."""
        conn = admin.callers(caller, self._our_database(), self.schema, self.where)
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                tx = PostgresTx(cur, self._now_param(), f'"{self.schema}".', self.schema)
                result = fn(tx)
                tx.flush()
                return result
        except psycopg.Error as exc:  # the caller's transaction decides what happens next
            raise StoreError(f"{self.where}: {self.said(exc)}") from None

    def _our_database(self) -> str:
        if self._database is None:
            row = self.read(lambda tx: tx.execute("SELECT current_database()", {}).fetchone())
            assert row is not None
            self._database = str(row[0])
        return self._database

    # -- the schema and the engine's own checks ------------------------------------------------
    def migrate(self) -> None:
        """Bring the schema to this version, or refuse: a newer one, one that is not ours, or
        (a reader that may not create it) none at all."""
        found = self.read(lambda tx: admin.version(self._cursor(tx), self.schema, self.where))
        if found == SCHEMA_VERSION:
            return
        if found > SCHEMA_VERSION:
            raise SchemaTooNew(f"{self.where}: schema v{found} is newer than this leasekeeper")
        if not self._create:  # a reader: say what creates it (or brings it forward)
            if found == 0:
                raise StoreError(
                    f"{self.where}: no leasekeeper schema {self.schema!r} in this database yet: "
                    "`supervisor migrate --db URL` creates it (`supervisor start` and "
                    "`supervisor enqueue` do too)"
                )
            raise StoreError(
                f"{self.where}: leasekeeper schema {self.schema!r} is at v{found}, this "
                f"leasekeeper needs v{SCHEMA_VERSION}: `supervisor migrate --db URL` brings it "
                "forward (`supervisor start` and `supervisor enqueue` do too)"
            )
        self.write(lambda tx: admin.migrate_locked(self._cursor(tx), self.schema, self.where))

    @staticmethod
    def _cursor(tx: Tx) -> Cursor:
        assert isinstance(tx, PostgresTx)
        return tx.cur

    def storage_check(self, quick: bool = False) -> str | None:
        if self.read(lambda tx: admin.amcheck(self._cursor(tx))) is None:
            return None
        return "amcheck bt_index_check" if quick else "amcheck bt_index_check + verify_heapam"

    def check_storage(self, quick: bool = False, limit: int = 100) -> list[str]:
        """amcheck when the extension is installed (a superuser runs ``CREATE EXTENSION
        amcheck``); without it nothing is checked and nothing is found (``storage_check``
        says so: None)."""
        namespace = self.read(lambda tx: admin.amcheck(self._cursor(tx)))
        if namespace is None:
            return []
        return self.read(lambda tx: admin.check_storage(self._cursor(tx), namespace,
                                                        self.schema, quick, limit))  # fmt: skip

    # -- time, notifications, closing ----------------------------------------------------------
    def now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return self.read(lambda tx: tx.time())

    def change_token(self, channel: Channel | None = None) -> int:
        self._alive()
        return self._listener.token(channel)

    def wait_change(self, token: int, timeout: float, channel: Channel | None = None) -> int:
        """Sleep on LISTEN until a notification moves the token, or ``timeout`` passes."""
        self._alive()
        return self._listener.wait(token, max(0.0, timeout), channel)

    def change_watch(self) -> ListenWatch | None:
        """The LISTEN connection's socket (``listen.ListenWatch``), this process's own (None
        when polling: ``pooling.Poller``)."""
        self._alive()
        if isinstance(self._listener, Poller):
            return None
        watch = self._change_watch
        if watch is None or watch.pid != os.getpid():
            self._change_watch = watch = ListenWatch(self._listener)
        return watch

    def commits_move_token(self) -> bool:
        """Over LISTEN, only new work and watched runs' ends notify: no. Polling the server's
        snapshot (``pooling.Poller``), any transaction's end moves the token: yes."""
        return isinstance(self._listener, Poller)

    def watch(self, run_id: int) -> None:
        """LISTEN on the end channel first, then mark the run watched, so no end can slip
        between: from now on its end sends a NOTIFY (unwatched runs end without one)."""
        self._alive()
        self._listener.token(END)
        self.write(lambda tx: tx.execute(WATCH_RUN, {"run_id": run_id}), intent="statement")

    def claimed(self) -> None:
        self._listener.idle_over()

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


def network_params(timeout: float) -> dict[str, int]:
    """libpq's settings that bound a silent network to about ``timeout`` seconds
    (``settings.NETWORK_TIMEOUT``): data sent and not acknowledged for that long, or a server
    that answers no keepalive for that long past a short idle, ends the connection with an
    error instead of a wait of many minutes."""
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, int(timeout / 2)),
        "keepalives_interval": max(1, int(timeout / 4)),
        "keepalives_count": 3,
        "tcp_user_timeout": int(timeout * 1000),
    }
