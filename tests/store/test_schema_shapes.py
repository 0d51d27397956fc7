"""Both engines at the current version hold the same tables, columns and indexes, except the
differences docs/explanation/schema.md lists (each an engine's mechanism): a step that adds to
one engine only, and is not listed there, fails here."""

from __future__ import annotations

import os
import sqlite3

import pg_session
import psycopg
import pytest

from workerproc.store import open_store

# where the engines differ on purpose (docs/explanation/schema.md)
ONLY_SQLITE = {
    "run_ids",  # ids never reused: PostgreSQL's identity sequences never reuse one
    "runs.ready_at",  # idle workers sleep until it: PostgreSQL notifies
    "runs_ready",
    "leases_owner",  # PostgreSQL's reads of one owner's leases read the lease table whole
}
ONLY_POSTGRES = {
    "leasekeeper_schema",  # the version (SQLite: PRAGMA user_version)
    "runs.watched",  # a watched run's end notifies
    "events.seq",  # events numbered in commit order by a sequence
    "events_id",
    "events_unnumbered",
    "runs_prio",  # indexes its planner's walks need
    "runs_finished",
    "fence_rejections_at",
}


def sqlite_shape(path: str) -> set[str]:
    open_store(path).close()
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        shape = set(tables)
        for table in tables:
            shape |= {f"{table}.{r[1]}" for r in conn.execute(f"PRAGMA table_info({table})")}
        indexes = "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        return shape | {r[0] for r in conn.execute(indexes)}
    finally:
        conn.close()


def postgres_shape(url: str, schema: str) -> set[str]:
    open_store(url).close()
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND indexname NOT LIKE "
            "'%%\\_pkey'",
            (schema,),
        ).fetchall()
    return {t for t, _ in columns} | {f"{t}.{c}" for t, c in columns} | {i for (i,) in indexes}


@pytest.mark.postgres
def test_the_engines_hold_one_shape_but_for_the_listed_differences(
    tmp_path: os.PathLike[str],
) -> None:
    lite = sqlite_shape(os.path.join(os.fspath(tmp_path), "shape.db"))
    url = pg_session.schema_url("shape")
    pg = postgres_shape(url, url.rsplit("schema=", 1)[1])
    lite -= {n for n in lite if n.startswith("sqlite_")}
    assert without_columns_of_tables(lite - pg) == ONLY_SQLITE
    assert without_columns_of_tables(pg - lite) == ONLY_POSTGRES


def without_columns_of_tables(names: set[str]) -> set[str]:
    """The columns of a table only one engine has go with their table."""
    return {n for n in names if n.split(".", 1)[0] not in names or "." not in n}
