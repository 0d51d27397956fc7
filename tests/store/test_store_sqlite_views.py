"""SQLite only: the dashboard's reads stay bounded over a million runs, and the attempt history
costs the happy path nothing.

"Fast over a million rows" is shown without a clock: EXPLAIN QUERY PLAN must name an index (or
the primary key) and no sort, and SQLite's own instruction counter (a progress handler called
every few VM steps) must count the same work for a page of a million runs as for a page of a
thousand.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from store_backends import claim, finish

from workerproc.store import Commit, open_store
from workerproc.store.protocol import claims
from workerproc.store.protocol.reads import status_filter
from workerproc.store.sqlite import reads_sql as v
from workerproc.store.sqlite.schema import MIGRATIONS
from workerproc.store.types import SYSTEM_RUNS

STATUSES = ("succeeded", "failed", "cancelled", "pending", "running")


def fill(path: str, n: int) -> None:
    """``n`` runs (no tasks) with five first-task names and every status, bulk-inserted."""
    open_store(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO runs (id, status, task, created_at, updated_at, finished_at,"
        " failure_reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            (i, st := STATUSES[i % 5], f"task{i % 7}", i, i, i if i % 5 < 3 else None,
             "x" if st == "failed" else None)
            for i in range(1, n + 1)
        ),
    )  # fmt: skip
    conn.execute("COMMIT")
    conn.execute("ANALYZE")  # the planner knows the real distribution: still an index
    conn.close()


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, str]]:
    d = tmp_path_factory.mktemp("scale")
    paths = {n: os.path.join(d, f"runs{n}.db") for n in (1_000, 1_000_000)}
    for n, path in paths.items():
        fill(path, n)
    yield paths


def plan(conn: sqlite3.Connection, sql: str, params: dict[str, object]) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def vm_steps(conn: sqlite3.Connection, sql: str, params: dict[str, object]) -> int:
    """SQLite VM instructions (in units of 100) spent answering ``sql``: work, not time."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        conn.execute(sql, params).fetchall()
    finally:
        conn.set_progress_handler(None, 0)
    return count


PAGES: dict[str, tuple[str, dict[str, object]]] = {
    "newest": (v.RUNS_BEFORE, {"before": 2**63 - 1}),
    "status": (v.RUNS_BEFORE, status_filter("failed")),
    "task": (v.RUNS_BEFORE, {"task": "task3"}),
    "both": (v.RUNS_BEFORE, {**status_filter("succeeded"), "task": "task5"}),
    "newer, status": (v.RUNS_AFTER, {**status_filter("failed"), "after": 0}),
    "newer, task": (v.RUNS_AFTER, {"task": "task3", "after": 0}),
}


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_page_of_runs_walks_an_index_and_costs_the_same_at_any_size(
    dbs: dict[int, str], name: str
) -> None:
    sql, extra = PAGES[name]
    steps = {}
    for n, path in dbs.items():
        conn = sqlite3.connect(path)
        # deep in the table: the page below the middle id, as "older" links would ask
        params = {**status_filter(None), "task": None, "limit": 10, "before": n // 2,
                  "now": 0.0, "below": SYSTEM_RUNS, **extra}  # fmt: skip
        detail = plan(conn, sql, params)
        assert not any(d.startswith("SCAN") for d in detail), detail
        assert not any("TEMP B-TREE" in d for d in detail), detail
        steps[n] = vm_steps(conn, sql, params)
        assert len(conn.execute(sql, params).fetchall()) == 10
        conn.close()
    assert steps[1_000_000] <= 2 * steps[1_000] + 10, steps


def test_task_names_seek_per_name_instead_of_scanning(dbs: dict[int, str]) -> None:
    steps = {}
    for n, path in dbs.items():
        conn = sqlite3.connect(path)
        names = [r[0] for r in conn.execute(v.TASK_NAMES, {"limit": 100})]
        assert names == [f"task{i}" for i in range(7)]
        steps[n] = vm_steps(conn, v.TASK_NAMES, {"limit": 100})
        conn.close()
    assert steps[1_000_000] <= 2 * steps[1_000] + 10, steps


def test_the_throughput_chart_reads_a_bounded_number_of_runs(dbs: dict[int, str]) -> None:
    steps = {}
    for n, path in dbs.items():
        conn = sqlite3.connect(path)
        params = {"since": 0, "bucket": 60.0, "newest": 1_000}
        steps[n] = vm_steps(conn, v.FINISHED_SINCE, params)
        conn.close()
    assert steps[1_000_000] <= 2 * steps[1_000] + 10, steps


def test_history_and_rejection_reads_use_their_indexes(db_path: str) -> None:
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    for sql in (v.ATTEMPT_HISTORY, v.RUN_REJECTIONS):
        detail = plan(conn, sql, {"run_id": 1})
        assert not any(d.startswith("SCAN") for d in detail), detail
    conn.close()


# -- the happy path is unchanged --------------------------------------------------------------
def statements(monkeypatch: pytest.MonkeyPatch, action: Callable[[], object]) -> list[str]:
    """The statements the store runs during ``action``, in order. SQLite's trace also reports
    the start of each trigger program under its statement's text: consecutive repeats are
    collapsed, so this is what the store asked for, not what triggers did."""
    seen: list[str] = []
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        conn.set_trace_callback(seen.append)
        return conn

    with monkeypatch.context() as m:
        m.setattr(sqlite3, "connect", connect)
        action()
    asked = [s for s in seen if not s.startswith("PRAGMA")]
    return [s for k, s in enumerate(asked) if k == 0 or asked[k - 1] != s]


