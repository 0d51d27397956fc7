"""Paid calls (B13): ``begin_call``, ``keep_call``, ``resolve``, ``forget_call``, ``paid_calls``,
``call_timeline``, ``paid_call_totals``, ``spend``, ``store_identity``: the intent is fenced
(no call begins on a lost lease), the keep is not (first answer wins), and the errors."""

from __future__ import annotations

import hashlib

import pytest

from workerproc.store import (
    CasResult,
    Commit,
    InvalidPayload,
    Lease,
    RunNotFound,
    RunOver,
    StoreError,
)
from workerproc.store.calls import CallKey
from workerproc.store.types import Usage

from .kit import Driver, last_word, verb


def key(lease: Lease, name: str = "pay", request: str = "h1") -> CallKey:
    return CallKey(lease.run_id, lease.task_id, name, hashlib.sha256(request.encode()).hexdigest())


@verb("begin_call", "keep_call")
def test_an_intent_then_a_keep_then_a_reuse(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t", {"tenant": "acme"})
    start = s.begin_call(lease, key(lease))
    assert start.outcome == "call" and start.intent is not None and not start.again
    assert start.left == pytest.approx(lease.expires_at - driver.clock.now)
    kept = s.keep_call(lease, key(lease), {"a": 1}, 10, cost=0.5, intent=start.intent)
    assert (kept.result, kept.attempt, kept.tokens, kept.outcome) == ({"a": 1}, 1, 10, "kept")
    again = s.begin_call(lease, key(lease))
    assert again.outcome == "reused" and again.kept is not None
    assert (again.kept.result, again.kept.outcome) == ({"a": 1}, "reused")
    assert s.begin_call(lease, key(lease, request="h2")).outcome == "call"  # another request
    # a keep retried after its first try landed answers what that try did, counted once
    assert s.keep_call(lease, key(lease), {"a": 1}, 10, intent=start.intent).outcome == "kept"


@verb("begin_call")
def test_no_call_begins_on_a_lost_lease_or_an_ended_run(driver: Driver) -> None:
    s = driver.store
    old, new = driver.zombie("t")
    assert s.begin_call(old, key(old)).outcome == "lost"
    assert s.call_timeline(old.run_id) == []  # nothing written
    assert s.cancel_run(new.run_id)
    assert s.begin_call(new, key(new)).outcome == "over"


@verb("begin_call")
def test_an_intent_without_an_answer_is_paid_again_or_parked(driver: Driver) -> None:
    s = driver.store
    _, new = driver.zombie("t")
    s.begin_call(new, key(new))  # (new's intent, never answered)
    assert s.begin_call(new, key(new), "park").outcome == "park"
    again = s.begin_call(new, key(new), "pay")
    assert again.outcome == "call" and again.again


@verb("keep_call")
def test_the_first_kept_answer_wins(driver: Driver) -> None:
    s = driver.store
    old, new = driver.zombie("t")
    # a lost lease may still keep (the call was paid for), while the step is not done
    assert s.keep_call(old, key(new), "first").outcome == "kept"
    lost = s.keep_call(new, key(new), "second", 7)
    assert (lost.result, lost.outcome, lost.attempt) == ("first", "lost_race", 1)
    (call,) = s.paid_calls(new.run_id)
    assert (call.unused, call.unused_tokens) == (1, 7)


@verb("keep_call")
def test_no_answer_is_kept_once_the_step_is_done_and_a_bad_one_raises(driver: Driver) -> None:
    s = driver.store
    old, new = driver.zombie("t")
    assert driver.finish(new) is CasResult.OK
    assert s.keep_call(old, key(old), "late").outcome == "refused"
    assert s.paid_calls(old.run_id) == []
    live = driver.lease("u")
    with pytest.raises(InvalidPayload):
        s.keep_call(live, key(live), {"x": float("nan")})
    assert s.cancel_run(live.run_id)
    assert s.keep_call(live, key(live), "x").outcome == "ended"


@verb("resolve")
def test_resolve_keeps_an_answer_and_resumes_a_parked_run(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    s.begin_call(lease, key(lease))  # never answered: its worker died in the call
    parked = last_word(lease, "park")
    assert driver.commit(parked) is CasResult.OK
    assert s.get_run(lease.run_id).waiting_for == "outcome_unknown:pay"  # type: ignore[union-attr]
    done = s.resolve(lease.run_id, "pay", {"paid": True})
    assert (done.kept, done.settled, done.resumed) == (True, 1, True)
    resumed = driver.claim("w2")
    assert s.begin_call(resumed, key(lease)).kept.result == {"paid": True}  # type: ignore[union-attr]
    assert s.resolve(lease.run_id, "pay", pay_again=True).kept is False


@verb("resolve")
def test_resolve_refuses_unknown_runs_finished_runs_and_calls(driver: Driver) -> None:
    s = driver.store
    with pytest.raises(RunNotFound):
        s.resolve(999, "pay", 1)
    lease = driver.lease("t")
    with pytest.raises(StoreError):
        s.resolve(lease.run_id, "pay", 1)  # no call of that name
    s.begin_call(lease, key(lease))
    with pytest.raises(StoreError):
        s.resolve(lease.run_id, "pay")  # neither an answer nor pay_again
    with pytest.raises(StoreError):
        s.resolve(lease.run_id, "pay", 1, pay_again=True)  # both
    assert driver.finish(lease) is CasResult.OK
    with pytest.raises(RunOver):
        s.resolve(lease.run_id, "pay", 1)


@verb("forget_call")
def test_forget_call_drops_the_kept_answers_of_a_name(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    start = s.begin_call(lease, key(lease))
    s.keep_call(lease, key(lease), 1, intent=start.intent)
    assert s.forget_call(lease.run_id, "pay") == 1
    assert s.begin_call(lease, key(lease)).outcome == "call"  # paid afresh
    with pytest.raises(StoreError):
        s.forget_call(lease.run_id, "other")
    with pytest.raises(RunNotFound):
        s.forget_call(999, "pay")
    with pytest.raises(InvalidPayload):
        s.forget_call(lease.run_id, "")


@verb("paid_calls", "call_timeline", "paid_call_totals")
def test_the_reads_of_paid_calls(driver: Driver) -> None:
    s = driver.store
    assert s.paid_call_totals().started == 0 and s.paid_calls(1) == []
    assert s.call_timeline(1) == []
    lease = driver.lease("t")
    first = s.begin_call(lease, key(lease))
    s.keep_call(lease, key(lease), "a", 4, intent=first.intent)
    s.begin_call(lease, key(lease))  # reused
    (call,) = s.paid_calls(lease.run_id)
    assert (call.name, call.attempt, call.owner, call.tokens, call.reused, call.started) == (
        "pay", 1, "w1", 4, 1, 1)  # fmt: skip
    (intent,) = s.call_timeline(lease.run_id)
    assert (intent.attempt, intent.owner, intent.again) == (1, "w1", False)
    assert intent.answered_at == driver.clock.now
    totals = s.paid_call_totals()
    assert (totals.calls, totals.reused, totals.tokens, totals.saved_tokens, totals.started) == (
        1, 1, 4, 4, 1)  # fmt: skip


@verb("spend")
def test_spend_sums_calls_and_committed_usage_per_task_or_field(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t", {"tenant": "acme"})
    start = s.begin_call(lease, key(lease))
    s.keep_call(lease, key(lease), "a", 10, cost=1.5, intent=start.intent)
    done = Commit(lease, "finish", usage=Usage(tokens=5, cost=0.5))
    assert driver.commit(done) is CasResult.OK
    (row,) = s.spend()
    assert (row.key, row.entries, row.calls, row.tokens, row.cost) == ("t", 2, 1, 15, 2.0)
    (by_tenant,) = s.spend("tenant")
    assert (by_tenant.key, by_tenant.tokens) == ("acme", 15)
    assert s.spend(since=driver.clock.now + 1) == []
    with pytest.raises(StoreError):
        s.spend('a"b')


@verb("store_identity")
def test_store_identity_is_stable_per_database(driver: Driver) -> None:
    s = driver.store
    ident = s.store_identity()
    assert ident and driver.open().store_identity() == ident
    driver.backend.tamper("DELETE FROM store_identity")  # what no migration leaves
    with pytest.raises(StoreError, match="identity"):
        s.store_identity()
