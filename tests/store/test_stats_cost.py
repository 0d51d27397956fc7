"""``stats()`` reads no finished run, and the dashboard's chart reads no run older than its window
(B17), on both backends.

Shown by work, not time: every statement ``stats()`` runs is recorded as it runs (its name and
parameters, through ``Tx.rows``), then run again under the engine's own meter: SQLite's VM
instruction counter (a progress handler), PostgreSQL's ``EXPLAIN (ANALYZE, BUFFERS)`` pages.
The same live work (pending, leased, delayed runs) sits beside a history of finished runs and
beside twenty times that history: the work must stay the same. A statement that scanned the
finished runs, or their tasks, would do twenty times more.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FakeClock
from store_backends import BACKENDS, Backend, PostgresBackend, SQLiteBackend, claim

from workerproc.store import Store
from workerproc.store.dialect import Params, Row, Tx

SMALL, BIG = 1_000, 20_000  # finished runs beside the same live work
LIVE = 40  # live runs: pending, delayed, leased and expired


def add_history(backend: Backend, n: int, at: float) -> None:
    """``n`` runs that ended at ``at`` (most succeeded, some failed or cancelled), each with
    its one task done, written in bulk behind the store's back (their totals do not matter
    here: only what reading them would cost)."""
    runs = (
        "INSERT INTO runs (status, created_at, updated_at, finished_at, failure_reason, task) "
        "SELECT CASE WHEN g % 10 = 0 THEN 'failed' WHEN g % 10 = 1 THEN 'cancelled' "
        "ELSE 'succeeded' END, {at}, {at}, {at}, CASE WHEN g % 10 = 0 THEN 'x' END, 'noop' "
        "FROM {series}"
    )
    tasks = (
        "INSERT INTO tasks (run_id, name, available_at, created_at, done_at, attempts, "
        "done_attempt) SELECT id, 'noop', created_at, created_at, finished_at, 1, 1 FROM runs "
        "WHERE finished_at IS NOT NULL"
    )
    if isinstance(backend, SQLiteBackend):
        series = f"(WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {n})"
        conn = sqlite3.connect(backend.path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(runs.format(at=at, series=f"{series} SELECT g FROM s)"))
        conn.execute(tasks)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        conn.close()
        return
    assert isinstance(backend, PostgresBackend)
    with backend.connect() as conn:
        conn.execute(runs.format(at=at, series=f"generate_series(1, {n}) AS g"))
        conn.execute(tasks)
        conn.execute("ANALYZE")


def live_work(s: Store, clock: FakeClock) -> None:
    """The same live runs in every database: ready, delayed, leased and expired."""
    s.start_runs([{"task": "t", "queue": q} for q in ("a", "b") for _ in range(LIVE // 2)])
    for _ in range(4):
        claim(s, "w1", 100)
    assert s.release(claim(s, "w2"), delay=600)
    claim(s, "w3", 5)
    clock.advance(6)  # w3's lease expired


def recorded(s: Store, read: Callable[[Store], object]) -> list[tuple[str, Params]]:
    """The statements ``read`` ran through its transaction, with their parameters."""
    seen: list[tuple[str, Params]] = []
    original = Tx.rows

    def rows(tx: Tx, name: str, params: Params) -> list[Row]:
        seen.append((name, dict(params)))
        return original(tx, name, params)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Tx, "rows", rows)
        read(s)
    assert seen, "the read ran no statement"
    return seen


def sqlite_cost(backend: SQLiteBackend, sql: str, params: Params) -> int:
    """SQLite VM instructions, in hundreds, spent answering ``sql``."""
    conn = sqlite3.connect(backend.path)
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        conn.execute(sql, params).fetchall()
    finally:
        conn.close()
    return count


def postgres_cost(backend: PostgresBackend, sql: str, params: Params) -> int:
    """Pages (shared buffers hit or read) the statement's plan touched."""
    with backend.connect() as conn:
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchone()
    plan: dict[str, Any] = row[0][0]["Plan"]  # the top node counts its children's too
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def costs(backend: Backend, statements: list[tuple[str, Params]]) -> dict[str, int]:
    from workerproc.store.postgres.dialect import PostgresTx  # noqa: PLC0415
    from workerproc.store.sqlite.dialect import SQLiteTx  # noqa: PLC0415

    out: dict[str, int] = {}
    for name, params in statements:
        if isinstance(backend, SQLiteBackend):
            sql = SQLiteTx.catalogue[name]
            assert isinstance(sql, str), name
            out[name] = sqlite_cost(backend, sql, params)
        else:
            assert isinstance(backend, PostgresBackend)
            sql = PostgresTx.catalogue[name]
            assert isinstance(sql, str), name
            out[name] = postgres_cost(backend, sql, params)
    return out


def make_pair(name: str, tmp_path: Path) -> dict[int, tuple[Backend, Store]]:
    """The same live work beside ``SMALL`` and beside ``BIG`` finished runs, a day old."""
    out: dict[int, tuple[Backend, Store]] = {}
    for n in (SMALL, BIG):
        directory = tmp_path / str(n)
        os.makedirs(directory)
        backend = BACKENDS[name](os.fspath(directory))
        clock = FakeClock()
        store = backend.open(clock)
        add_history(backend, n, clock.now - 86_400)
        live_work(store, clock)
        out[n] = (backend, store)
    return out


@pytest.fixture(params=sorted(BACKENDS))
def pair(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[dict[int, tuple[Backend, Store]]]:
    out = make_pair(request.param, tmp_path)
    yield out
    for _, store in out.values():
        store.close()


@pytest.fixture
def pg_pair(tmp_path: Path) -> Iterator[dict[int, tuple[Backend, Store]]]:
    out = make_pair("postgres", tmp_path)
    yield out
    for _, store in out.values():
        store.close()


def flat(pair: dict[int, tuple[Backend, Store]], read: Callable[[Store], object]) -> None:
    measured = {n: costs(b, recorded(s, read)) for n, (b, s) in pair.items()}
    small, big = measured[SMALL], measured[BIG]
    assert small.keys() == big.keys(), measured
    for name in small:  # twenty times the history: at most a deeper index, never a scan
        assert big[name] <= 1.5 * small[name] + 10, (name, measured)


def test_stats_reads_no_finished_run(pair: dict[int, tuple[Backend, Store]]) -> None:
    for n, (_, s) in pair.items():  # the same answer for the live work, and every total
        st = s.stats()
        assert st.runs["pending"] + st.runs["running"] == LIVE, (n, st.runs)
        assert (st.ready, st.delayed, st.leased, st.expired) == (LIVE - 6, 1, 4, 1), n
    flat(pair, Store.stats)


def test_the_chart_reads_no_run_older_than_its_window(
    pg_pair: dict[int, tuple[Backend, Store]],
) -> None:
    """The dashboard's chart (the last hour, by minute) beside a day-old history: a backward
    walk of ``runs_finished`` from now. (SQLite's walks the newest runs by id, bounded by
    ``newest``, with no index on finished_at to write per run: test_store_sqlite_views.)"""

    def chart(s: Store) -> object:
        return s.finished_since(s.now() - 3600, 60, newest=200_000)

    for _, s in pg_pair.values():
        assert chart(s) == []  # the history is older than the window
    flat(pg_pair, chart)