def test_claim_and_commit_write_no_history_row_and_run_no_extra_statement(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same claim + finish with and without the takeover trigger runs the same statements
    and changes the same number of rows (triggers' changes included): its WHEN is false on the
    happy path. On a takeover it writes one row more (the check can fail)."""
    store = open_store(db_path)

    def happy() -> int:
        s = open_store(db_path)
        lease = claim(s, "w1")
        assert finish(s, lease, 0, {"ok": 1}).value == "ok"
        return s.dialect._conn().total_changes  # type: ignore[attr-defined]

    def takeover() -> int:
        s = open_store(db_path)
        assert claim(s, "w2").takeover
        return s.dialect._conn().total_changes  # type: ignore[attr-defined]

    def orphan() -> None:
        store.start_run("t")
        claim(store, "dead")
        store.release_owner("dead")

    def compare(
        action: Callable[[], int], setup: Callable[[], object]
    ) -> tuple[tuple[int, list[str]], tuple[int, list[str]]]:
        out = []
        raw = sqlite3.connect(db_path, isolation_level=None)
        query = "SELECT sql FROM sqlite_master WHERE name = 'leases_taken'"
        (ddl,) = raw.execute(query).fetchone()
        for drop in (False, True):
            if drop:
                raw.execute("DROP TRIGGER leases_taken")
            setup()
            # which goes first, the plain walk or the gates, alternates from claim to claim
            # (claims._turns): both runs take the same turn, so they run the same statements
            monkeypatch.setattr(claims, "_turns", itertools.count())
            changes: list[int] = []
            ran = statements(monkeypatch, lambda into=changes: into.append(action()))
            out.append((changes[0], [" ".join(s.split()[:4]) for s in ran]))
        raw.execute(ddl)
        raw.close()
        return out[0], out[1]

    mine, plain = compare(happy, lambda: store.start_run("t", state={}))
    assert mine == plain, (mine, plain)
    assert store.attempt_history(1) == store.attempt_history(2) == []
    mine, plain = compare(takeover, orphan)
    assert mine[1] == plain[1]  # the same statements...
    # ...and the trigger's writes on a takeover: the history row, and the task's counts
    assert mine[0] == plain[0] + 2
    assert [h.outcome for h in store.attempt_history(3)] == ["taken_over"]
    store.close()


def test_no_index_covers_what_the_happy_path_now_writes(db_path: str) -> None:
    """done_owner is set by the UPDATE that marks a task done; no index may include it."""
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    indexed = {
        col
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        for (_, _, col) in conn.execute(f"PRAGMA index_info({name})")
    }
    conn.close()
    assert "done_owner" not in indexed


def test_migration_to_v5_names_existing_runs_by_their_first_task(db_path: str) -> None:
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    script = "".join(MIGRATIONS[:4])
    raw.executescript(f"BEGIN; {script} PRAGMA user_version = 4; COMMIT;")
    raw.execute("INSERT INTO runs (state, created_at, updated_at) VALUES ('null', 1, 1)")
    raw.executemany(
        "INSERT INTO tasks (run_id, name, available_at, created_at) VALUES (1, ?, 1, 1)",
        [("first",), ("second",)],
    )
    raw.close()
    store = open_store(db_path)
    run = store.get_run(1)
    assert run is not None and run.task == "first"
    assert store.task_names() == ["first"]
    store.close()


def test_migration_20_gives_each_child_its_parents_join_back(db_path: str) -> None:
    """Before v20 one column held both a run's own join and its parent's: a child that spawned
    children of its own lost its parent's. The migration recovers it from the parent."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    script = "".join(MIGRATIONS[:19])
    raw.executescript(f"BEGIN; {script} PRAGMA user_version = 19; COMMIT;")
    far = 9e9
    raw.executemany(  # a parent, its child (which spawned since), the grandchild
        "INSERT INTO runs (id, state, created_at, updated_at, parent_id, join_task, wait_for, "
        "wait_task, children_left) VALUES (?, '{}', 1, 1, ?, ?, ?, ?, ?)",
        [(1, None, 3, "children", 3, 1), (2, 1, 5, "children", 5, 1), (3, 2, 5, None, None, None)],
    )
    raw.executemany(
        "INSERT INTO tasks (id, run_id, name, available_at, created_at, done_at) "
        "VALUES (?, ?, ?, ?, 1, ?)",
        [(1, 1, "fan", 1, 1), (2, 2, "fan", 1, 1), (3, 1, "merge", far, None),
         (4, 3, "leaf", 1, None), (5, 2, "merge", far, None)],
    )  # fmt: skip
    raw.close()
    with open_store(db_path) as store:
        (leaf,) = store.claim("w", 30.0, limit=5)
        assert leaf.run_id == 3
        for task, run in (("leaf", 3), ("merge", 2), ("merge", 1)):
            assert leaf.task == task and leaf.run_id == run
            out = store.commit_many([Commit(leaf, "finish", expected_revision=leaf.revision,
                                            new_state={}, result=run)])  # fmt: skip
            assert out.results[0].value == "ok"
            got = store.claim("w", 30.0, limit=5)
            if run == 1:
                assert got == []
                break
            (leaf,) = got
            assert [c.run_id for c in leaf.children or ()] == [run]
