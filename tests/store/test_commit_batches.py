"""Completions are batches of N >= 1 commits on every backend: the pinned single-lease calls
(``ack``, ``compare_and_set``) are the N = 1 call of ``commit_many``, a batch that names a run
twice is written in order, each commit kind's behaviour is in one table, a claim's rows are
typed, and each dialect has one fence."""

from __future__ import annotations

from typing import get_args

import pytest
from helpers import FakeClock
from store_backends import TTL
from unfenced import SQLITE_FENCE

from workerproc.store import Commit, Store
from workerproc.store.codec import Encoded, commit_params, dumps
from workerproc.store.dialect import ClaimRow, Tx
from workerproc.store.driver import Advance, Handback, Release
from workerproc.store.limits import Gating
from workerproc.store.postgres import batch_sql
from workerproc.store.postgres import sql as postgres_sql
from workerproc.store.protocol.commits import KINDS, record
from workerproc.store.sqlite import sql as sqlite_sql
from workerproc.store.types import CommitKind


def test_ack_and_compare_and_set_are_commits_of_the_batch(s: Store, clock: FakeClock) -> None:
    """``Commit(lease, "ack")`` and ``Commit(lease, "compare_and_set", ...)`` in a batch with
    the worker's kinds answer as ``ack`` and ``compare_and_set`` do; refused, they are
    recorded under their own names."""
    acked, cased, released = (s.start_run("t", state={}) for _ in range(3))
    leases = {lease.run_id: lease for lease in s.claim("w", TTL, limit=3)}
    out = s.commit_many([
        Commit(leases[acked], "ack"),
        Commit(leases[cased], "compare_and_set", expected_revision=0, new_state={"x": 1}),
        Commit(leases[released], "release"),
    ])  # fmt: skip
    assert [r.value for r in out.results] == ["ok", "ok", "ok"]
    assert s.get_run(acked).status == "succeeded"  # its last task was acknowledged
    run = s.get_run(cased)
    assert (run.status, run.state, run.revision) == ("running", {"x": 1}, 1)
    assert s.renew(leases[cased], TTL)  # a compare-and-set keeps its lease
    stale = s.commit_many([
        Commit(leases[cased], "compare_and_set", expected_revision=0, new_state={"x": 2})
    ])  # fmt: skip
    assert stale.results[0].value == "conflict"  # the revision moved: not a lost lease
    clock.advance(TTL + 1)
    assert s.claim("other", TTL, limit=3)  # every old lease is a zombie's now
    zombies = s.commit_many([
        Commit(leases[cased], "ack"),
        Commit(leases[cased], "compare_and_set", expected_revision=1, new_state={"x": 3}),
    ])  # fmt: skip
    assert [r.value for r in zombies.results] == ["lease_lost", "lease_lost"]
    assert [r.op for r in s.fence_rejections()] == ["ack", "compare_and_set"]
    assert s.get_run(cased).state == {"x": 1}


def test_a_run_named_twice_in_one_batch_is_written_in_order(s: Store) -> None:
    """Commits of one run in one batch go one after the other: the first finish is written,
    the second finds its lease gone (lost, recorded); the other runs' commits around them
    are written as usual."""
    runs = [s.start_run("t", state={}) for _ in range(3)]
    leases = {lease.run_id: lease for lease in s.claim("w", TTL, limit=3)}
    first, second, third = (leases[run] for run in runs)
    out = s.commit_many([
        Commit(first, "finish"), Commit(second, "release"), Commit(first, "finish"),
        Commit(third, "handback"),
    ])  # fmt: skip
    assert [r.value for r in out.results] == ["ok", "ok", "lease_lost", "ok"]
    assert [r.op for r in s.fence_rejections()] == ["finish"]
    assert s.get_run(first.run_id).status == "succeeded"
    assert len(s.claim("w", TTL, limit=3)) == 2  # the released run and the handed back one


def test_every_commit_kind_has_its_behaviour_in_one_table() -> None:
    assert set(KINDS) == set(get_args(CommitKind))
    # the kinds written whole by a completion are batched; the others are written one by one
    assert {k for k, kind in KINDS.items() if kind.step} == {
        "finish", "advance", "release", "handback"
    }  # fmt: skip
    assert all((kind.step is None) == (kind.write is not None) for kind in KINDS.values())


def test_a_claims_rows_are_typed_on_every_backend(s: Store) -> None:
    """Each dialect builds a claim's rows as ``ClaimRow``, its fields named (an ungated
    claim: no gates, no reservation)."""
    run = s.start_run("t", {"p": 1}, state={"s": 2})
    params = {"owner": "w", "ttl": float(TTL), "queues": None, "start": True, "skip": [],
              "limit": 1}  # fmt: skip

    def claim(tx: Tx) -> list[ClaimRow]:
        rows = tx.rows("CLAIM", {**params, "now": tx.now})
        assert all(isinstance(row, ClaimRow) for row in rows)
        return rows  # type: ignore[return-value]

    (row,) = s.dialect.write(claim)
    assert (row.run_id, row.name, row.attempts, row.revision) == (run, "t", 1, 0)
    assert (row.takeover, row.queue, row.parent_id) == (False, "default", None)
    assert (row.gate_a, row.gate_b, row.gate_c, row.reserved) == (None, None, None, None)


