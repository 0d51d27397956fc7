"""Paid once (B13) on every backend: a step's call kept the moment it returns is
reused by the step's next attempt (a takeover pays nothing again), never for another request;
racing keeps let the first win and count the loser as paid, unused; a lost lease may still keep
while the run is alive on the same step, never after; sizes, prune and forget."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import FakeClock
from once_helpers import REQ, TTL, claim, ctx_of
from store_backends import Backend

from workerproc import LeaseLost, OnceCall
from workerproc.context import TaskContext
from workerproc.once import CallBook, call_key, request_hash
from workerproc.store import Commit, InvalidPayload, Lease, RunNotFound, Store, StoreError


class Bill:
    """A paid API: counts every call it answers."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, object]:
        self.calls += 1
        return {"text": f"answer {self.calls}", "tokens": 100}


def test_the_request_hash_is_canonical() -> None:
    assert request_hash({"a": 1, "b": [1, 2]}) == request_hash({"b": [1, 2], "a": 1})
    assert request_hash({"a": 1}) != request_hash({"a": 2})
    with pytest.raises(InvalidPayload):
        request_hash({"x": object()})  # type: ignore[dict-item]


class TestReuse:
    def test_a_takeover_reuses_the_paid_answer(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        first = claim(s, "w1")
        bill = Bill()
        ctx = ctx_of(first, book)
        got = ctx.once("llm", REQ, bill, tokens=100)
        assert got == {"text": "answer 1", "tokens": 100} and bill.calls == 1
        assert ctx.used_tokens == 100 and ctx.reused == 0
        assert ctx.last_once == OnceCall("llm", False, 100, first.attempt)
        clock.advance(TTL + 1)  # w1 paused past its lease: w2 takes over
        second = claim(s, "w2")
        assert second.takeover and second.task_id == first.task_id
        again = ctx_of(second, book)
        assert again.once("llm", dict(REQ), bill, tokens=100) == got
        assert bill.calls == 1  # no second payment
        # nor charged again: its tokens count through once, and a reuse used none
        assert again.used_tokens == 0 and again.reused == 1
        assert again.last_once == OnceCall("llm", True, 100, first.attempt)
        (call,) = s.paid_calls(first.run_id)
        assert (call.reused, call.unused, call.attempt, call.tokens) == (1, 0, first.attempt, 100)
        totals = s.paid_call_totals()
        assert (totals.calls, totals.reused, totals.saved_tokens) == (1, 1, 100)

    def test_a_different_request_never_reuses(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        bill = Bill()
        ctx_of(claim(s, "w1"), book).once("llm", REQ, bill)
        clock.advance(TTL + 1)
        second = ctx_of(claim(s, "w2"), book)
        assert second.once("llm", {**REQ, "prompt": "changed"}, bill) == {"text": "answer 2",
                                                                         "tokens": 100}  # fmt: skip
        assert second.once("other", REQ, bill)["text"] == "answer 3"  # another name: another
        assert bill.calls == 3

    def test_the_next_step_pays_afresh(self, s: Store, book: CallBook) -> None:
        s.start_run("call")
        first = claim(s, "w1")
        bill = Bill()
        ctx_of(first, book).once("llm", REQ, bill)
        out = s.commit_many([Commit(first, "advance", expected_revision=first.revision,
                                    new_state={}, next_task="call")])  # fmt: skip
        assert out.results[0].value == "ok"
        nxt = claim(s, "w1")
        assert ctx_of(nxt, book).once("llm", REQ, bill)["text"] == "answer 2"

    def test_async_handlers_reuse_too(self, s: Store, clock: FakeClock, book: CallBook) -> None:
        s.start_run("call")
        calls = []

        async def achat() -> str:
            calls.append(1)
            return "paid"

        ctx = ctx_of(claim(s, "w1"), book)
        assert asyncio.run(ctx.once_async("llm", REQ, achat, tokens=lambda r: 7)) == "paid"
        assert ctx.used_tokens == 7
        clock.advance(TTL + 1)
        again = ctx_of(claim(s, "w2"), book)
        assert asyncio.run(again.once_async("llm", REQ, achat)) == "paid" and len(calls) == 1
        assert again.reused == 1 and again.used_tokens is None


class TestRaces:
    def test_the_first_kept_answer_wins_and_the_loser_is_counted(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        zombie = claim(s, "w1")
        clock.advance(TTL + 1)
        successor = claim(s, "w2")
        old, new = ctx_of(zombie, book), ctx_of(successor, book)
        # both looked and found nothing; the successor's answer returns first
        got = new.once("llm", REQ, lambda: "successor's", tokens=40)
        zombie_lost = threading.Event()
        zombie_lost.set()
        key = call_key(zombie, "llm", REQ)
        # the zombie woke with its paid answer (its lookup happened before: keep directly)
        kept = s.keep_call(zombie, key, "zombie's", 60)
        assert got == "successor's" and kept.result == "successor's"
        assert kept.outcome == "lost_race" and kept.attempt == successor.attempt
        (call,) = s.paid_calls(zombie.run_id)
        assert (call.unused, call.unused_tokens, call.tokens) == (1, 60, 40)
        totals = s.paid_call_totals()
        assert (totals.unused, totals.unused_tokens) == (1, 60)
        assert old.once("llm", REQ, lambda: "never") == "successor's"  # a later look reuses

    def test_a_lost_lease_keeps_its_answer_while_the_run_is_on_its_step(
        self, s: Store, clock: FakeClock, book: CallBook, backend: Backend
    ) -> None:
        s.start_run("call")
        zombie = claim(s, "w1")
        lost = threading.Event()
        ctx = TaskContext(zombie, lost, calls=book)

        successors: list[Lease] = []

        def paid_while_paused() -> str:
            clock.advance(TTL + 1)
            successors.append(claim(s, "w2"))  # taken over while the call ran
            lost.set()
            return "paid by the zombie"

        with pytest.raises(LeaseLost):  # the handler learns it at once: its state stays fenced
            ctx.once("llm", REQ, paid_while_paused, tokens=5)
        book.close()  # the keep it handed over is written all the same (the worker goes on)
        (call,) = s.paid_calls(zombie.run_id)
        assert call.attempt == zombie.attempt and call.tokens == 5  # kept: it was paid for
        fresh = CallBook(lambda: backend.open(clock))  # the successor's worker
        again = TaskContext(successors[0], threading.Event(), calls=fresh)
        assert again.once("llm", REQ, lambda: "paid again") == "paid by the zombie"
        fresh.close()

    def test_no_keep_once_the_run_moved_or_ended(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        zombie = claim(s, "w1")
        clock.advance(TTL + 1)
        successor = claim(s, "w2")
        out = s.commit_many([Commit(successor, "advance", expected_revision=successor.revision,
                                    new_state={}, next_task="call")])  # fmt: skip
        assert out.results[0].value == "ok"
        moved = s.keep_call(zombie, call_key(zombie, "llm", REQ), "late", 5)
        assert moved.outcome == "refused" and s.paid_calls(zombie.run_id) == []
        nxt = claim(s, "w2")
        s.commit_many([Commit(nxt, "finish", expected_revision=nxt.revision, new_state={})])
        ended = s.keep_call(nxt, call_key(nxt, "llm", REQ), "late", 5)
        assert ended.outcome == "refused" and s.paid_calls(nxt.run_id) == []


class TestLimits:
    def test_results_follow_the_payload_limits(self, s: Store, book: CallBook) -> None:
        s.start_run("call")
        ctx = ctx_of(claim(s, "w1"), book)
        with pytest.raises(InvalidPayload, match="over the limit"):
            ctx.once("big", REQ, lambda: "x" * (2 << 20))
        with pytest.raises(InvalidPayload, match="not JSON"):
            ctx.once("odd", REQ, lambda: {1, 2})
        deep: list[object] = []
        for _ in range(200):
            deep = [deep]
        with pytest.raises(InvalidPayload, match="deeper"):
            ctx.once("deep", REQ, lambda: deep)
        # each was made (an intent before its call) and none kept
        calls = s.paid_calls(ctx.run_id)
        assert sorted(c.name for c in calls) == ["big", "deep", "odd"]
        assert all(c.started == 1 and not c.kept for c in calls)

    def test_prune_deletes_them_with_their_run(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        ctx_of(lease, book).once("llm", REQ, lambda: "paid")
        s.commit_many([Commit(lease, "finish", expected_revision=lease.revision, new_state={})])
        clock.advance(100)
        assert s.prune(50) == 1
        assert s.paid_calls(lease.run_id) == [] and s.paid_call_totals().calls == 0

    def test_forget_drops_a_call_for_a_fresh_one(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        bill = Bill()
        ctx_of(lease, book).once("llm", REQ, bill)
        assert s.forget_call(lease.run_id, "llm") == 1
        with pytest.raises(StoreError, match="no paid call named 'llm'"):
            s.forget_call(lease.run_id, "llm")
        with pytest.raises(RunNotFound):
            s.forget_call(10**9, "llm")
        clock.advance(TTL + 1)
        ctx_of(claim(s, "w2"), book).once("llm", REQ, bill)
        assert bill.calls == 2  # paid afresh

    def test_a_context_without_a_store_says_so(self, s: Store) -> None:
        s.start_run("call")
        with pytest.raises(RuntimeError, match="needs a worker's store"):
            TaskContext(claim(s, "w1"), threading.Event()).once("llm", REQ, lambda: 1)
