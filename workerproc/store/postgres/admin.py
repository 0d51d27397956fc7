"""What the PostgreSQL dialect does besides running the protocol's statements: migrations under
an advisory lock, the engine's own storage check (amcheck), and the check of a caller's own
connection before a transactional enqueue. Each runs inside a transaction the dialect opened."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from ..errors import StoreCorrupt, StoreError
from ..migrations import HISTORY
from . import reads_sql as r
from .ops_sql import CALLERS_DATABASE
from .schema import LEGACY_VERSIONS, MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE

Cursor = psycopg.Cursor[Any]


# -- migrations ---------------------------------------------------------------------------------
def version(cur: Cursor, schema: str, where: str) -> int:
    """The schema's version in the shared history (0: none yet; a version table from before it
    read through ``LEGACY_VERSIONS``); StoreCorrupt for a ``runs`` table that is not ours."""
    found, named = stored_version(cur, schema, where)
    return found if named else LEGACY_VERSIONS.get(found, found)


def stored_version(cur: Cursor, schema: str, where: str) -> tuple[int, bool]:
    """The highest version the table holds (what every release reads: one above its own is
    refused), and whether it numbers the shared history (its rows are named) or is a table from
    before it, in PostgreSQL's own numbering."""
    cur.execute("SELECT to_regclass(%s)", (f"{schema}.{VERSION_TABLE}",))
    row = cur.fetchone()
    if row is None or row[0] is None:
        cur.execute("SELECT to_regclass(%s)", (f"{schema}.runs",))
        found = cur.fetchone()
        if found is not None and found[0] is not None:
            raise StoreCorrupt(
                f"{where}: schema {schema} has a runs table that is not leasekeeper's "
                "(no version table)"
            )
        return 0, True
    cur.execute(
        sql.SQL(
            "SELECT (SELECT max(version) FROM {}), EXISTS (SELECT FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = 'name' AND NOT attisdropped)"
        ).format(sql.Identifier(VERSION_TABLE)),
        (f"{schema}.{VERSION_TABLE}",),
    )
    got = cur.fetchone()
    assert got is not None
    return (int(got[0]) if got[0] is not None else 0), bool(got[1])


def migrate_locked(cur: Cursor, schema: str, where: str) -> None:
    """Every missing step, in this one transaction (DDL is transactional)."""
    # Two hosts starting at once: the second waits here, then finds nothing left to do.
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"leasekeeper:{schema}",))
    # a migration's statements may read whole tables: let the planner scan them (our sessions
    # turn sequential scans off for the hot path's bounded walks)
    cur.execute("SET LOCAL enable_seqscan = on")
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    stored, named = stored_version(cur, schema, where)
    table = sql.Identifier(VERSION_TABLE)
    if stored == 0 and named:
        cur.execute(
            sql.SQL(
                "CREATE TABLE {} (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp(), name text)"
            ).format(table)
        )
    found = stored if named else LEGACY_VERSIONS.get(stored, stored)
    if not named:  # from before the shared history: its rows renumbered and named, in place
        cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN name text").format(table))
        cur.execute(sql.SQL("UPDATE {} SET version = -version").format(table))
        cur.execute(
            sql.SQL(
                "UPDATE {} AS v SET version = m.new, name = m.name FROM"
                " unnest(%s::int[], %s::int[], %s::text[]) AS m (old, new, name)"
                " WHERE v.version = -m.old"
            ).format(table),
            (
                list(LEGACY_VERSIONS),
                list(LEGACY_VERSIONS.values()),
                [HISTORY[new - 1] for new in LEGACY_VERSIONS.values()],
            ),
        )
    insert = sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(table)
    for target in range(found + 1, SCHEMA_VERSION + 1):
        if MIGRATIONS[target - 1]:  # a step of SQLite's only: nothing to run here
            cur.execute(MIGRATIONS[target - 1].encode(), prepare=False)  # a script: no parameters
        cur.execute(insert, (target, HISTORY[target - 1]))


# -- the engine's check of its own storage ------------------------------------------------------
def amcheck(cur: Cursor) -> str | None:
    """The schema of the amcheck extension in this database, None when not installed."""
    row = cur.execute(r.AMCHECK, prepare=None).fetchone()
    return None if row is None else str(row[0])


def check_storage(cur: Cursor, namespace: str, schema: str, quick: bool, limit: int) -> list[str]:
    """amcheck, installed in ``namespace``: every B-tree index of our schema
    (``bt_index_check``; without ``quick`` also that every heap row is indexed) and, without
    ``quick``, every table's pages (``verify_heapam``)."""
    ns = sql.Identifier(namespace)
    bt = sql.SQL("SELECT {}.bt_index_check(%s::regclass, %s)").format(ns)
    heap = sql.SQL("SELECT blkno, offnum, msg FROM {}.verify_heapam(%s::regclass) LIMIT %s").format(
        ns
    )
    found: list[str] = []
    for (index,) in cur.execute(r.OUR_INDEXES, {"schema": schema}, prepare=None).fetchall():
        try:
            cur.execute(bt, (index, not quick))
        except psycopg.Error as exc:  # corruption is reported, never raised
            found.append(f"index {index}: {str(exc).strip()}")
    if not quick:
        for (table,) in cur.execute(r.OUR_TABLES, {"schema": schema}, prepare=None).fetchall():
            rows = cur.execute(heap, (table, limit)).fetchall()
            found += [f"table {table}, block {b}, item {o}: {m}" for b, o, m in rows]
    return found[:limit]


# -- transactional enqueue ----------------------------------------------------------------------
def callers(tx: object, database: str, schema: str, where: str) -> psycopg.Connection[Any]:
    """The caller's connection, checked: a psycopg connection to our ``database`` and
    ``schema`` at our version, inside a transaction (or about to begin one with its first
    statement)."""
    if not isinstance(tx, psycopg.Connection):
        raise StoreError("tx must be the caller's psycopg.Connection to the same database")
    status = tx.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise StoreError("tx's transaction has failed: roll it back first")
    if status == TransactionStatus.IDLE and tx.autocommit:
        raise StoreError(
            "tx is in autocommit mode: begin a transaction first (with tx.transaction())"
        )
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        raise StoreError("tx is busy or closed: pass a connection between statements")
    try:
        with tx.cursor(row_factory=tuple_row) as cur:
            found = cur.execute("SELECT current_database(), to_regclass(%s) IS NOT NULL",
                                (f'"{schema}".{VERSION_TABLE}',)).fetchone()  # fmt: skip
            assert found is not None
            theirs, ours = found
            if theirs == database and ours:
                row = cur.execute(CALLERS_DATABASE.format(s=f'"{schema}".')).fetchone()
                at = None if row is None else row[1] if row[2] else LEGACY_VERSIONS.get(row[1])
                ours = at == SCHEMA_VERSION
    except psycopg.Error as exc:
        raise StoreError(f"tx cannot be used: {str(exc).strip()}") from None
    if theirs != database or not ours:
        raise StoreError(
            f"tx is connected to database {theirs!r}, not to {where} (schema {schema})"
        )
    return tx