@pytest.mark.parametrize(
    ("module", "fence", "fenced"),
    [
        (sqlite_sql, SQLITE_FENCE, ["CHECK_FENCE", "TASK_DONE", "HANDBACK_TASK", "RELEASE_TASK",
                                    "TASK_FAILED", "CAS_STATE", "CAS_FINISH", "RENEW"]),
        (postgres_sql, postgres_sql._FENCE, ["CHECK_FENCE", "TASK_DONE", "HANDBACK", "RELEASE",
                                             "TASK_FAILED", "SET_STATE", "FINISH", "ADVANCE",
                                             "RENEW_MANY"]),
    ],
)  # fmt: skip
def test_one_fence_per_dialect(module: object, fence: str, fenced: list[str]) -> None:
    """Every fenced statement of the commits and renewals carries the dialect's one fence
    (SQLite's is written out in each of its queries: the fence check's whole condition)."""
    assert not hasattr(module, "_FENCE_EACH")
    assert [name for name in fenced if fence not in getattr(module, name)] == []
    if module is sqlite_sql:
        assert f"SELECT run_id FROM leases WHERE {fence}" == sqlite_sql.CHECK_FENCE


def test_postgres_completions_take_a_values_row_per_commit() -> None:
    """Each completion's statement, written for a batch of N, has N rows of its columns, the
    lease's first, each commit's parameters its own."""
    for name, columns in [("FINISH", batch_sql.FINISH_COLUMNS),
                          ("ADVANCE", batch_sql.ADVANCE_COLUMNS),
                          ("RELEASE", batch_sql.RELEASE_COLUMNS),
                          ("HANDBACK", batch_sql.HANDBACK_COLUMNS),
                          ("SET_STATE", batch_sql.SET_STATE_COLUMNS)]:  # fmt: skip
        assert columns[:4] == batch_sql.LEASE
        statement = batch_sql.sized(getattr(postgres_sql, name), columns, 3)
        assert batch_sql.ROWS not in statement
        for k in range(3):
            assert all(f"%({column}_{k})s::{kind}" in statement for column, kind in columns)
        assert "%(run_id_3)s" not in statement


def test_a_batch_larger_than_one_statement_takes_goes_in_parts(
    s: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL sends a completion of more commits than ``MAX_BATCH`` in parts (a statement
    takes 65,535 values): each commit still answers on its own, in its place."""
    from workerproc.store.postgres import steps as postgres_steps  # noqa: PLC0415

    monkeypatch.setattr(postgres_steps, "MAX_BATCH", 2)
    runs = [s.start_run("t", state={}) for _ in range(5)]
    leases = {lease.run_id: lease for lease in s.claim("w", TTL, limit=5)}
    commits = [Commit(leases[run], "finish", expected_revision=3 if i == 2 else 0)
               for i, run in enumerate(runs)]  # fmt: skip
    out = s.commit_many(commits)
    assert [r.value for r in out.results] == ["ok", "ok", "conflict", "ok", "ok"]
    assert [s.get_run(run).status for run in runs] == ["succeeded"] * 2 + ["running"] + [
        "succeeded"
    ] * 2


def test_a_commit_is_encoded_as_a_typed_record_and_its_completion_built_from_it(
    s: Store,
) -> None:
    """A commit's values are encoded once into a typed record (``Encoded``: slots, no dict),
    and each completion the driver writes is built from it and the lease's fence, field by
    field; the next task's gating is placed on it."""
    s.start_run("t", state={})
    lease = s.claim("w", TTL)
    assert lease is not None
    commit = Commit(lease, "advance", expected_revision=2, new_state={"a": 1}, next_task="n",
                    next_payload=[1], delay=3)  # fmt: skip
    enc = commit_params(commit)
    assert isinstance(enc, Encoded) and not hasattr(enc, "__dict__")
    enc.place(Gating(("g1", "g2"), "g1", 5))
    fenced = (lease.run_id, lease.task_id, lease.attempt, lease.owner)
    assert record(Advance, lease, enc) == Advance(
        *fenced, 2, dumps({"a": 1}, "state"), None, "n", dumps([1], "payload"), 3.0,
        "g1", "g1", "g2", None, 5, None,
    )  # fmt: skip
    released = commit_params(Commit(lease, "release", delay=-1, error="boom"))
    assert record(Release, lease, released) == Release(*fenced, 0.0, "boom")
    assert record(Handback, lease, released) == Handback(*fenced)
