"""Child runs (docs/protocol.md B14), in the store, on every backend, with the
fake clock: children are started by the parent's fenced spawn commit (a zombie's starts none),
the parent waits without a lease until the last child ended, its join task then runs once with
the children in spawn order; a cancel reaches the descendants; a retried child is waited for
again; prune keeps the children of a live parent."""

from __future__ import annotations

import pytest
from helpers import FakeClock

from workerproc import App, TaskContext
from workerproc.store import CasResult, Commit, Lease, Store
from workerproc.store.codec import WAIT_FOREVER
from workerproc.store.newrun import NewRun

TTL = 30.0


def spawn(s: Store, lease: Lease, n: int, then: str = "merge", queue: str = "default") -> CasResult:
    kids = tuple(NewRun.make("child", {"i": i}, None, 0, None, queue, 0) for i in range(n))
    commit = Commit(lease, "spawn", expected_revision=lease.revision, new_state={"spawned": n},
                    next_task=then, delay=WAIT_FOREVER, children=kids)  # fmt: skip
    return s.commit_many([commit]).results[0]


def finish(s: Store, lease: Lease, result: object = None) -> None:
    out = s.commit_many([Commit(lease, "finish", expected_revision=lease.revision,
                                new_state={}, result=result)])  # fmt: skip
    assert out.results == (CasResult.OK,)


def claim_all(s: Store, owner: str = "w") -> list[Lease]:
    return s.claim(owner, TTL, limit=50)


def status(s: Store, run_id: int) -> str:
    run = s.get_run(run_id)
    assert run is not None
    return run.status


def test_the_join_runs_once_after_the_last_child_with_their_results_in_order(s: Store) -> None:
    parent = s.start_run("fan_out", queue="default")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 3) is CasResult.OK
    run = s.get_run(parent)
    assert run is not None and run.status == "waiting" and run.waiting_for == "children"
    kids = claim_all(s)
    assert sorted(k.payload["i"] for k in kids) == [0, 1, 2]
    assert all(k.parent_id == parent and k.task == "child" for k in kids)
    by_i = {k.payload["i"]: k for k in kids}
    finish(s, by_i[2], "two")
    out = s.commit_many([Commit(by_i[0], "fail", reason="boom", error="child 0 broke")])
    assert out.results == (CasResult.OK,)
    assert claim_all(s) == []  # one child is still running: the parent waits
    assert status(s, parent) == "waiting"
    finish(s, by_i[1], {"one": 1})
    (join,) = claim_all(s)
    assert join.run_id == parent and join.task == "merge" and join.children is not None
    assert [c.run_id for c in join.children] == [by_i[i].run_id for i in range(3)]
    assert [c.status for c in join.children] == ["failed", "succeeded", "succeeded"]
    assert [c.result for c in join.children] == [None, {"one": 1}, "two"]
    assert join.children[0].error == "child 0 broke"
    finish(s, join)
    assert status(s, parent) == "succeeded" and claim_all(s) == []


def test_a_spawn_of_no_children_joins_at_once(s: Store) -> None:
    s.start_run("fan_out")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 0) is CasResult.OK
    (join,) = claim_all(s)
    assert join.task == "merge" and join.children == ()


def test_a_zombies_spawn_is_refused_and_starts_no_child(s: Store, clock: FakeClock) -> None:
    parent = s.start_run("fan_out")
    (zombie,) = claim_all(s, "zombie")
    clock.advance(TTL + 1)
    (taker,) = claim_all(s, "taker")
    assert spawn(s, zombie, 5) is CasResult.LEASE_LOST
    assert [r.id for r in s.list_runs()] == [parent]  # no orphan child
    assert spawn(s, taker, 2) is CasResult.OK
    assert len(s.list_runs()) == 3  # the taker's children, once


def test_a_child_that_spawns_children_of_its_own_still_counts_for_its_parent(s: Store) -> None:
    """Found by tests/store/test_limits_stateful.py: a run that is a child and then a parent kept
    one column for both joins, so its end never reached its own parent's join."""
    parent = s.start_run("fan_out")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 1) is CasResult.OK
    (child,) = claim_all(s)
    assert spawn(s, child, 1, then="merge_child") is CasResult.OK  # a grandchild
    (grandchild,) = claim_all(s)
    finish(s, grandchild, "g")
    (child_join,) = claim_all(s)
    assert child_join.run_id == child.run_id and child_join.task == "merge_child"
    assert [c.result for c in child_join.children or ()] == ["g"]
    finish(s, child_join, "c")
    (join,) = claim_all(s)
    assert join.run_id == parent and join.task == "merge"
    assert [(c.run_id, c.result) for c in join.children or ()] == [(child.run_id, "c")]
    run = s.get_run(child.run_id)
    assert run is not None and run.parent_id == parent


