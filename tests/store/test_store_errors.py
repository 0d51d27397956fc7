"""Bad input and a hostile environment: every failure is one clear StoreError, never a crash,
a wrong answer or a half-written row. SQLite-specific (files, locks, permissions, URLs)."""

from __future__ import annotations

import multiprocessing
import os
import random
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import FakeClock
from store_backends import advance, finish

from workerproc.store import (
    InvalidPayload,
    SchemaTooNew,
    Store,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    open_store,
)
from workerproc.store.sqlite.schema import SCHEMA_VERSION


def rows(path: str) -> tuple[int, int, int]:
    with sqlite3.connect(path) as conn:
        runs = conn.execute("SELECT count(*), coalesce(sum(revision), 0) FROM runs").fetchone()
        tasks = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    conn.close()
    return (runs[0], runs[1], tasks)


@pytest.fixture
def raw(db_path: str) -> Iterator[sqlite3.Connection]:
    """A second, plain sqlite3 connection to the store's file (created by ``store`` first)."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    yield conn
    conn.close()


# -- files that are not ours ---------------------------------------------------------------------
def test_corrupt_file_is_store_corrupt(db_path: str) -> None:
    with open(db_path, "wb") as f:
        f.write(random.Random(7).randbytes(16384))
    with pytest.raises(StoreCorrupt, match="not a leasekeeper database or corrupt"):
        open_store(db_path)


def test_foreign_sqlite_file_is_store_corrupt(db_path: str) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
    conn.close()
    with pytest.raises(StoreCorrupt, match="not a leasekeeper database"):
        open_store(db_path)
    with sqlite3.connect(db_path) as conn:  # and we did not touch it
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("invoices",)]
    conn.close()


def test_schema_too_new(db_path: str) -> None:
    open_store(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew):
        open_store(db_path)


# -- places we cannot write ----------------------------------------------------------------------
def test_missing_directory_is_unavailable(tmp_path: Any) -> None:
    with pytest.raises(StoreUnavailable, match="does not exist"):
        open_store(str(tmp_path / "no" / "such" / "dir" / "lk.db"))


@pytest.mark.parametrize("where", ["file-as-directory", "path-is-directory", "proc"])
def test_unwritable_places_fail_even_as_root(tmp_path: Any, where: str) -> None:
    if where == "file-as-directory":
        (tmp_path / "plainfile").write_text("x")
        path = str(tmp_path / "plainfile" / "lk.db")
    elif where == "path-is-directory":
        path = str(tmp_path)
    else:
        path = "/proc/leasekeeper-test.db"  # procfs refuses new files, even to root
    with pytest.raises(StoreUnavailable):
        open_store(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root bypasses directory permissions")
def test_unwritable_directory_is_unavailable(tmp_path: Any) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(StoreUnavailable):
            open_store(str(locked / "lk.db"))
    finally:
        locked.chmod(0o700)


# -- values that are not JSON --------------------------------------------------------------------
BAD_VALUES = [object(), {1, 2}, b"bytes", float("nan"), {"k": float("inf")}, {(1, 2): "tuple key"}]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_non_json_is_rejected_and_writes_nothing(
    store: Store, db_path: str, clock: FakeClock, bad: object
) -> None:
    store.start_run("seed", state={"n": 0})
    lease = store.claim("w1", 60)
    assert lease is not None
    calls: list[Callable[[], object]] = [
        lambda: store.start_run("t", payload=bad),
        lambda: store.start_run("t", state=bad),
        lambda: store.compare_and_set(lease, 0, bad),
        lambda: advance(store, lease, 0, bad, "next"),
        lambda: advance(store, lease, 0, None, "next", payload=bad),
        lambda: finish(store, lease, 0, None, result=bad),
    ]
    before = rows(db_path)
    for call in calls:
        with pytest.raises(InvalidPayload, match="not JSON-serializable"):
            call()
        assert rows(db_path) == before
    assert store.renew(lease, 60)  # nothing changed the live lease either


def test_empty_task_name_is_invalid(store: Store, db_path: str) -> None:
    with pytest.raises(InvalidPayload):
        store.start_run("")
    assert rows(db_path) == (0, 0, 0)


# -- a database locked by someone else -----------------------------------------------------------
def test_exclusive_lock_past_busy_timeout_is_unavailable_and_reads_work(db_path: str) -> None:
    store = open_store(db_path, busy_timeout=0.3)
    run_id = store.start_run("t", {"p": 1})
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # a backup tool, say, holds the write lock
    try:
        for call in (lambda: store.claim("w1", 60), lambda: store.start_run("u")):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="locked"):
                call()
            assert 0.25 <= time.monotonic() - started < 5
        run = store.get_run(run_id)  # WAL readers are never blocked by the writer
        assert run is not None and run.status == "pending"
        assert store.stats().ready == 1 and [r.id for r in store.list_runs()] == [run_id]
        assert store.next_ready_at() is not None
    finally:
        other.execute("ROLLBACK")
        other.close()
    lease = store.claim("w1", 60)  # no wrong answer was left behind: the task is intact
    assert lease is not None and (lease.run_id, lease.attempt, lease.payload) == (
        run_id,
        1,
        {"p": 1},
    )
    assert rows(db_path) == (1, 0, 1)
    store.close()


def test_busy_timeout_in_url(db_path: str) -> None:
    store = open_store(f"sqlite:///{db_path}?busy_timeout=0.2")
    assert isinstance(store, Store) and store.dialect.busy_timeout == 0.2  # type: ignore[attr-defined]
    store.close()


# -- files on disk -------------------------------------------------------------------------------
def test_database_files_are_not_world_readable(db_path: str) -> None:
    old = os.umask(0o022)  # the usual umask: would make new files world-readable
    try:
        store = open_store(db_path)
        store.start_run("t")  # a write: -wal and -shm exist now
        for suffix in ("", "-wal", "-shm", ".lock", "-producers"):
            mode = stat.S_IMODE(os.stat(db_path + suffix).st_mode)
            assert mode & 0o077 == 0, f"{suffix or 'db'} has mode {mode:o}"
        store.close()
    finally:
        os.umask(old)


def _open_and_write(path: str, barrier: Any, out: Any) -> None:
    try:
        barrier.wait(10)
        store = open_store(path)
        out.put(store.start_run("t"))
        store.close()
    except BaseException as exc:
        out.put(repr(exc))


def test_new_database_opened_by_many_processes_at_once(db_path: str) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_open_and_write, args=(db_path, barrier, out)) for _ in range(8)]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sorted(map(str, results)) == [str(i) for i in range(1, 9)], results  # all wrote
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


# -- URLs and options ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("suffix", "level"), [("", 2), ("?synchronous=normal", 1), ("?synchronous=FULL", 2)]
)
def test_sqlite_url_and_synchronous(db_path: str, suffix: str, level: int) -> None:
    store = open_store(f"sqlite:///{db_path}{suffix}")
    run_id = store.start_run("t")
    conn = store.dialect._conn()  # type: ignore[attr-defined]
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    again = open_store(store.url)  # the url a store reports opens the same database
    assert again.get_run(run_id) is not None
    again.close()
    store.close()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://127.0.0.1:1/x?busy_timeout=0.5",  # no server there: unavailable, at once
        "sqlite:///tmp/x.db?synchronous=off",
        "mysql:///x",
    ],
)
def test_bad_urls_are_store_errors(url: str) -> None:
    with pytest.raises(StoreError):
        open_store(url)


def test_closed_store_refuses(store: Store) -> None:
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.start_run("t")
