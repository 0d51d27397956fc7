"""Batch steps (B23) in the store: a batch's claim (``ClaimRequest.task``: up to ``limit``
leases of one task's runs, each its own lease, attempt and fence; other tasks' runs, runs with a
live lease, runs not due and runs in a limit's line are left alone), ``begin_calls`` and
``keep_calls`` (each item's call its own), ``batch_started``."""

from __future__ import annotations

import hashlib

import pytest

from workerproc.store import ClaimRequest, InvalidPayload
from workerproc.store.calls import CallKey, KeepItem
from workerproc.store.limits import LimitSpec
from workerproc.store.types import TaskOptions

from .kit import TTL, Driver, last_word, verb


@verb("commit_many")
def test_a_batch_claim_takes_only_its_task_up_to_its_limit(driver: Driver) -> None:
    s = driver.store
    embeds = [s.start_run("embed", {"i": i}) for i in range(5)]
    others = [s.start_run("other") for _ in range(2)]
    s.start_run("embed", delay=60)  # not due
    out = driver.exchange(claim=ClaimRequest("w1", TTL, limit=3, task="embed"))
    assert [lease.run_id for lease in out.leases] == embeds[:3]
    assert {lease.task for lease in out.leases} == {"embed"}
    assert [lease.attempt for lease in out.leases] == [1, 1, 1]
    rest = driver.exchange(claim=ClaimRequest("w2", TTL, limit=10, task="embed")).leases
    assert [lease.run_id for lease in rest] == embeds[3:]  # the held ones are not claimed again
    plain = driver.exchange(claim=ClaimRequest("w3", TTL, limit=10)).leases
    assert sorted(lease.run_id for lease in plain) == others


@verb("commit_many")
def test_each_item_of_a_batch_claim_is_fenced_on_its_own(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    ids = [s.start_run("embed") for _ in range(3)]
    first = driver.exchange(claim=ClaimRequest("w1", TTL, limit=3, task="embed")).leases
    assert driver.finish(first[0]).value == "ok"
    clock.advance(TTL + 1)  # the other two lapse; another worker takes them over
    taken = driver.exchange(claim=ClaimRequest("w2", TTL, limit=3, task="embed")).leases
    assert [(lease.run_id, lease.attempt, lease.takeover) for lease in taken] == [
        (ids[1], 2, True), (ids[2], 2, True)]  # fmt: skip
    stale = driver.exchange(last_word(first[1], "finish"), last_word(taken[1], "finish"))
    assert [r.value for r in stale.results] == ["lease_lost", "ok"]


@verb("commit_many", "register_tasks", "declare_limits")
def test_a_batch_claim_leaves_runs_in_a_line_to_the_plain_claim(driver: Driver) -> None:
    s = driver.store
    spec = LimitSpec.declare("api", concurrency=2)
    assert s.declare_limits({"api": spec}, by="here") == []
    s.register_tasks({"embed": TaskOptions(limits=("api",))})
    for _ in range(3):
        s.start_run("embed")
    assert driver.exchange(claim=ClaimRequest("w1", TTL, limit=5, task="embed")).leases == ()
    admitted = driver.exchange(claim=ClaimRequest("w1", TTL, limit=5)).leases
    assert len(admitted) == 2  # a limit with room for two admits two


@verb("commit_many")
def test_a_batch_claim_names_a_task(driver: Driver) -> None:
    driver.store.start_run("t")
    with pytest.raises(InvalidPayload):
        driver.exchange(claim=ClaimRequest("w1", TTL, limit=2, task=""))
    assert driver.store.get_run(1).status == "pending"  # type: ignore[union-attr]


@verb("batch_started", "events")
def test_batch_started_records_each_live_item_once(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    for _ in range(3):
        s.start_run("embed")
    leases = driver.exchange(claim=ClaimRequest("w1", TTL, limit=3, task="embed")).leases
    clock.advance(TTL + 1)  # all three lapse; another worker takes one over
    taken = driver.exchange(claim=ClaimRequest("w2", TTL, limit=1, task="embed")).leases
    assert s.batch_started(leases, "b1") == 0  # lapsed: not this batch's any more
    assert s.batch_started(taken, "b2") == 1
    batched = [e for e in s.events(after=0) if e.kind == "step.batched"]
    assert [(e.run_id, e.attempt, e.data["batch"], e.data["items"]) for e in batched] == [
        (taken[0].run_id, 2, "b2", 1)]  # fmt: skip


@verb("begin_calls", "keep_calls")
def test_a_batch_calls_intents_and_keeps_are_each_items_own(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    for _ in range(3):
        s.start_run("embed")
    a, b, c = driver.exchange(claim=ClaimRequest("w1", TTL, limit=3, task="embed")).leases
    keys = [CallKey(x.run_id, x.task_id, "embed", hashlib.sha256(b"%d" % x.run_id).hexdigest())
            for x in (a, b, c)]  # fmt: skip
    assert s.keep_call(a, keys[0], "kept before").outcome == "kept"  # (an earlier answer)
    assert s.cancel_run(c.run_id)  # c's run is over: no call begins for it
    starts = s.begin_calls([(a, keys[0]), (b, keys[1]), (c, keys[2])])
    assert [x.outcome for x in starts] == ["reused", "call", "over"]
    assert starts[0].kept is not None and starts[0].kept.result == "kept before"
    kept = s.keep_calls([KeepItem(b, keys[1], "vb", starts[1].intent),
                         KeepItem(a, keys[0], "late", None)])  # fmt: skip
    assert [(k.result, k.outcome) for k in kept] == [("vb", "kept"), ("kept before", "lost_race")]
    clock.advance(TTL + 1)  # the leases lapse: a takeover of b reuses its answer
    (taken,) = [x for x in driver.exchange(claim=ClaimRequest("w2", TTL, limit=3)).leases
                if x.run_id == b.run_id]  # fmt: skip
    again = s.begin_calls([(taken, keys[1])])
    assert again[0].outcome == "reused" and again[0].kept is not None
    assert again[0].kept.result == "vb"
