"""The SQLite backend: one file in WAL mode, one connection per thread, every write IMMEDIATE.

Write-lock fairness: SQLite's own busy handler sleeps up to 100 ms between tries, so under eight
busy writers some wait far longer than others. We set SQLite's busy timeout to zero and retry
``BEGIN IMMEDIATE`` ourselves with short jittered sleeps (0.1-2 ms), bounded by ``busy_timeout``.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import filelock

from . import sqlite_sql as q
from .base import Clock, Commit, Store
from .errors import (
    InvalidPayload,
    RunNotFound,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
)
from .sqlite_schema import MIGRATIONS, SCHEMA_VERSION
from .types import (
    JSON,
    CasResult,
    ClaimRequest,
    CommitOutcome,
    Lease,
    OwnerLease,
    Run,
    Stats,
    TaskInfo,
)

T = TypeVar("T")
Params = dict[str, Any]

SYNCHRONOUS = ("FULL", "NORMAL")
DEFAULT_BUSY_TIMEOUT = 5.0
_MIN_SLEEP, _MAX_SLEEP = 0.0001, 0.002

# Connections inherited across fork() are kept referenced forever in the child: closing one
# there could checkpoint or unlock on the parent's behalf. The child opens its own.
_abandoned: list[sqlite3.Connection] = []


def dumps(value: JSON, what: str) -> str:
    """JSON-encode ``value`` or raise InvalidPayload naming ``what``. Never pickle."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serializable: {exc}") from None


def _loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _translate(exc: sqlite3.Error, path: str) -> StoreError:
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    ):
        return StoreCorrupt(f"{path}: not a leasekeeper database or corrupt ({text})")
    if "unable to open" in text or "readonly" in text or "disk I/O" in text:
        return StoreUnavailable(f"{path}: cannot open or write the database ({text})")
    return StoreError(f"{path}: {text}")