def test_children_inherit_the_parents_queue_unless_told(s: Store) -> None:
    s.start_run("fan_out", queue="agents")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 2, queue=lease.queue) is CasResult.OK
    assert {r.queue for r in s.list_runs()} == {"agents"}


def test_cancelling_a_parent_cancels_its_descendants(s: Store) -> None:
    parent = s.start_run("fan_out")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 2) is CasResult.OK
    kids = claim_all(s)
    assert spawn(s, kids[0], 2, then="merge_grandchildren") is CasResult.OK  # grandchildren
    assert s.cancel_run(parent)
    assert {r.status for r in s.list_runs()} == {"cancelled"} and len(s.list_runs()) == 5
    assert claim_all(s) == []
    assert s.stats().runs.get("cancelled") == 5
    # the outbox: one run.cancelled per run, the descendants' naming the run cancelled
    cancelled = [e for e in s.events(after=0) if e.kind == "run.cancelled"]
    assert sorted(e.run_id for e in cancelled) == sorted(r.id for r in s.list_runs())
    assert [e.data.get("with_ancestor") for e in cancelled if e.run_id != parent] == [parent] * 4


def test_a_retried_child_is_waited_for_again(s: Store) -> None:
    parent = s.start_run("fan_out")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 2) is CasResult.OK
    a, b = sorted(claim_all(s), key=lambda k: k.payload["i"])
    assert s.commit_many([Commit(a, "fail", reason="boom")]).results == (CasResult.OK,)
    assert s.retry_run(a.run_id)  # the parent waits for it again
    finish(s, b, "b")
    assert claim_all(s)[0].run_id == a.run_id  # the retried child, not the join
    assert status(s, parent) == "waiting"
    (again,) = [x for x in s.get_tasks(a.run_id) if x.done_at is None]
    leases = claim_all(s)
    assert leases == []
    s.release_owner("w")
    (retried,) = claim_all(s, "w2")
    assert retried.task_id == again.id
    finish(s, retried, "a")
    (join,) = claim_all(s, "w2")
    assert join.children is not None and [c.result for c in join.children] == ["a", "b"]


def test_prune_keeps_the_children_of_a_live_parent(s: Store, clock: FakeClock) -> None:
    parent = s.start_run("fan_out")
    (lease,) = claim_all(s)
    assert spawn(s, lease, 2) is CasResult.OK
    a, b = claim_all(s)
    finish(s, a, 1)
    clock.advance(3600)
    assert s.prune(60) == 0  # the parent waits for b: a's result is still to be read
    (b,) = claim_all(s, "w2")  # b's lease ran out meanwhile: taken over
    finish(s, b, 2)
    (join,) = claim_all(s)
    finish(s, join)
    clock.advance(3600)
    assert s.prune(60) == 3 and s.get_run(parent) is None


@pytest.mark.parametrize("n", [1000])
def test_a_thousand_children_in_one_commit(s: Store, n: int) -> None:
    s.start_run("fan_out")
    (lease,) = claim_all(s)
    assert spawn(s, lease, n) is CasResult.OK
    assert s.stats().runs.get("pending") == n


def test_the_handler_api_end_to_end_in_the_test_mode() -> None:
    """ctx.spawn / ctx.children and ctx.wait_for / ctx.signal through a real execution (the
    test mode claims and commits as a worker does; its clock runs a wait out at once)."""
    app = App()

    @app.task
    def fan_out(ctx: TaskContext) -> None:
        ctx.spawn([{"task": "kid", "payload": i} for i in range(3)], then="merge")

    @app.task
    def kid(ctx: TaskContext) -> int:
        if ctx.payload == 1:
            raise ValueError("one is odd")
        return int(ctx.payload) * 10

    @app.task
    def merge(ctx: TaskContext) -> None:
        ctx.finish({}, result=[[c.status, c.result, c.error] for c in ctx.children])

    @app.task
    def draft(ctx: TaskContext) -> None:
        ctx.wait_for("go", next="publish", timeout=60, state={"d": 1})

    @app.task
    def publish(ctx: TaskContext) -> None:
        ctx.finish(ctx.state, result=ctx.signal is None)

    run = app.run_inline("fan_out", raise_errors=False, max_attempts=1)
    assert run.status == "succeeded" and run.result[0] == ["succeeded", 0, None]
    assert run.result[1][:2] == ["failed", None] and "one is odd" in run.result[1][2]
    assert run.result[2] == ["succeeded", 20, None]
    timed_out = app.run_inline("draft")
    assert timed_out.result is True and timed_out.state == {"d": 1}
    with pytest.raises(ValueError, match="at most 1000"):
        ctx_spawn_too_many(app)


def ctx_spawn_too_many(app: App) -> None:
    @app.task
    def greedy(ctx: TaskContext) -> None:
        ctx.spawn([{"task": "kid"}] * 1001, then="merge")

    app.run_inline("greedy")
