"""Every released schema version migrates forward with its rows: for each engine and each
version k, a database left at k exactly as the migrator leaves it (its first k migrations, the
version recorded by the migrator itself: ``PRAGMA user_version`` on SQLite, the version table
on PostgreSQL), rows written in the shape version 1 defined (a pending run with its task, a
succeeded one, a failed one with work left) plus what version k asks of a row, then opened
by ``open_store``: it reaches the current version and every row reads back through the store,
and the pending one is claimed and finished, the failed one retried.

Both engines share one history (``workerproc/store/migrations.py``, its numbers SQLite's own).
PostgreSQL's releases before it numbered PostgreSQL's steps alone (1-21) in a version table
without names: each is built here as that release left it (the shared history's steps up to
the one its version maps to, its old version table) and migrates forward too, as does a
database at every step of the shared history.

``tests/store/test_postgres_migrations.py`` checks what one migration does to the rows it meets;
this checks that every version reaches the current one."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import replace
from typing import Any

import pg_session
import psycopg
import pytest

from workerproc.store import CasResult, Commit, Lease, Store, open_store
from workerproc.store.errors import SchemaTooNew
from workerproc.store.migrations import HISTORY, SCHEMA_VERSION, steps
from workerproc.store.postgres import admin as pg_admin
from workerproc.store.postgres import schema as pg_schema
from workerproc.store.sqlite import schema as sqlite_schema

STREAMS, BATCHES = HISTORY.index("streams") + 1, HISTORY.index("stream_batches") + 1
RUNS = [  # (status, state, result, failure_reason, last_error, finished_at, revision)
    ("pending", {"n": 1}, None, None, None, None, 0),
    ("succeeded", {"n": 2}, {"ok": True}, None, None, 20.0, 1),
    ("failed", {"n": 3}, None, "gave_up", "boom", 30.0, 0),
]
TASK = "old"
# a stream (v25 on, a row per chunk until v29): offset, attempt, kind, data's JSON, at
CHUNKS = [(1, 1, "data", '"a"', 11.0), (2, 1, "data", '{"n": 1}', 11.0),
          (3, 2, "reset", None, 12.0), (4, 2, "data", "[1, 2]", 12.5)]  # fmt: skip


def row_for(table: str, columns: dict[str, bool], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` for the columns the table has; fail naming a required column it has no value
    for (a migration that adds one must say what an old row holds)."""
    missing = [c for c, required in columns.items() if required and c not in values]
    assert not missing, f"{table}: no value for required column(s) {missing} in this test"
    return {c: v for c, v in values.items() if c in columns}


def run_values(status: str, state: Any, result: Any, reason: Any, error: Any,
               finished: Any, revision: int) -> dict[str, Any]:  # fmt: skip
    return {"status": status, "state": json.dumps(state), "revision": revision,
            "result": None if result is None else json.dumps(result), "failure_reason": reason,
            "last_error": error, "created_at": 10.0, "updated_at": finished or 10.0,
            "finished_at": finished, "task": TASK, "queue": "default", "priority": 0}  # fmt: skip


def task_values(run_id: int, status: str) -> dict[str, Any]:
    done = status == "succeeded"
    return {"run_id": run_id, "name": TASK, "payload": json.dumps({"run": run_id}),
            "available_at": 10.0, "created_at": 10.0, "attempts": 1 if done else 0,
            "attempt_base": 0, "done_at": 20.0 if done else None,
            "done_attempt": 1 if done else None, "done_owner": "w" if done else None,
            "claimed_at": 15.0 if done else None}  # fmt: skip


def check_forward(store: Store, ids: list[int], streamed: bool = False) -> None:
    """The rows read back through the store, and the store goes on with them (``streamed``: the
    first run's stream was written as ``CHUNKS``, and reads back the same, whole or from
    within)."""
    if streamed:
        (task,) = store.get_tasks(ids[0])
        want = [(o, a, task.id, k, None if d is None else json.loads(d), at)
                for o, a, k, d, at in CHUNKS]  # fmt: skip
        got = [(c.offset, c.attempt, c.step, c.kind, c.data, c.at) for c in store.stream(ids[0])]
        assert got == want
        assert [c.offset for c in store.stream(ids[0], after=1, limit=2)] == [2, 3]
        assert store.emitted(Lease(task.id, ids[0], TASK, None, 3, "w", 0.0, 0.0)) == [[1, 2]]
    for run_id, (status, state, result, reason, error, finished, revision) in zip(
        ids, RUNS, strict=True
    ):
        run = store.get_run(run_id)
        assert run is not None, f"run {run_id} is gone"
        assert (run.status, run.state, run.result, run.failure_reason, run.last_error) == (
            status, state, result, reason, error)  # fmt: skip
        assert (run.finished_at, run.revision, run.created_at) == (finished, revision, 10.0)
        (task,) = store.get_tasks(run_id)
        assert (task.name, task.payload) == (TASK, {"run": run_id})
    assert store.stats().runs == {"pending": 1, "succeeded": 1, "failed": 1}
    lease = store.claim("w", 30)
    assert lease is not None and (lease.run_id, lease.state) == (ids[0], {"n": 1})
    step = Commit(lease, "finish", expected_revision=0, new_state={"n": 9}, result=1)
    assert store.commit_many([step]).results == (CasResult.OK,)
    assert store.retry_run(ids[2])
    again = store.claim("w", 30)
    assert again is not None and again.run_id == ids[2]
    fresh = store.start_run("new")
    assert fresh not in ids and store.get_run(fresh) is not None
    assert store.integrity_violations() == []


