"""Claims and the exchange (``commit_many``): every commit kind's answer, its fence (R2: a
superseded attempt is refused, recorded with its op, and changes nothing), conflicts (R5)
and bad input (nothing written)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from store_backends import snapshot

from workerproc.store import CasResult, ClaimRequest, Commit, InvalidPayload

from .kit import KINDS, TTL, Driver, last_word, verb


@verb("commit_many")
def test_claim_in_the_exchange_writes_a_lease(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    run_id = s.start_run("t", {"doc": 1}, {"n": 0}, queue="q1", priority=3)
    out = driver.exchange(claim=ClaimRequest("w1", 30, queues=("q1",)))
    assert out.results == () and out.failed == ()
    (lease,) = out.leases
    assert (lease.run_id, lease.task, lease.payload, lease.state, lease.owner) == (
        run_id, "t", {"doc": 1}, {"n": 0}, "w1")  # fmt: skip
    assert (lease.attempt, lease.expires_at, lease.queue, lease.started) == (
        1, clock.now + 30, "q1", True)  # fmt: skip
    assert s.get_run(run_id).status == "running"  # type: ignore[union-attr]
    assert driver.exchange(claim=ClaimRequest("w2", 30)).leases == ()


@verb("commit_many")
def test_claim_serves_only_its_queues_up_to_its_limit_one_per_run(driver: Driver) -> None:
    s = driver.store
    ids = [s.start_run("t", queue=q) for q in ("a", "a", "a", "b")]
    leases = driver.exchange(claim=ClaimRequest("w1", TTL, limit=5, queues=("a",))).leases
    assert sorted(lease.run_id for lease in leases) == ids[:3]
    held = driver.exchange(claim=ClaimRequest("w1", TTL, limit=1, start=0)).leases
    assert [(lease.run_id, lease.started) for lease in held] == [(ids[3], False)]


@verb("commit_many")
def test_a_finish_and_the_next_claim_in_one_exchange(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    second = s.start_run("u")
    out = driver.exchange(last_word(lease, "finish"), claim=ClaimRequest("w1", TTL))
    assert out.results == (CasResult.OK,) and [x.run_id for x in out.leases] == [second]
    run = s.get_run(lease.run_id)
    assert run is not None and (run.status, run.result, run.state, run.revision) == (
        "succeeded", {"ok": 1}, {"n": 1}, 1)  # fmt: skip


@verb("commit_many")
@pytest.mark.parametrize("kind", KINDS)
def test_each_commit_kind_is_written(driver: Driver, kind: str) -> None:
    s, clock = driver.store, driver.clock
    if kind == "drop":  # what a holder writes when its run moved on without it
        lease = driver.lease("t")
        assert s.cancel_run(lease.run_id)
    else:
        lease = driver.lease("t")
    assert driver.commit(last_word(lease, kind)) is CasResult.OK
    run = s.get_run(lease.run_id)
    assert run is not None
    tasks = {t.id: t for t in s.get_tasks(lease.run_id)}
    mine = tasks[lease.task_id]
    if kind in ("finish", "advance", "drop", "wait", "spawn"):
        assert mine.done_at is not None and mine.done_attempt == 1 and mine.done_owner == "w1"
    if kind == "finish":
        assert run.status == "succeeded" and run.result == {"ok": 1}
    elif kind == "advance":
        (nxt,) = [t for t in tasks.values() if t.id != lease.task_id]
        assert (nxt.name, nxt.payload, run.state, run.status) == (
            "next", {"p": 2}, {"n": 1}, "pending")  # fmt: skip
    elif kind == "release":
        assert mine.done_at is None and mine.lease_owner is None and mine.last_error == "boom"
        assert mine.available_at == clock.now + 5
    elif kind == "fail":
        assert (run.status, run.failure_reason, run.last_error) == ("failed", "gave_up", "bad")
    elif kind == "drop":
        assert run.status == "cancelled"
    elif kind == "handback":  # back at once, and no attempt spent
        assert mine.lease_owner is None and mine.available_at <= clock.now
        assert driver.claim("w2").tries == 1
    elif kind == "retry_after":
        assert mine.available_at == clock.now + 5 and mine.lease_owner is None
        clock.advance(5)
        assert driver.claim("w2").tries == 1
    elif kind in ("wait", "park"):
        wanted = "signal:go" if kind == "wait" else "outcome_unknown:pay"
        assert (run.status, run.waiting_for) == ("waiting", wanted)
    elif kind == "spawn":
        (child,) = s.run_children(lease.run_id)
        assert child[1:] == ("pending", "kid") and run.status == "waiting"
        kid = s.get_run(child[0])
        assert kid is not None and kid.parent_id == lease.run_id


@verb("commit_many")
@pytest.mark.parametrize("kind", KINDS)
def test_a_superseded_attempt_is_refused_recorded_and_changes_nothing(
    driver: Driver, kind: str
) -> None:
    s = driver.store
    old, new = driver.zombie("t")
    before = snapshot(s, old.run_id)
    assert driver.commit(last_word(old, kind)) is CasResult.LEASE_LOST
    assert snapshot(s, old.run_id) == before
    (refusal,) = s.run_rejections(old.run_id)
    assert (refusal.task_id, refusal.owner, refusal.attempt, refusal.op) == (
        old.task_id, "zombie", 1, kind)  # fmt: skip
    refused = [e for e in s.events(run=old.run_id) if e.kind == "write.refused"]
    assert [e.data["op"] for e in refused] == [kind]
    assert s.run_children(old.run_id) == []  # a refused spawn starts no child
    assert driver.finish(new) is CasResult.OK  # the successor is untouched


@verb("commit_many")
def test_an_expired_lease_nobody_took_is_refused_too(driver: Driver) -> None:
    lease = driver.lease("t")
    driver.clock.advance(TTL + 1)
    assert driver.finish(lease) is CasResult.LEASE_LOST
    assert [r.op for r in driver.store.run_rejections(lease.run_id)] == ["finish"]


@verb("commit_many")
def test_a_wrong_owner_or_attempt_is_refused(driver: Driver) -> None:
    lease = driver.lease("t")
    assert driver.finish(replace(lease, owner="w9")) is CasResult.LEASE_LOST
    assert driver.finish(replace(lease, attempt=2)) is CasResult.LEASE_LOST
    assert [(r.owner, r.attempt) for r in driver.refusals("finish")] == [("w9", 1), ("w1", 2)]
    assert driver.finish(lease) is CasResult.OK


@verb("commit_many")
def test_a_moved_revision_is_a_conflict_not_a_refusal(driver: Driver) -> None:
    lease = driver.lease("t", state={"n": 0})
    assert driver.finish(lease, revision=7) is CasResult.CONFLICT
    assert driver.store.fence_rejections() == []
    assert driver.store.get_run(lease.run_id).status == "running"  # type: ignore[union-attr]


@verb("commit_many")
def test_a_batch_judges_each_commit_alone(driver: Driver) -> None:
    s = driver.store
    old, _ = driver.zombie("t")
    other = driver.lease("u")
    out = driver.exchange(last_word(old, "finish"), last_word(other, "finish"))
    assert out.results == (CasResult.LEASE_LOST, CasResult.OK)
    assert s.get_run(other.run_id).status == "succeeded"  # type: ignore[union-attr]
    assert s.get_run(old.run_id).status == "running"  # type: ignore[union-attr]


@verb("commit_many")
def test_bad_values_raise_and_write_nothing(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    good = driver.lease("u")
    before = snapshot(s, lease.run_id, good.run_id)
    bad = [Commit(lease, "finish", new_state={"x": float("nan")}),
           Commit(lease, "finish", result=object()),
           Commit(lease, "advance", next_task=""),
           Commit(lease, "advance", next_task="n", next_payload={1, 2})]  # fmt: skip
    for commit in bad:
        with pytest.raises(InvalidPayload):
            driver.exchange(last_word(good, "finish"), commit)
    assert snapshot(s, lease.run_id, good.run_id) == before
    with pytest.raises(ValueError):
        driver.exchange(claim=ClaimRequest("w1", TTL, start=-1))
    with pytest.raises(ValueError):
        driver.exchange(Commit(lease, "bogus"))  # type: ignore[arg-type]
