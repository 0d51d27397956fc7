"""The PostgreSQL claim while dead row versions cannot be removed (another client's snapshot
holds the horizon back): every run that ended since left a dead entry in the claim's indexes,
and the statistics count only the live rows, so the planner takes the "pending" indexes for
tiny. The claim still reads no dead prefix it can avoid: it walks from its floor
(docs/protocol.md, "The claim's floor"), the priority levels are found from the newest end of
runs_prio, the walk never takes the pending-status index, a run's lease and its head task are
looked up by their keys
(docs/how-to/postgresql.md, "When vacuum cannot run"). The long form:
tests/chaos/test_vacuum_blocked.py."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from helpers import FakeClock
from store_backends import PostgresBackend

from workerproc.store import Commit
from workerproc.store.postgres import floors
from workerproc.store.postgres import sql as postgres_sql
from workerproc.store.types import ClaimRequest

ENDED = 600  # runs ended while the snapshot is held: a dead entry each


READ = """SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0) FROM pg_class AS c
    WHERE c.relnamespace = current_schema()::regnamespace
      AND c.relname IN ('runs_claim', 'runs_prio')"""


def explain(pg: PostgresBackend, queues: list[str] | None) -> tuple[str, int]:
    """The claim's plan, walking from the floor a full walk finds now (with no lag), and how
    many entries of the claim indexes it read (live and dead: this transaction's counts)."""
    sql = postgres_sql.claim_sql(None if queues is None else len(queues), 1)
    params: dict[str, Any] = {"owner": "w", "ttl": 60.0, "now": None, "queues": queues,
                              "start": True, "lag": 0.0, "lo": -math.inf,
                              "hi": math.inf}  # fmt: skip
    with pg.connect() as conn, conn.transaction(force_rollback=True):
        for setting in ("enable_seqscan", "enable_bitmapscan", "jit"):  # as our sessions plan
            conn.execute(f"SET LOCAL {setting} = off")
        walk = floors.FLOOR_EVERY if queues is None else floors.FLOOR_NAMED
        levels = conn.execute(floors.LEVELS, params).fetchone()
        assert levels is not None
        row = conn.execute(walk, {**params, "levels": levels[0]}).fetchone()
        assert row is not None and row[0] is not None
        params["floor"] = min(row)  # the first live head, or now less the lag
        before = conn.execute(READ).fetchone()
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params).fetchall()
        after = conn.execute(READ).fetchone()
    assert before is not None and after is not None
    return "\n".join(row[0] for row in rows), int(after[0]) - int(before[0])


def node_details(plan: str, pattern: str) -> list[str]:
    """The lines of each plan node matching ``pattern``, its own details up to its first
    child, one string a node."""
    lines, out = plan.splitlines(), []
    for i, line in enumerate(lines):
        if not re.search(pattern, line):
            continue
        depth, own = len(line) - len(line.lstrip()), [line]
        for detail in lines[i + 1 :]:
            if detail.lstrip().startswith("->") or len(detail) - len(detail.lstrip()) <= depth:
                break
            own.append(detail)
        out.append("\n".join(own))
    return out


@pytest.mark.parametrize("queues", [None, ["b"]])
def test_a_claim_reads_no_dead_prefix_while_the_horizon_is_held(
    pg: PostgresBackend, queues: list[str] | None
) -> None:
    store = pg.open()
    # a snapshot held open (REPEATABLE READ, a row read): no row version that dies from now on
    # can be removed, nor its index entries marked dead, until it ends (a few seconds here)
    holder = pg.connect()
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM runs")
        store.start_runs([{"task": "t", "queue": "b"}] * ENDED)
        leases = store.claim("w", 60, limit=100)
        while leases:  # every run ends: its entries in runs_prio, runs_claim, ... die
            out = store.commit_many([Commit(lease, "finish") for lease in leases],
                                    claim=ClaimRequest("w", 60.0, limit=100))  # fmt: skip
            leases = list(out.leases)
        store.start_runs([{"task": "t", "queue": "b"}])  # new work after the drained queue
        with pg.connect() as conn:
            for table in ("runs", "tasks", "leases"):  # as autovacuum's ANALYZE does meanwhile
                conn.execute(f"ANALYZE {table}")
        plan, read = explain(pg, queues)
    finally:
        holder.close()
        store.close()
    assert "runs_status" not in plan, plan  # every run that ended left a dead 'pending' entry
    levels = node_details(plan, r"Index Only Scan .*using runs_prio on runs ")
    assert levels, plan
    for node in levels:  # found from the newest end: the live run, not 600 dead entries first
        fetches = re.search(r"Heap Fetches: (\d+)", node)
        assert fetches is not None and int(fetches.group(1)) < 20, (node, plan)
    walks = node_details(plan, r"Scan .*using runs_(claim|prio) on runs r ")
    assert walks and all("head_at >= " in node for node in walks), plan
    # from the floor: the ended runs' entries lie below it and are never read
    assert read < ENDED // 10, (read, plan)
    leases = node_details(plan, r"Scan .*on leases l ")
    assert leases, plan
    for node in leases:  # one descent a run walked, never every lease that ever was
        assert "Index Cond: (run_id = r.id)" in node, (node, plan)
    heads = node_details(plan, r"Scan .*on tasks t ")
    assert heads, plan
    for node in heads:  # the head task by its keys, never a walk of every pending entry
        assert "Index Cond:" in node and "run_id = " in node, (node, plan)
    assert re.search(r"Limit \(actual time=\S+ rows=1 loops=1\)", plan), plan  # it was claimed


def test_a_run_below_the_floor_waits_for_the_sweep(
    pg: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose head shows up below the connection's floor (its transaction committed long
    after it wrote the head, or its head was written earlier than the floor) is not walked
    until the sweep below the floor meets it: within a round of it (here, no dead rows, a few
    walks), and the floor moves down to it."""
    monkeypatch.setattr(floors, "LAG", 0.0)
    monkeypatch.setattr(floors, "WALK_EVERY", 3600.0)  # no walk but the first
    store = pg.open()
    try:
        store.start_run("t", queue="q")
        first = store.claim("w", 60, queues=["q"])  # the first walk: the floor is its head
        assert first is not None and store.commit_many([Commit(first, "finish")])
        late = store.start_run("t", queue="q")
        with pg.connect() as conn:  # its head written 100 s before the floor
            conn.execute("UPDATE tasks SET available_at = available_at - 100 WHERE run_id = %s",
                         (late,))  # fmt: skip
            conn.execute("UPDATE runs SET head_at = head_at - 100 WHERE id = %s", (late,))
        assert store.claim("w", 60, queues=["q"]) is None  # below the floor: not walked
        monkeypatch.setattr(floors, "WALK_EVERY", 0.0)  # each claim walks (and sweeps a piece)
        claims = []
        for _ in range(4):  # the pieces: below the first floor, then up to the floor
            claims.append(store.claim("w", 60, queues=["q"]))
            if claims[-1] is not None:
                break
        found = claims[-1]
        assert found is not None and found.run_id == late, claims
    finally:
        store.close()


def test_a_clock_that_went_back_walks_in_full(
    pg: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(floors, "WALK_EVERY", 3600.0)
    clock = FakeClock(1_000_000.0)
    store = pg.open(clock=clock)
    try:
        store.start_run("t")
        first = store.claim("w", 60)  # the floor: 10 s behind this clock
        assert first is not None and store.commit_many([Commit(first, "finish")])
        clock.now = 500_000.0  # an injected clock set back
        run = store.start_run("t")
        found = store.claim("w", 60)
        assert found is not None and found.run_id == run
    finally:
        store.close()