# -- SQLite --------------------------------------------------------------------------------------
def sqlite_columns(conn: sqlite3.Connection, table: str) -> dict[str, bool]:
    rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    return {r[1]: bool(r[3]) and r[4] is None and not r[5] for r in rows}


def sqlite_insert(conn: sqlite3.Connection, table: str, values: dict[str, Any]) -> int:
    row = row_for(table, sqlite_columns(conn, table), values)
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    cur = conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values()))
    assert cur.lastrowid is not None
    return cur.lastrowid


def sqlite_fill(path: str) -> list[int]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        ids = []
        for values in RUNS:
            run_id = sqlite_insert(conn, "runs", run_values(*values))
            task_id = sqlite_insert(conn, "tasks", task_values(run_id, values[0]))
            ids.append(run_id)
            if len(ids) == 1 and sqlite_columns(conn, "stream_chunks"):  # (v25 to v28)
                conn.execute("INSERT INTO stream_heads VALUES (?, 4, ?, 2, 20)", (run_id, task_id))
                conn.executemany("INSERT INTO stream_chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 [(run_id, o, task_id, a, k, d, at)
                                  for o, a, k, d, at in CHUNKS])  # fmt: skip
        totals = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'run_totals'").fetchone()
        if totals:  # the version counts finished runs as they end: as its store would have
            for status in ("succeeded", "failed"):
                conn.execute("INSERT INTO run_totals (queue, status, shard, n) "
                             "VALUES ('default', ?, 0, 1)", (status,))  # fmt: skip
        conn.execute("COMMIT")
        return ids
    finally:
        conn.close()


