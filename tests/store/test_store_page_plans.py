"""PostgreSQL: the run lists' optional filters (``(%(x)s::type IS NULL OR ...)``, one statement
for every combination) still walk the filter's own index: the server plans each call for its
values (a custom plan) and, on a prepared statement, keeps doing so past its first five calls
instead of settling on a generic plan that would walk the primary key past every other run.
(SQLite writes one guarded arm per filter instead: ``tests/store/test_store_sqlite_views.py``.)"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from store_backends import PostgresBackend

from workerproc.store.postgres import reads_sql
from workerproc.store.protocol.reads import status_filter
from workerproc.store.types import SYSTEM_RUNS

N = 20_000
STATUSES = ["succeeded"] * 96 + ["failed"] * 2 + ["cancelled", "pending"]


def runs() -> Any:
    """``N`` runs without tasks: few failed and cancelled ones, one first task in a thousand
    rare."""
    for i in range(1, N + 1):
        status = STATUSES[i % 100]
        finished = float(i) if status != "pending" else None
        task = "rare" if i % 1000 == 7 else f"task{i % 6}"
        yield (i, status, task, float(i), float(i), finished, "x" if status == "failed" else None)


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> PostgresBackend:
    backend = PostgresBackend(str(tmp_path_factory.mktemp("pages")))
    backend.open().close()
    with backend.connect() as conn:
        columns = "id, status, task, created_at, updated_at, finished_at, failure_reason"
        with conn.cursor().copy(f"COPY runs ({columns}) FROM STDIN") as copy:
            for row in runs():
                copy.write_row(row)
        conn.commit()
        conn.execute("ANALYZE runs")
        conn.commit()
    return backend


CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "failed": ("RUNS_BEFORE", {**status_filter("failed"), "task": None}, "runs_status"),
    "cancelled": ("RUNS_BEFORE", {**status_filter("cancelled"), "task": None}, "runs_status"),
    "rare task": ("RUNS_BEFORE", {**status_filter(None), "task": "rare"}, "runs_task"),
    "both": ("RUNS_BEFORE", {**status_filter("cancelled"), "task": "rare"}, "runs_"),
    "newer, rare task": ("RUNS_AFTER", {**status_filter(None), "task": "rare"}, "runs_task"),
    "listed, failed": ("LIST_RUNS", {**status_filter("failed"), "queue": None}, "runs_status"),
}


def session(pg: PostgresBackend) -> psycopg.Connection[Any]:
    """A connection planning as the store's own do (``postgres/dialect.py``: no bitmap scans,
    no sequential scans)."""
    conn: psycopg.Connection[Any] = pg.connect()
    conn.execute("SET enable_bitmapscan = off")
    conn.execute("SET enable_seqscan = off")
    return conn


def params(extra: dict[str, Any]) -> dict[str, Any]:
    return {"before": N, "after": 0, "below": SYSTEM_RUNS, "limit": 20, "now": None, **extra}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_optional_filter_walks_its_index(pg: PostgresBackend, case: str) -> None:
    name, extra, index = CASES[case]
    sql = getattr(reads_sql, name)
    with session(pg) as conn:
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN (COSTS OFF) {sql}", params(extra)))
    scans = re.findall(r"(\w+ Scan)(?: Backward)?(?: using (\w+))? on runs", plan)
    assert scans and all(kind == "Index Scan" for kind, _ in scans), plan
    assert any(used.startswith(index) for _, used in scans), plan


def test_a_prepared_page_keeps_its_plans_for_its_values(pg: PostgresBackend) -> None:
    """As the store's own connections run it (prepared), a dozen pages of every filter: the
    server never falls back on the generic plan."""
    with session(pg) as conn:
        sql = reads_sql.RUNS_BEFORE
        for _ in range(12):
            for case in ("failed", "rare task", "both"):
                conn.execute(sql, params(CASES[case][1]), prepare=True).fetchall()
            conn.execute(sql, params(status_filter(None) | {"task": None}), prepare=True)
        generic, custom = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%r.task = $%%' AND NOT from_sql"
        ).fetchone()
    assert (generic, custom) == (0, 48), (generic, custom)


def test_the_filtered_pages_are_right(pg: PostgresBackend) -> None:
    store = pg.open()
    try:
        failed = [r.id for r in store.runs_page("failed", limit=5)]
        assert failed == [i for i in range(N, 0, -1) if STATUSES[i % 100] == "failed"][:5]
        rare = [r.id for r in store.runs_page(task="rare", before=10_000, limit=3)]
        assert rare == [9007, 8007, 7007]
        newer = [r.id for r in store.runs_page("cancelled", task="rare", after=0, limit=50)]
        assert newer == sorted(
            (i for i in range(1, N + 1) if i % 1000 == 7 and STATUSES[i % 100] == "cancelled"),
            reverse=True,
        )
        assert [r.id for r in store.list_runs("failed", limit=2)] == failed[:2]
    finally:
        store.close()
