"""PostgreSQL's batches (``store/postgres/tx.py``: ``Batch``): several statements in one round
trip as ``EXECUTE``s of statements the session prepared, their values quoted by the driver."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest
from store_backends import PostgresBackend

from workerproc.store.errors import StoreError
from workerproc.store.postgres.steps import CATALOGUE
from workerproc.store.postgres.tx import Batch, Prepared, _session_prepared

pytestmark = pytest.mark.timeout(120)


def _session(pg: PostgresBackend) -> psycopg.Connection[Any]:
    conn = pg.connect()
    conn.autocommit = False
    return conn


def test_every_statement_of_the_catalogue_can_be_prepared_by_a_session(
    pg_migrated: PostgresBackend,
) -> None:
    """Any statement may go in a batch, so the server must infer every parameter's type from
    where it stands (one it cannot name would fail the first batch that sends it)."""
    statements = {name: sql for name, sql in CATALOGUE.items() if isinstance(sql, str)}
    assert len(statements) > 50
    with _session(pg_migrated) as conn:
        for name, sql in sorted(statements.items()):
            form = Prepared.of(name, sql)
            assert "%(" not in form.prepare, name
            conn.execute(form.prepare)
        conn.rollback()


def test_a_batch_answers_each_statement_in_order_with_its_values_intact(
    pg_migrated: PostgresBackend,
) -> None:
    echo = (
        "SELECT %(text)s::text, %(ids)s::bigint[], %(x)s::float8, %(flag)s::boolean, %(none)s::text"
    )
    tricky = ["it's", 'a "quote"', "back\\slash", "%(not_a_param)s", "ünïcødé", "a;b--c", ""]
    calls = [
        ("ECHO", echo, {"text": t, "ids": [1, 2**40, -3], "x": x, "flag": i % 2 == 0, "none": None})
        for i, (t, x) in enumerate(
            zip(tricky, [1.5, -0.0, 1e300, math.inf, -math.inf, 3, 0], strict=True)
        )
    ]
    calls.append(("EMPTY", "SELECT 1 WHERE %(never)s::boolean", {"never": False}))
    with _session(pg_migrated) as conn:
        out = Batch(conn).run(calls)
        conn.rollback()
    assert len(out) == len(calls)
    for (_, _, params), (rows, changed) in zip(calls[:-1], out[:-1], strict=True):
        assert rows == [(params["text"], [1, 2**40, -3], params["x"], params["flag"], None)]
        assert changed == 1
    assert out[-1] == ([], 0)


def test_each_statement_runs_after_the_one_before_and_counts_the_rows_it_changed(
    pg_migrated: PostgresBackend,
) -> None:
    write = "UPDATE limits SET rate = %(rate)s WHERE name = %(name)s"
    read = "SELECT rate FROM limits WHERE name = %(name)s"
    with _session(pg_migrated) as conn:
        conn.execute(
            "INSERT INTO limits (name, rate, declared, declared_by, declared_at) "
            "VALUES ('a', 1, '{}', 'test', 0), ('b', 1, '{}', 'test', 0)"
        )
        out = Batch(conn).run(
            [
                ("W", write, {"rate": 7.0, "name": "a"}),
                ("W", write, {"rate": 8.0, "name": "nobody"}),
                ("R", read, {"name": "a"}),
            ]
        )
        conn.rollback()
    assert [changed for _, changed in out] == [1, 0, 1]
    assert out[2][0] == [(7.0,)]


def test_a_failed_statement_skips_the_rest_and_the_session_keeps_what_it_prepared(
    pg_migrated: PostgresBackend,
) -> None:
    read = "SELECT count(*) FROM limits WHERE name = %(name)s"
    fails = "SELECT 1 / %(zero)s::int"
    marker = (
        "INSERT INTO limits (name, rate, declared, declared_by, declared_at) "
        "VALUES (%(name)s, 1, '{}', 't', 0)"
    )
    with _session(pg_migrated) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            Batch(conn).run([("R", read, {"name": "x"}), ("F", fails, {"zero": 0}),
                             ("M", marker, {"name": "after"})])  # fmt: skip
        conn.rollback()
        known = set(_session_prepared[conn])
        assert {Prepared.of("R", read).name, Prepared.of("F", fails).name} <= known
        # prepared once per connection: the next batch prepares nothing again, and runs
        out = Batch(conn).run([("R", read, {"name": "after"}), ("F", fails, {"zero": 1})])
        assert out == [([(0,)], 1), ([(1,)], 1)]
        conn.rollback()


def test_a_statement_whose_text_changes_is_another_prepared_statement() -> None:
    one = Prepared.of("SAME", "SELECT %(a)s::int + %(b)s::int + %(a)s::int")
    other = Prepared.of("SAME", "SELECT %(a)s::int - %(b)s::int")
    assert one.name != other.name
    assert one.prepare.endswith("SELECT $1::int + $2::int + $1::int")
    assert one.execute == f"EXECUTE {one.name}(%(a)s, %(b)s)"
    bare = Prepared.of("NONE", "SELECT 1")
    assert bare.execute == f"EXECUTE {bare.name}"


def _one_finished(store: Any, lease: Any) -> None:
    from workerproc.store import Commit  # noqa: PLC0415

    out = store.commit_many([Commit(lease, "finish", expected_revision=lease.revision)])
    assert [r.value for r in out.results] == ["ok"]


def test_after_a_rolled_back_failure_the_connection_prepares_its_statements_again(
    pg_migrated: PostgresBackend,
) -> None:
    """The driver deallocates a session's prepared statements after a ROLLBACK it sends; the
    store's next commit on that connection (with its events) once failed, and every one
    after it, with "prepared statement ... does not exist", until the connection was
    replaced (a lock timeout, a deadlock's retry or any failed statement led there)."""
    store = pg_migrated.open()
    store.start_runs([{"task": "t"}] * 3)
    first, second, third = store.claim("w", 60, limit=3)
    _one_finished(store, first)  # the events' statement and the batches' are prepared now
    with pytest.raises(StoreError):  # a statement fails: rolled back, the connection stays
        store.dialect.write(lambda tx: tx.execute("SELECT 1 / 0", {}).fetchall())
    _one_finished(store, second)
    _one_finished(store, third)
    store.close()


def test_statements_deallocated_behind_the_stores_back_cost_one_retry(
    pg_migrated: PostgresBackend,
) -> None:
    """Prepared statements gone without the driver knowing (a pooler's DISCARD, say): the
    exchange that meets one is rolled back, the session prepares them again, and it lands."""
    from workerproc.store import ClaimRequest, Commit  # noqa: PLC0415

    store = pg_migrated.open()
    store.start_runs([{"task": "t"}] * 4)
    leases = store.claim("w", 60, limit=2)
    _one_finished(store, leases[0])
    conn = store.dialect._conn()
    assert conn.pgconn.exec_(b"DEALLOCATE ALL").status == psycopg.pq.ExecStatus.COMMAND_OK
    out = store.commit_many([Commit(leases[1], "finish", expected_revision=leases[1].revision)],
                            claim=ClaimRequest("w", 60.0, limit=2))  # fmt: skip
    assert [r.value for r in out.results] == ["ok"] and len(out.leases) == 2
    store.close()


def test_a_claim_alone_reads_its_first_gates_in_the_round_trip_that_locks_them(
    pg_migrated: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gated claim in a transaction that settled no gate: ``OPEN_MARKED`` locks the open
    gates, and their states and first runs come back in the same query (read by statements
    after its locks), never in a round trip of their own; the per-key cap still holds."""
    from limits_helpers import limited  # noqa: PLC0415

    from workerproc.store import Commit  # noqa: PLC0415
    from workerproc.store.limits import LimitSpec  # noqa: PLC0415

    store = pg_migrated.open()
    try:
        limited(store, LimitSpec.declare("per-tenant", concurrency=1, per="tenant"))
        store.start_runs([{"task": "call", "payload": {"tenant": f"t{i % 16}"}} for i in range(48)])
        sent: list[str] = []
        execute = psycopg.Cursor.execute

        def counted(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(str(query))
            return execute(cur, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        for _ in range(2):  # (both turns: the gates first, and the plain walk first)
            sent.clear()
            got = store.claim("w", 60.0, limit=16)
            assert sorted(lease.payload["tenant"] for lease in got) == sorted(
                f"t{i}" for i in range(16)
            )
            assert store.claim("v", 60.0, limit=16) == []  # every key holds its one slot
            run = [q for q in sent if not q.startswith("PREPARE")]  # (a session's first)
            looks = [q for q in run if "leasekeeper_open_marked" in q]
            assert len(looks) == 2  # one per claim, the states and the runs with it
            assert all("leasekeeper_open_states" in q and "leasekeeper_open_lines" in q
                       for q in looks)  # fmt: skip
            assert not [q for q in run if "leasekeeper_gate_state" in q
                        or "leasekeeper_line_runs" in q]  # fmt: skip
            store.commit_many([Commit(lease, "finish", expected_revision=lease.revision,
                                      new_state={}) for lease in got])  # fmt: skip
    finally:
        store.close()