@pytest.mark.parametrize("version", range(1, len(sqlite_schema.MIGRATIONS) + 1))
def test_sqlite_version_migrates_forward_with_its_rows(
    version: int, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(os.fspath(tmp_path), "old.db")
    with monkeypatch.context() as m:  # the migrator itself, told this version is the newest
        m.setattr("workerproc.store.sqlite.dialect.SCHEMA_VERSION", version)
        open_store(path).close()
    assert user_version(path) == version
    ids = sqlite_fill(path)
    store = open_store(path)
    try:
        assert user_version(path) == sqlite_schema.SCHEMA_VERSION
        check_forward(store, ids, streamed=STREAMS <= version < BATCHES)
    finally:
        store.close()


LEASE_TTL = 3600.0  # the live lease's time left when the database is migrated


@pytest.mark.parametrize("version", range(1, len(sqlite_schema.MIGRATIONS) + 1))
def test_sqlite_version_migrates_forward_with_a_live_lease(
    version: int, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task leased when the database is migrated is still fenced after (R2): wherever the
    version kept its lease, its owner renews and commits it; another owner, or its own older
    attempt, cannot; no other worker claims its run while it lives."""
    path = os.path.join(os.fspath(tmp_path), "old.db")
    with monkeypatch.context() as m:
        m.setattr("workerproc.store.sqlite.dialect.SCHEMA_VERSION", version)
        open_store(path).close()
    ids = sqlite_fill(path)
    held = sqlite_lease(path, ids[0], "zed", time.time())
    assert user_version(path) == version
    store = open_store(path)
    try:
        assert user_version(path) == sqlite_schema.SCHEMA_VERSION
        assert store.claim("other", 30) is None  # its run is held
        (task,) = store.get_tasks(ids[0])
        assert (task.lease_owner, task.attempts) == ("zed", held.attempt)
        for wrong in (replace(held, owner="other"), replace(held, attempt=held.attempt - 1)):
            assert not store.renew(wrong, 30)
            late = Commit(wrong, "finish", expected_revision=0, new_state={"n": 0}, result=0)
            assert store.commit_many([late]).results == (CasResult.LEASE_LOST,)
        assert store.renew(held, 30)
        step = Commit(held, "finish", expected_revision=0, new_state={"n": 9}, result=1)
        assert store.commit_many([step]).results == (CasResult.OK,)
        run = store.get_run(ids[0])
        assert run is not None and (run.status, run.state) == ("succeeded", {"n": 9})
        assert store.stats().leases == [] and store.integrity_violations() == []
    finally:
        store.close()


def sqlite_lease(path: str, run_id: int, owner: str, now: float) -> Lease:
    """The run's task leased to ``owner`` as that version's claim left it: on the task row
    before step 29, in ``leases`` since (their triggers keep the run's claim columns)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'leases'").fetchone():
            conn.execute(  # (since step 29: a row of its own; its triggers count on the task)
                "INSERT INTO leases (run_id, task_id, owner, attempts, attempt_base, expires_at, "
                "claimed_at) SELECT run_id, id, ?, attempts + 1, attempt_base, ?, ? FROM tasks "
                "WHERE run_id = ? AND done_at IS NULL",
                (owner, now + LEASE_TTL, now, run_id),
            )
        else:
            conn.execute(
                "UPDATE tasks SET lease_owner = ?, lease_expires_at = ?, attempts = attempts + 1 "
                "WHERE run_id = ? AND done_at IS NULL",
                (owner, now + LEASE_TTL, run_id),
            )
        task_id, attempts = conn.execute(
            "SELECT id, attempts FROM tasks WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    return Lease(task_id, run_id, TASK, {"run": run_id}, attempts, owner, now + LEASE_TTL, now,
                 state={"n": 1})  # fmt: skip


def user_version(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


# -- PostgreSQL ----------------------------------------------------------------------------------
def pg_columns(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, bool]:
    rows = conn.execute(
        "SELECT column_name, is_nullable = 'NO' AND column_default IS NULL "
        "AND is_generated = 'NEVER' AND is_identity = 'NO' "
        "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    ).fetchall()
    return {name: bool(required) for name, required in rows}


def pg_insert(
    conn: psycopg.Connection[Any], schema: str, table: str, values: dict[str, Any]
) -> int:
    row = row_for(table, pg_columns(conn, schema, table), values)
    names = ", ".join(row)
    marks = ", ".join("%s" for _ in row)
    found = conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks}) RETURNING id",
                         list(row.values())).fetchone()  # fmt: skip
    assert found is not None
    return int(found[0])


def pg_fill(schema: str) -> list[int]:
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        with conn.transaction():
            ids = []
            for values in RUNS:
                run_id = pg_insert(conn, schema, "runs", run_values(*values))
                task_id = pg_insert(conn, schema, "tasks", task_values(run_id, values[0]))
                ids.append(run_id)
                if len(ids) == 1 and pg_columns(conn, schema, "stream_chunks"):  # (v25 to v28)
                    conn.execute("INSERT INTO stream_heads VALUES (%s, 4, %s, 2, 20)",
                                 (run_id, task_id))  # fmt: skip
                    with conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO stream_chunks VALUES (%s, %s, %s, %s, %s, %s, %s)",
                            [(run_id, o, task_id, a, k, d, at) for o, a, k, d, at in CHUNKS],
                        )
            # the run's claim columns: set by the statements since v3 (triggers before)
            conn.execute(
                "UPDATE runs SET (head_at, head_created, head_id) = (SELECT available_at, "
                "created_at, id FROM tasks WHERE run_id = runs.id AND done_at IS NULL "
                "ORDER BY available_at, created_at, id LIMIT 1) WHERE status = 'pending'"
            )
            if pg_columns(conn, schema, "run_totals"):  # (none before v3)
                for status in ("succeeded", "failed"):
                    conn.execute("INSERT INTO run_totals (queue, status, shard, n) "
                                 "VALUES ('default', %s, 0, 1)", (status,))  # fmt: skip
        return ids


def pg_version(schema: str) -> int:
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        found = conn.execute(
            f'SELECT max(version) FROM "{schema}".{pg_schema.VERSION_TABLE}'
        ).fetchone()
        return int(found[0]) if found and found[0] is not None else 0


def pg_at(url: str, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared history's steps up to ``version``, applied by the migrator itself."""
    with monkeypatch.context() as m:  # the migrator itself, told this version is the newest
        m.setattr(pg_admin, "SCHEMA_VERSION", version)
        m.setattr("workerproc.store.postgres.dialect.SCHEMA_VERSION", version)
        open_store(url).close()


def pg_as_released(schema: str, legacy: int) -> None:
    """The version table as a release before the shared history left it at ``legacy``: one row
    per step of PostgreSQL's own numbering, no names."""
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(f"DELETE FROM {pg_schema.VERSION_TABLE}")
        conn.execute(f"ALTER TABLE {pg_schema.VERSION_TABLE} DROP COLUMN name")
        conn.execute(f"INSERT INTO {pg_schema.VERSION_TABLE} (version) "
                     "SELECT generate_series(1, %s)", (legacy,))  # fmt: skip


def pg_rows(schema: str) -> list[tuple[int, str | None]]:
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        return conn.execute(f'SELECT version, name FROM "{schema}".{pg_schema.VERSION_TABLE} '
                            "ORDER BY version").fetchall()  # fmt: skip


def test_the_engines_share_one_history() -> None:
    """One list of steps, by number and name, on both engines; SQLite's numbers unchanged (so
    its released databases keep their version); PostgreSQL's released versions map onto it
    in order, each onto a step PostgreSQL runs (the last onto 28: later steps came since)."""
    assert SCHEMA_VERSION == len(HISTORY) == len(set(HISTORY))
    assert len(sqlite_schema.MIGRATIONS) == len(pg_schema.MIGRATIONS) == SCHEMA_VERSION
    sqlite_empty = [n for n, sql in enumerate(sqlite_schema.MIGRATIONS, 1) if not sql]
    assert sqlite_empty == [32]  # PostgreSQL's own: its lease owners unindexed
    legacy = pg_schema.LEGACY_VERSIONS
    assert sorted(legacy) == list(range(1, 22))
    assert [legacy[k] for k in sorted(legacy)] == sorted(set(legacy.values()))
    assert all(pg_schema.MIGRATIONS[step - 1] for step in legacy.values())
    assert legacy[21] == 28 and all(legacy[k] > k for k in legacy)
    empty = [n for n, sql in enumerate(pg_schema.MIGRATIONS, 1) if not sql]
    # SQLite's own: its triggers, its id tables, its leases' own table (PostgreSQL's since 9)
    assert empty == [3, 8, 24, 29, 30]
    with pytest.raises(ValueError, match="not in the history"):
        steps("sqlite", {"no_such_step": "SELECT 1"})


@pytest.mark.postgres
@pytest.mark.parametrize("legacy", range(1, 22))
def test_postgres_released_version_migrates_forward_with_its_rows(
    legacy: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database a release before the shared history left at its version ``legacy``."""
    url = pg_session.schema_url("fwd")
    schema = url.rsplit("schema=", 1)[1]
    pg_at(url, pg_schema.LEGACY_VERSIONS[legacy], monkeypatch)
    pg_as_released(schema, legacy)
    assert pg_version(schema) == legacy
    ids = pg_fill(schema)
    store = open_store(url)
    try:
        rows = pg_rows(schema)  # renumbered and named, then the missing steps
        assert [v for v, _ in rows] == sorted(
            {pg_schema.LEGACY_VERSIONS[k] for k in range(1, legacy + 1)}
            | set(range(pg_schema.LEGACY_VERSIONS[legacy] + 1, SCHEMA_VERSION + 1))
        )
        assert all(name == HISTORY[v - 1] for v, name in rows)
        assert pg_version(schema) == SCHEMA_VERSION > 21  # every release before refuses it
        check_forward(store, ids, streamed=pg_schema.LEGACY_VERSIONS[legacy] >= STREAMS)
    finally:
        store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_postgres_version_migrates_forward_with_its_rows(
    version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_session.schema_url("fwd")
    schema = url.rsplit("schema=", 1)[1]
    pg_at(url, version, monkeypatch)
    assert pg_version(schema) == version
    ids = pg_fill(schema)
    store = open_store(url)
    try:
        assert pg_rows(schema) == [(v, HISTORY[v - 1]) for v in range(1, SCHEMA_VERSION + 1)]
        check_forward(store, ids, streamed=STREAMS <= version < BATCHES)
    finally:
        store.close()


@pytest.mark.postgres
def test_the_last_released_postgres_schema_serves_a_callers_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left at the last released PostgreSQL version (its old version table): the store migrates
    it to the current one, and a transactional enqueue's check of the caller's connection
    takes it."""
    url = pg_session.schema_url("fwd")
    schema = url.rsplit("schema=", 1)[1]
    pg_at(url, pg_schema.LEGACY_VERSIONS[21], monkeypatch)
    pg_as_released(schema, 21)
    store = open_store(url)
    try:
        with psycopg.connect(pg_session.database_url()) as conn:
            run = store.start_run("t", tx=conn)
            conn.commit()
        assert store.get_run(run) is not None
    finally:
        store.close()
    assert pg_version(schema) == SCHEMA_VERSION


@pytest.mark.postgres
def test_a_schema_above_the_current_version_is_refused_in_either_numbering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A newer leasekeeper's schema is refused, as every release refuses one above its own."""
    for named in (True, False):
        url = pg_session.schema_url("fwd")
        schema = url.rsplit("schema=", 1)[1]
        pg_at(url, SCHEMA_VERSION, monkeypatch)
        if not named:
            pg_as_released(schema, 21)
        with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{schema}".{pg_schema.VERSION_TABLE} (version) '
                         "VALUES (%s)", (SCHEMA_VERSION + 1,))  # fmt: skip
        with pytest.raises(SchemaTooNew, match="newer"):
            open_store(url)
