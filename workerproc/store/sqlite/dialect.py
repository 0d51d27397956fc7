"""SQLite plumbing: one file in WAL mode, one connection per thread, every write IMMEDIATE.

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
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from ...backoff import backoff
from ..base import Clock
from ..errors import (
    InvalidPayload,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from .intent import Intent
from .schema import MIGRATIONS, SCHEMA_VERSION

T = TypeVar("T")
Role = Literal["producer", "worker"]  # who writes, for sqlite_intent's priority hint
Params = dict[str, Any]

SYNCHRONOUS = ("FULL", "NORMAL")
DEFAULT_BUSY_TIMEOUT = 5.0
_MIN_SLEEP, _MAX_SLEEP = 0.0005, 0.005  # a newcomer's backoff (see _retrying)
_AGED, _AGED_SLEEP = 0.02, 0.0003  # after 20 ms of waiting: poll every ~0.3 ms

# Connections inherited across fork() are kept referenced forever in the child: closing one
# there could checkpoint or unlock on the parent's behalf. The child opens its own.
_abandoned: list[sqlite3.Connection] = []


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _is_readonly(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (int(code) & 0xFF) == 8  # SQLITE_READONLY and its extended codes
    return "readonly" in str(exc)


def translate(exc: sqlite3.Error, path: str) -> StoreError:
    text = str(exc)
    if isinstance(exc, (sqlite3.InterfaceError, sqlite3.ProgrammingError)) and (
        "binding parameter" in text
    ):  # a value SQLite cannot take: that caller's, not the database's, problem
        return InvalidPayload(f"a value cannot be written: {text}")
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    ):
        return StoreCorrupt(f"{path}: not a leasekeeper database or corrupt ({text})")
    if _is_readonly(exc):
        return StoreReadOnly(f"{path}: cannot write the database ({text})")
    if "unable to open" in text or "readonly" in text or "disk I/O" in text:
        return StoreUnavailable(f"{path}: cannot open or write the database ({text})")
    return StoreError(f"{path}: {text}")


def undecodable(exc: UnicodeDecodeError, path: str) -> StoreCorrupt:
    """SQLite's own error text was not UTF-8: a damaged schema quoted in a "malformed
    database schema" message (the sqlite3 module cannot even decode it)."""
    text = exc.object.decode("utf-8", "replace") if isinstance(exc.object, bytes) else str(exc)
    return StoreCorrupt(f"{path}: not a leasekeeper database or corrupt ({text})")


class SQLiteBase:
    """Connection plumbing: the file, one connection per thread (and per process after fork),
    fair retries of the write lock, transactions, and schema migrations."""

    def __init__(
        self,
        path: str,
        *,
        clock: Clock | None = None,
        synchronous: str = "FULL",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS:
            raise StoreError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        self.path = path
        self.url = f"sqlite:///{os.path.abspath(path)}?synchronous={synchronous.lower()}"
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        absolute = "/" + os.path.abspath(path).lstrip("/")  # "//x" would read as a URI host
        self._uri = f"file:{urllib.parse.quote(absolute)}?mode=rw"
        self._clock: Clock = clock or time.time
        self._local = threading.local()
        self._pid = os.getpid()
        self._closed = False
        self._intent = Intent(path + "-producers")  # producers ahead of a busy pool
        self._create_file()
        self._migrate()

    # -- connections ---------------------------------------------------------------------------
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
            # mode=rw: the file exists (_create_file); a connection opened later (another
            # thread, a reconnect) must never create an empty one where it was deleted
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

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying SQLITE_BUSY until busy_timeout, with ageing: a newcomer backs
        off (jittered, doubling up to _MAX_SLEEP) so the lock holder keeps the CPU; a waiter
        that has already waited _AGED polls every few hundred microseconds, so it beats the
        newcomers to the lock and nobody starves."""
        started = time.monotonic()
        deadline = started + self.busy_timeout
        tries = 0
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise self._failed(exc) from None
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"{self.path}: database is locked (waited {self.busy_timeout:g} s)"
                    ) from None
                tries += 1
                if time.monotonic() - started >= _AGED:
                    time.sleep(backoff(1, _AGED_SLEEP, _AGED_SLEEP, jitter=0.5))
                else:
                    time.sleep(backoff(tries, _MIN_SLEEP, _MAX_SLEEP, jitter=0.5))
            except sqlite3.Error as exc:
                raise self._failed(exc) from None
            except UnicodeDecodeError as exc:
                raise undecodable(exc, self.path) from None

    def _failed(self, exc: sqlite3.Error) -> StoreError:
        """Translate ``exc``. A connection that cannot write is dropped: when SQLite cannot open
        a file read-write (an immutable or read-only file system, a full disk at open) it opens
        it read-only *silently* and stays so after the fault clears. The next call of this
        thread reconnects, read-write again once it can."""
        if _is_readonly(exc):
            conn = getattr(self._local, "conn", None)
            self._local.conn = None
            if conn is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
        return translate(exc, self.path)

    def _write(
        self, fn: Callable[[sqlite3.Connection, float], T], *, role: Role | None = None
    ) -> T:
        """One write transaction: BEGIN IMMEDIATE, then read the clock, then ``fn``. ``role``:
        a ``"producer"`` starting runs announces itself and a ``"worker"`` exchange first lets
        announced producers go (``sqlite_intent``: bounded, a hint)."""
        if role == "worker":
            self._intent.yield_to_producers()
        if role == "producer":
            with self._intent.announce():
                return self._transaction(fn)
        return self._transaction(fn)

    def _transaction(self, fn: Callable[[sqlite3.Connection, float], T]) -> T:
        conn = self._conn()
        self._retrying(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            result = fn(conn, self._clock())
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._failed(exc) from None
            if isinstance(exc, UnicodeDecodeError):
                raise undecodable(exc, self.path) from None
            if isinstance(exc, (UnicodeEncodeError, OverflowError)):  # a value it cannot bind
                raise InvalidPayload(f"a value cannot be written: {exc}") from None
            raise
        return result

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn()
        return self._retrying(lambda: fn(conn))

    def _migrate(self) -> None:
        version = self._read(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
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

    def _migrate_locked(self) -> None:
        conn = self._conn()
        version = self._read(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
        if version == 0:
            tables = self._read(lambda c: c.execute("SELECT count(*) FROM sqlite_master"))
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

    def integrity_check_name(self, quick: bool = False) -> str | None:
        return "quick_check" if quick else "integrity_check"

    def check_integrity(self, quick: bool = False, limit: int = 100) -> list[str]:
        pragma = "quick_check" if quick else "integrity_check"
        limit = max(1, int(limit))

        def read(c: sqlite3.Connection) -> list[str]:
            rows = c.execute(f"PRAGMA {pragma}({limit})").fetchall()
            found = [line for r in rows for line in str(r[0]).splitlines()]
            found = [f for f in found if f not in ("ok", "*** in database main ***")]
            if not quick and len(found) < limit:
                found += [
                    f"row {rowid} of {table} points at a missing row of {parent}"
                    for table, rowid, parent, _fk in c.execute("PRAGMA foreign_key_check")
                ]
            return found[:limit]

        try:
            return self._read(read)
        except StoreCorrupt as exc:  # too damaged to even walk: that is the finding
            return [str(exc)]

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._pid == os.getpid():
            conn.close()
        self._local = threading.local()
        self._intent.close()
        self._closed = True