class SQLiteStore(Store):
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
        self._clock: Clock = clock or time.time
        self._local = threading.local()
        self._pid = os.getpid()
        self._closed = False
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
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, cached_statements=64)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None

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
        """Run ``fn``, retrying SQLITE_BUSY with short jittered sleeps until busy_timeout."""
        deadline = time.monotonic() + self.busy_timeout
        sleep = _MIN_SLEEP
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise _translate(exc, self.path) from None
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"{self.path}: database is locked (waited {self.busy_timeout:g} s)"
                    ) from None
                time.sleep(sleep * (0.5 + random.random()))
                sleep = min(sleep * 2, _MAX_SLEEP)
            except sqlite3.Error as exc:
                raise _translate(exc, self.path) from None

    def _write(self, fn: Callable[[sqlite3.Connection, float], T]) -> T:
        """One write transaction: BEGIN IMMEDIATE, then read the clock, then ``fn``."""
        conn = self._conn()
        self._retrying(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            result = fn(conn, self._clock())
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _translate(exc, self.path) from None
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

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._pid == os.getpid():
            conn.close()
        self._local = threading.local()
        self._closed = True

    # -- producers -----------------------------------------------------------------------------
    def start_run(
        self, task: str, payload: JSON = None, state: JSON = None, delay: float = 0
    ) -> int:
        if not task:
            raise InvalidPayload("task name must not be empty")
        params = {
            "state": dumps(state, "state"),
            "payload": dumps(payload, "payload"),
            "name": task,
            "delay": max(0.0, float(delay)),
        }

        def tx(c: sqlite3.Connection, now: float) -> int:
            run_id = c.execute(q.INSERT_RUN, {**params, "now": now}).lastrowid
            assert run_id is not None
            c.execute(q.INSERT_TASK, {**params, "now": now, "run_id": run_id})
            return run_id

        return self._write(tx)

    # -- the lease protocol --------------------------------------------------------------------
    def claim(self, owner: str, ttl: float, *, max_attempts: int = 3) -> Lease | None:
        request = ClaimRequest(owner, ttl, max_attempts)
        return self._write(lambda c, now: self._claim(c, now, request))

    def _claim(self, c: sqlite3.Connection, now: float, req: ClaimRequest) -> Lease | None:
        params = {"owner": req.owner, "ttl": float(req.ttl), "now": now}
        while True:  # each turn either hands out a lease or fails one run: it terminates
            row = c.execute(q.CLAIM, params).fetchone()
            if row is None:
                return None
            task_id, run_id, name, payload, attempts, base, expires_at = row
            if attempts - base > req.max_attempts:  # R6: attempt max+1 never runs
                (error,) = c.execute(q.DROP_EXHAUSTED_LEASE, {"task_id": task_id}).fetchone()
                c.execute(
                    q.FAIL_RUN,
                    {
                        "run_id": run_id,
                        "reason": "task_attempts_exhausted",
                        "error": error,
                        "now": now,
                    },
                )
                continue
            state, revision = c.execute(q.MARK_RUNNING, {"run_id": run_id, "now": now}).fetchone()
            return Lease(
                task_id=task_id,
                run_id=run_id,
                task=name,
                payload=_loads(payload),
                attempt=attempts,
                owner=req.owner,
                expires_at=float(expires_at),
                claimed_at=now,
                state=_loads(state),
                revision=revision,
                tries=attempts - base,
            )

    @staticmethod
    def _fence(lease: Lease, now: float) -> Params:
        return {
            "task_id": lease.task_id,
            "owner": lease.owner,
            "attempt": lease.attempt,
            "now": now,
            "run_id": lease.run_id,
        }

    def renew_until(self, lease: Lease, ttl: float) -> float | None:
        def tx(c: sqlite3.Connection, now: float) -> float | None:
            row = c.execute(q.RENEW, {**self._fence(lease, now), "ttl": ttl}).fetchone()
            return None if row is None else float(row[0])

        return self._write(tx)

    def ack(self, lease: Lease) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            fence = self._fence(lease, now)
            if c.execute(q.TASK_DONE, fence).rowcount == 0:
                return False
            c.execute(q.SUCCEED_IF_EMPTY, fence)
            return True

        return self._write(tx)

    def release(self, lease: Lease, delay: float = 0, *, error: str | None = None) -> bool:
        commit = Commit(lease, "release", delay=delay, error=error)
        return self.commit(commit).result is CasResult.OK

    def compare_and_set(self, lease: Lease, expected_revision: int, new_state: JSON) -> CasResult:
        state = dumps(new_state, "state")

        def tx(c: sqlite3.Connection, now: float) -> CasResult:
            fence = self._fence(lease, now)
            if c.execute(q.CHECK_FENCE, fence).fetchone() is None:
                return CasResult.LEASE_LOST
            moved = c.execute(q.CAS_STATE, {**fence, "state": state, "revision": expected_revision})
            return CasResult.OK if moved.rowcount else CasResult.CONFLICT

        return self._write(tx)

    def commit(self, commit: Commit, *, claim: ClaimRequest | None = None) -> CommitOutcome:
        encoded = self._encode(commit)

        def tx(c: sqlite3.Connection, now: float) -> CommitOutcome:
            result = self._apply(c, now, commit, encoded)
            return CommitOutcome(result, self._claim(c, now, claim) if claim else None)

        return self._write(tx)

    @staticmethod
    def _encode(commit: Commit) -> Params:
        """Encode JSON before the transaction starts: a bad value writes nothing."""
        params: Params = {"delay": max(0.0, float(commit.delay)), "error": commit.error}
        if commit.kind in ("finish", "advance"):
            params["state"] = dumps(commit.new_state, "state")
            params["revision"] = commit.expected_revision
        if commit.kind == "finish":
            params["result"] = dumps(commit.result, "result")
        if commit.kind == "advance":
            if not commit.next_task:
                raise InvalidPayload("advance needs the name of the next task")
            params["name"] = commit.next_task
            params["payload"] = dumps(commit.next_payload, "payload")
        if commit.kind == "fail":
            params["reason"] = commit.reason or "failed"
        return params

    def _apply(self, c: sqlite3.Connection, now: float, commit: Commit, p: Params) -> CasResult:
        params = {**p, **self._fence(commit.lease, now)}
        if c.execute(q.CHECK_FENCE, params).fetchone() is None:
            return CasResult.LEASE_LOST
        kind = commit.kind
        if kind == "release":
            c.execute(q.RELEASE, params)
            if commit.error is not None:
                c.execute(q.RUN_ERROR, params)
            return CasResult.OK
        if kind == "drop":
            c.execute(q.TASK_DONE, params)
            return CasResult.OK
        if kind == "fail":
            if c.execute(q.FAIL_RUN, params).rowcount == 0:
                return CasResult.CONFLICT
            c.execute(q.TASK_FAILED, params)
            return CasResult.OK
        cas = q.CAS_FINISH if kind == "finish" else q.CAS_STATE
        if c.execute(cas, params).rowcount == 0:
            return CasResult.CONFLICT
        c.execute(q.TASK_DONE, params)
        if kind == "advance":
            c.execute(q.CAS_NEXT_TASK, params)
        return CasResult.OK

    # -- operators -----------------------------------------------------------------------------
    def _run_status(self, c: sqlite3.Connection, run_id: int) -> str:
        row = c.execute(q.RUN_STATUS, {"run_id": run_id}).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return str(row[0])

    def fail_run(self, run_id: int, reason: str, error: str | None = None) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            self._run_status(c, run_id)
            params = {"run_id": run_id, "reason": reason, "error": error, "now": now}
            return c.execute(q.FAIL_RUN, params).rowcount == 1

        return self._write(tx)

    def cancel_run(self, run_id: int) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            self._run_status(c, run_id)
            return c.execute(q.CANCEL_RUN, {"run_id": run_id, "now": now}).rowcount == 1

        return self._write(tx)

    def retry_run(self, run_id: int) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            if self._run_status(c, run_id) not in ("failed", "cancelled"):
                return False
            params = {"run_id": run_id, "now": now}
            if c.execute(q.PENDING_TASKS, params).fetchone()[0] == 0:
                return False
            c.execute(q.RETRY_RUN, params)
            c.execute(q.RETRY_TASKS, params)
            return True

        return self._write(tx)

    def release_owner(self, owner: str) -> int:
        return self._write(
            lambda c, now: c.execute(q.RELEASE_OWNER, {"owner": owner, "now": now}).rowcount
        )

    # -- reads ---------------------------------------------------------------------------------
    @staticmethod
    def _run(row: tuple[Any, ...]) -> Run:
        rid, status, state, revision, result, reason, error, created, updated, finished = row
        return Run(
            rid, status, _loads(state), revision, _loads(result), reason, error,
            created, updated, finished,
        )  # fmt: skip

    def get_run(self, run_id: int) -> Run | None:
        row = self._read(lambda c: c.execute(q.GET_RUN, {"run_id": run_id}).fetchone())
        return None if row is None else self._run(row)

    def get_tasks(self, run_id: int) -> list[TaskInfo]:
        rows = self._read(lambda c: c.execute(q.GET_TASKS, {"run_id": run_id}).fetchall())
        return [TaskInfo(r[0], r[1], r[2], _loads(r[3]), *r[4:]) for r in rows]

    def list_runs(self, status: str | None = None, limit: int = 100) -> list[Run]:
        sql = q.LIST_RUNS if status is None else q.LIST_RUNS_BY_STATUS
        params = {"status": status, "limit": limit}
        return [self._run(r) for r in self._read(lambda c: c.execute(sql, params).fetchall())]

    def stats(self) -> Stats:
        def read(c: sqlite3.Connection) -> Stats:
            now = self._clock()
            c.execute("BEGIN")  # one snapshot for every count
            try:
                runs = dict(c.execute(q.RUN_COUNTS).fetchall())
                ready, delayed, leased, expired = c.execute(q.TASK_COUNTS, {"now": now}).fetchone()
                leases = [OwnerLease(*r) for r in c.execute(q.LIVE_LEASES).fetchall()]
            finally:
                c.execute("COMMIT")
            return Stats(now, runs, ready, delayed, leased, expired, leases)

        return self._read(read)

    def change_token(self) -> int:
        return int(self._read(lambda c: c.execute("PRAGMA data_version").fetchone()[0]))

    def next_ready_at(self) -> float | None:
        row = self._read(lambda c: c.execute(q.NEXT_READY).fetchone())
        return None if row[0] is None else float(row[0])
