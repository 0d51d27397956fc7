"""SQLite under the protocol: one file in WAL mode, one connection per thread (and per process
after fork), every write ``BEGIN IMMEDIATE`` with "now" read once the write lock is held.

Write-lock fairness: SQLite's own busy handler sleeps up to 100 ms between tries, so under eight
busy writers some wait far longer than others. We set SQLite's busy timeout to zero and retry
``BEGIN IMMEDIATE`` ourselves, bounded by ``busy_timeout``, with ageing: newcomers back off
(0.5-5 ms) and leave the CPU to the lock holder; a waiter past 20 ms polls every ~0.3 ms and
so takes the lock ahead of them. (Polling hard from the start starves the holder of CPU on a
small machine; blocking on a file lock makes a convoy behind woken waiters not yet running.)
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import ClassVar, NoReturn, TypeVar

from ..backoff import backoff
from ..dialect import Catalogue, Channel, Cursor, Dialect, Intent, Params, Tx
from ..errors import SchemaTooNew, StoreCorrupt, StoreError, StoreUnavailable
from ..settings import SQLiteOptions
from ..types import Clock
from .errors import is_busy, is_readonly, translate, unbindable, undecodable
from .intent import Intent as Producers
from .schema import MIGRATIONS, SCHEMA_VERSION
from .steps import CATALOGUE
from .turns import turn
from .watch import FileWatch, open_watch

T = TypeVar("T")

_MIN_SLEEP, _MAX_SLEEP = 0.0005, 0.005  # a newcomer's backoff (see _retrying)
_AGED, _AGED_SLEEP = 0.02, 0.0003  # after 20 ms of waiting: poll every ~0.3 ms

# Connections inherited across fork() are kept referenced forever in the child: closing one
# there could checkpoint or unlock on the parent's behalf. The child opens its own.
_abandoned: list[sqlite3.Connection] = []


class SQLiteTx(Tx):
    catalogue: ClassVar[Catalogue] = CATALOGUE
    now: float  # always a number here: the clock, read once the write lock is held

    def __init__(self, conn: sqlite3.Connection, now: float) -> None:
        super().__init__(now)
        self.conn = conn

    def execute(self, sql: str, params: Params) -> Cursor:
        return self.conn.execute(sql, params)

    def time(self) -> float:
        return self.now


class SQLiteDialect(Dialect):
    def __init__(
        self, path: str, options: SQLiteOptions | None = None, *, clock: Clock | None = None
    ) -> None:
        """Nothing is opened or created yet: ``migrate`` creates the file and its schema."""
        options = options or SQLiteOptions()
        self.path = path
        absolute = "/" + os.path.abspath(path).lstrip("/")  # "//x" would read as a URI host
        self._absolute = absolute
        self.url = f"sqlite://{absolute}?synchronous={options.synchronous.lower()}"
        self.where = path
        self.synchronous = options.synchronous
        self.busy_timeout = options.busy_timeout
        self._uri = f"file:{urllib.parse.quote(absolute)}?mode=rw"
        self._clock: Clock = clock or time.time
        self._local = threading.local()
        self._pid = os.getpid()
        self._watches = threading.local()  # each thread's change watch
        self._opened_watches: list[FileWatch] = []
        self._closed = False
        self._producers = Producers(path + "-producers")  # producers ahead of a busy pool

    # -- transactions --------------------------------------------------------------------------
    def write(
        self, fn: Callable[[Tx], T], *, runs: Iterable[int] = (), intent: Intent = "write",
        caller: object = None,
    ) -> T:  # fmt: skip
        """One write transaction: BEGIN IMMEDIATE, then read the clock, then ``fn``. A
        producer's start announces itself and a worker's exchange first lets announced
        producers go (``intent``: bounded, a hint). ``runs`` takes no part: the write lock
        is the whole database's."""
        if caller is not None:
            return self._within(caller, fn)
        if intent == "exchange":
            self._producers.yield_to_producers()
        elif intent in ("start", "call"):
            # a paid call's intent or keep (B13) is a producer's kind of transaction: a few
            # rows a handler waits on, paid for; it goes ahead of the pool's exchanges, and
            # polls for the lock from its first try (the keep's latency is a paid answer's
            # window)
            with self._producers.announce():
                return self._transaction(fn, urgent=intent == "call")
        return self._transaction(fn)

    def _transaction(self, fn: Callable[[Tx], T], urgent: bool = False) -> T:
        conn = self._conn()
        started = time.monotonic()  # (one busy_timeout for the turn and the file's lock)
        mine = turn(self._absolute)  # this process's writers take turns first (turns.py)
        if not mine.acquire(timeout=self.busy_timeout):
            raise StoreUnavailable(
                f"{self.path}: database is locked (waited {self.busy_timeout:g} s for this "
                "process's other writers)"
            )
        try:
            return self._locked(conn, fn, urgent, started)
        finally:
            mine.release()

    def _locked(
        self, conn: sqlite3.Connection, fn: Callable[[Tx], T], urgent: bool, started: float
    ) -> T:
        """(This process's turn taken, waiting since ``started``.) BEGIN IMMEDIATE, ``fn``,
        COMMIT."""
        self._retrying(lambda: conn.execute("BEGIN IMMEDIATE"), urgent=urgent, started=started)
        try:
            tx = SQLiteTx(conn, self._clock())
            result = fn(tx)
            tx.flush()  # the events of its transitions (B18), in the same transaction
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._raise(exc)
        return result

    def _within(self, caller: object, fn: Callable[[Tx], T]) -> T:
        """``fn`` inside the caller's transaction, all or nothing: a savepoint undoes what it
        wrote when it fails (the caller's transaction goes on either way)."""
        conn = self._callers(caller)
        try:
            conn.execute("SAVEPOINT leasekeeper_start")
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from None
        try:
            tx = SQLiteTx(conn, self._clock())
            result = fn(tx)
            tx.flush()
        except BaseException as exc:
            conn.execute("ROLLBACK TO leasekeeper_start")
            conn.execute("RELEASE leasekeeper_start")
            if isinstance(exc, sqlite3.Error):  # the caller's transaction decides what is next
                raise translate(exc, self.path) from None
            self._raise(exc)
        conn.execute("RELEASE leasekeeper_start")
        return result

    def _callers(self, tx: object) -> sqlite3.Connection:
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

    def read(self, fn: Callable[[Tx], T], *, snapshot: bool = False) -> T:
        conn = self._conn()

        def once() -> T:
            tx = SQLiteTx(conn, self._clock())
            if not snapshot:
                return fn(tx)
            conn.execute("BEGIN")  # a deferred transaction: one snapshot, no write lock
            try:
                return fn(tx)
            finally:
                conn.execute("COMMIT")

        return self._retrying(once)

    def _raise(self, exc: BaseException) -> NoReturn:
        """Raise what the caller sees of ``exc``: the store's own error for what the database
        or the driver refused, anything else as it was."""
        if isinstance(exc, sqlite3.Error):
            raise self._failed(exc) from None
        if isinstance(exc, UnicodeDecodeError):
            raise undecodable(exc, self.path) from None
        if isinstance(exc, (UnicodeEncodeError, OverflowError)):
            raise unbindable(exc) from None
        raise exc

    # -- connections ---------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("the store is closed")
        if self._pid != os.getpid():  # we are in a forked child: never touch inherited handles
            old = getattr(self._local, "conn", None)
            if old is not None:
                _abandoned.append(old)
            self._local = threading.local()
            self._pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        try:
            # mode=rw: the file exists (migrate); a connection opened later (another thread, a
            # reconnect) must never create an empty one where it was deleted
            conn = sqlite3.connect(self._uri, timeout=0, isolation_level=None,
                                   cached_statements=64, uri=True)  # fmt: skip
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from None

        def configure() -> None:  # reads the schema: busy while another process migrates
            conn.execute("PRAGMA busy_timeout = 0")  # we retry ourselves, fairly (see above)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")

        try:
            self._retrying(configure)
        except BaseException:
            conn.close()
            raise
        return conn

    def _retrying(
        self, fn: Callable[[], T], urgent: bool = False, started: float | None = None
    ) -> T:
        """Run ``fn``, retrying SQLITE_BUSY until busy_timeout, with ageing: a newcomer backs
        off (jittered, doubling up to _MAX_SLEEP) so the lock holder keeps the CPU; a waiter
        that has already waited _AGED polls every few hundred microseconds, so it beats the
        newcomers to the lock and nobody starves. An ``urgent`` one (a paid call's) polls so
        from its first try. ``started``: when the caller began to wait (its turn among the
        process's writers counts: toward busy_timeout, and toward its age)."""
        started = time.monotonic() if started is None else started
        deadline = started + self.busy_timeout
        tries = 0
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise self._failed(exc) from None
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"{self.path}: database is locked (waited {self.busy_timeout:g} s)"
                    ) from None
                tries += 1
                if urgent or time.monotonic() - started >= _AGED:
                    time.sleep(backoff(1, _AGED_SLEEP, _AGED_SLEEP, jitter=0.5))
                else:
                    time.sleep(backoff(tries, _MIN_SLEEP, _MAX_SLEEP, jitter=0.5))
            except (sqlite3.Error, UnicodeError, OverflowError) as exc:
                self._raise(exc)

    def _failed(self, exc: sqlite3.Error) -> StoreError:
        """Translate ``exc``. A connection that cannot write is dropped: when SQLite cannot open
        a file read-write (an immutable or read-only file system, a full disk at open) it opens
        it read-only *silently* and stays so after the fault clears. The next call of this
        thread reconnects, read-write again once it can."""
        if is_readonly(exc):
            conn = getattr(self._local, "conn", None)
            self._local.conn = None
            if conn is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
        return translate(exc, self.path)

    # -- the file and its schema ---------------------------------------------------------------
    def migrate(self) -> None:
        self._create_file()
        version = self._version()
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"{self.path}: schema v{version} is newer than this leasekeeper")
        import filelock  # noqa: PLC0415 - only a migration needs it (~8 MB of imports per worker)

        lock = filelock.FileLock(self.path + ".lock", timeout=self.busy_timeout, mode=0o600)
        try:
            with lock:
                self._migrate_locked()
        except filelock.Timeout:
            msg = f"{self.path}: another process holds the migration lock"
            raise StoreUnavailable(msg) from None

    def _version(self) -> int:
        conn = self._conn()
        return int(self._retrying(lambda: conn.execute("PRAGMA user_version").fetchone()[0]))

    def _create_file(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(f"{self.path}: directory {directory} does not exist")
        # Create only a missing file (O_EXCL), and never open-and-close an existing one: POSIX
        # drops every lock this process holds on a file when ANY descriptor of it closes, so a
        # second store opened in a process that already has a connection (the heartbeat's)
        # would strip the first connection's WAL lock, and another process closing last
        # could then checkpoint and delete the WAL under it: its later commits would be lost.
        if not os.path.lexists(self.path) and os.path.exists(self.path + "-wal"):
            # A new file beside an old write-ahead log would replay that log into it (or be
            # mistaken for the database a running pool lost): refuse, never guess.
            raise StoreUnavailable(
                f"{self.path} is missing but its write-ahead log {self.path}-wal is still there "
                "(deleted while in use?): refusing to create a new database; restore the file, "
                f"or remove {self.path}-wal and {self.path}-shm to start empty"
            )
        try:  # owner-only: -wal and -shm inherit the database file's mode
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreUnavailable(f"{self.path}: cannot create the database ({exc})") from None

    def _migrate_locked(self) -> None:
        conn = self._conn()
        version = self._version()
        if version == 0:
            tables = self._retrying(lambda: conn.execute("SELECT count(*) FROM sqlite_master"))
            if tables.fetchone()[0]:
                raise StoreCorrupt(f"{self.path}: an SQLite file, but not a leasekeeper database")
            mode = self._retrying(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
            if mode[0].lower() != "wal":
                raise StoreUnavailable(f"{self.path}: cannot switch to WAL mode ({mode[0]})")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            script = f"BEGIN IMMEDIATE;\n{MIGRATIONS[target - 1]}\nPRAGMA user_version = {target};"
            try:
                self._retrying(lambda s=script: conn.executescript(s))  # type: ignore[misc]
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        # A connection that ran the migrations runs every later write several times slower
        # (measured: a claim 5x); this thread's next call opens a fresh one.
        self._local.conn = None
        conn.close()

    def storage_check(self, quick: bool = False) -> str | None:
        return "quick_check" if quick else "integrity_check"

    def check_storage(self, quick: bool = False, limit: int = 100) -> list[str]:
        pragma = self.storage_check(quick)
        conn = self._conn()

        def read() -> list[str]:
            rows = conn.execute(f"PRAGMA {pragma}({limit})").fetchall()
            found = [line for r in rows for line in str(r[0]).splitlines()]
            found = [f for f in found if f not in ("ok", "*** in database main ***")]
            if not quick and len(found) < limit:
                found += [
                    f"row {rowid} of {table} points at a missing row of {parent}"
                    for table, rowid, parent, _fk in conn.execute("PRAGMA foreign_key_check")
                ]
            return found[:limit]

        try:
            return self._retrying(read)
        except StoreCorrupt as exc:  # too damaged to even walk: that is the finding
            return [str(exc)]

    # -- time, the change token, closing -------------------------------------------------------
    def now(self) -> float:
        return self._clock()

    def change_watch(self) -> FileWatch | None:
        """An inotify watch of the database's file and ``-wal`` (``watch``), this thread's own
        (opened at its first call, again after a fork: one thread's drain never eats what
        another sleeps on); None where there is none."""
        watch: FileWatch | None = getattr(self._watches, "watch", None)
        if watch is not None and watch.pid == os.getpid():
            return watch
        if self._closed:
            raise StoreError("the store is closed")
        watch = open_watch(self.path)  # (an inherited one is left to its process)
        self._watches.watch = watch
        if watch is not None:
            self._opened_watches.append(watch)
        return watch

    def change_token(self, channel: Channel | None = None) -> int:
        """``PRAGMA data_version``: moves when another connection commits (any channel)."""
        conn = self._conn()
        return int(self._retrying(lambda: conn.execute("PRAGMA data_version").fetchone()[0]))

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._pid == os.getpid():
            conn.close()
        self._local = threading.local()
        self._producers.close()
        for watch in self._opened_watches:
            watch.close()  # (this process's only: a child's closes nothing of the parent's)
        self._opened_watches = []
        self._watches = threading.local()
        self._closed = True
