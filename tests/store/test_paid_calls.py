"""Every paid call accounted for (B13) on every backend, with an injected clock: an
intent is written before each call, under a live lease only; a later attempt that finds an
intent without an answer pays again (counted) or parks its run until ``resolve``; a keep
retried after a failure lands once; ``once_key`` is the same for every attempt of a step."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from helpers import FakeClock
from once_helpers import REQ, TTL, Bill, claim, ctx_of
from store_backends import Backend

from workerproc import LeaseLost
from workerproc.config import WorkerConfig
from workerproc.context import RunCancelled, TaskContext
from workerproc.execution import Execution, conclude, mode_for
from workerproc.once import CallBook, CallParked, call_key
from workerproc.store import Commit, Lease, RunOver, Store, StoreError, StoreUnavailable
from workerproc.store.calls import KeptCall
from workerproc.store.roles import CallStore
from workerproc.store.types import CasResult

CONFIG = WorkerConfig(app="unused:app", db="unused", lease_ttl=TTL)


def killed_in_the_call(s: Store, book: CallBook, clock: FakeClock) -> Lease:
    """A first attempt that wrote its intent and died in the call (its fn never returned):
    the lease lapses and a second worker takes the task over. Returns the second lease."""
    s.start_run("call", {"n": 1})
    first = claim(s, "w1")

    def dies() -> object:
        raise SystemExit("killed in the call")

    with pytest.raises(SystemExit):
        ctx_of(first, book).once("llm", REQ, dies)
    clock.advance(TTL + 1)
    second = claim(s, "w2")
    assert second.task_id == first.task_id and second.attempt == first.attempt + 1
    return second


def concluded(lease: Lease, ctx: TaskContext, raised: BaseException | None = None) -> Commit | None:
    """What the worker writes for a handler of ``lease`` that used ``ctx`` and ended."""
    ex = Execution(lease, lambda c: None, mode_for(lambda c: None, 2))
    ex.ctx, ex.began = ctx, True
    return conclude(ex, None, raised, CONFIG)


class TestIntent:
    def test_a_call_killed_in_flight_is_paid_again_and_counted(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        second = killed_in_the_call(s, book, clock)
        totals = s.paid_call_totals()
        assert (totals.started, totals.kept, totals.paid_again, totals.unknown) == (1, 0, 0, 1)
        bill = Bill()
        ctx = ctx_of(second, book)
        assert ctx.once("llm", REQ, bill, tokens=40) == {"text": "answer 1"} and bill.calls == 1
        assert ctx.last_once is not None and ctx.last_once.again
        assert ctx.used_tokens == 80  # charged to the limits again: the first call was paid
        totals = s.paid_call_totals()
        assert (totals.started, totals.kept, totals.paid_again, totals.unknown) == (2, 1, 1, 1)
        (call,) = s.paid_calls(second.run_id)
        assert (call.started, call.paid_again, call.unknown, call.attempt) == (2, 1, 1, 2)
        assert call.outcome == "paid 2x, 1 unknown"
        timeline = s.call_timeline(second.run_id)
        assert [(i.attempt, i.again, i.unknown, i.answered_at is not None) for i in timeline] == [
            (1, False, True, False), (2, True, False, True)]  # fmt: skip

    def test_a_call_in_flight_is_not_unknown(self, s: Store, book: CallBook) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        key = call_key(lease, "llm", REQ)
        start = s.begin_call(lease, key)
        assert start.outcome == "call" and not start.again
        assert s.paid_call_totals().unknown == 0  # its attempt still holds its lease
        (made,) = s.call_timeline(lease.run_id)
        assert made.answered_at is None and not made.unknown

    def test_no_intent_and_no_call_without_a_live_lease(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        clock.advance(TTL + 1)  # lapsed: nobody took it over yet, but it is not held
        bill = Bill()
        with pytest.raises(LeaseLost):
            ctx_of(lease, book).once("llm", REQ, bill)
        assert bill.calls == 0 and s.paid_call_totals().started == 0

    def test_a_worker_paused_after_its_intent_never_wakes_into_its_call(
        self, s: Store, book: CallBook
    ) -> None:
        s.start_run("call")
        lease = s.claim("w1", 0.3)  # 0.3 s of lease, by the database's clock
        assert lease is not None
        real = book.call

        def paused_after_the_intent(fn: Any) -> Any:
            done = real(fn)
            done.result()  # the intent is written under the live lease ...
            time.sleep(0.5)  # ... and the worker stops past its lease before its call
            return done

        book.call = paused_after_the_intent  # type: ignore[method-assign]
        bill = Bill()
        with pytest.raises(LeaseLost):
            ctx_of(lease, book).once("llm", REQ, bill)
        assert bill.calls == 0  # whoever holds the step now may have paid: never again
        (made,) = s.call_timeline(lease.run_id)
        assert made.attempt == lease.attempt and made.answered_at is None

    def test_a_cancelled_run_pays_nothing(self, s: Store, book: CallBook) -> None:
        run = s.start_run("call")
        lease = claim(s, "w1")
        s.cancel_run(run)
        bill = Bill()
        ctx = ctx_of(lease, book)
        with pytest.raises(RunCancelled):
            ctx.once("llm", REQ, bill)
        assert bill.calls == 0 and ctx.cancelled

    def test_once_never_returns_an_answer_it_could_not_keep(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        run = s.start_run("call")
        lease = claim(s, "w1")
        ctx = ctx_of(lease, book)

        def cancelled_meanwhile() -> str:
            s.cancel_run(run)  # an operator, while the call was in flight
            return "paid"

        with pytest.raises(RunCancelled):
            ctx.once("llm", REQ, cancelled_meanwhile)
        assert ctx.cancelled
        s.start_run("call")
        other = claim(s, "w2")

        def done_meanwhile() -> str:
            clock.advance(TTL + 1)  # paused past the lease: w3 takes over and finishes
            taken = claim(s, "w3")
            s.commit_many([Commit(taken, "finish", expected_revision=taken.revision)])
            return "paid"

        with pytest.raises(LeaseLost):
            ctx_of(other, book).once("llm", REQ, done_meanwhile)

    def test_a_keep_retried_after_it_landed_counts_once(self, s: Store, book: CallBook) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        key = call_key(lease, "llm", REQ)
        start = s.begin_call(lease, key)
        first = s.keep_call(lease, key, {"a": 1}, 10, cost=0.5, intent=start.intent)
        again = s.keep_call(lease, key, {"a": 1}, 10, cost=0.5, intent=start.intent)
        assert first.outcome == again.outcome == "kept" and again.result == {"a": 1}
        (call,) = s.paid_calls(lease.run_id)
        assert call.unused == 0 and call.started == 1
        (spent,) = s.spend()
        assert (spent.entries, spent.tokens, spent.cost) == (1, 10, 0.5)  # kept once


class FlakyKeeps:
    """A call store whose first ``fails`` keeps raise as a closed connection would."""

    def __init__(self, inner: CallStore, fails: int) -> None:
        self.inner, self.fails = inner, fails

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def keep_call(self, *args: Any, **kwargs: Any) -> KeptCall:
        if self.fails:
            self.fails -= 1
            raise StoreUnavailable("server closed the connection unexpectedly")
        return self.inner.keep_call(*args, **kwargs)


class TestKeep:
    def test_a_failed_keep_is_retried_and_the_answer_kept(
        self, s: Store, backend: Backend, clock: FakeClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        flaky = CallBook(lambda: FlakyKeeps(backend.open(clock), fails=2))
        try:
            s.start_run("call")
            lease = claim(s, "w1")
            bill = Bill()
            with caplog.at_level(logging.WARNING, "workerproc.worker"):
                got = ctx_of(lease, flaky).once("llm", REQ, bill)
            assert got == {"text": "answer 1"}
            assert "keeping its answer failed" in caplog.text
            (call,) = s.paid_calls(lease.run_id)
            assert call.kept and call.attempt == lease.attempt
            again = ctx_of(lease, flaky)
            assert again.once("llm", REQ, bill) == got and bill.calls == 1  # reused
        finally:
            flaky.close()

    def test_a_slot_thread_keeps_on_its_own_connection(self, s: Store, book: CallBook) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        seen: list[str] = []

        def fn() -> str:
            seen.append(threading.current_thread().name)
            return "paid"

        with ThreadPoolExecutor(1, thread_name_prefix="slot") as slot:
            got = slot.submit(lambda: ctx_of(lease, book).once("llm", REQ, fn)).result(30)
        assert got == "paid" and seen[0].startswith("slot")
        assert book._pool is None  # nothing was handed over: the slot thread did it itself


class TestPark:
    def park(self, s: Store, clock: FakeClock, book: CallBook) -> tuple[Lease, Bill]:
        second = killed_in_the_call(s, book, clock)
        bill = Bill()
        ctx = ctx_of(second, book)
        with pytest.raises(CallParked) as parked:
            ctx.once("llm", REQ, bill, unknown="park")
        assert bill.calls == 0
        commit = concluded(second, ctx, parked.value)
        assert commit is not None and commit.kind == "park"
        assert s.commit_many([commit]).results == (CasResult.OK,)
        run = s.get_run(second.run_id)
        assert run is not None and run.status == "waiting"
        assert run.waiting_for == "outcome_unknown:llm"
        clock.advance(3600)
        assert s.claim("w3", TTL) is None  # parked: nothing to claim, however long
        return second, bill

    def test_unknown_park_waits_and_an_answer_resolves_it(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        second, bill = self.park(s, clock, book)
        done = s.resolve(second.run_id, "llm", answer={"text": "from the provider's log"})
        assert (done.kept, done.resumed, done.settled) == (True, True, 1)
        third = claim(s, "w3")
        assert third.task_id == second.task_id and third.tries == second.tries  # none spent
        ctx = ctx_of(third, book)
        got = ctx.once("llm", REQ, bill, unknown="park")
        assert got == {"text": "from the provider's log"} and bill.calls == 0
        totals = s.paid_call_totals()
        assert (totals.started, totals.paid_again, totals.reused) == (1, 0, 1)

    def test_pay_again_calls_once_more(self, s: Store, clock: FakeClock, book: CallBook) -> None:
        second, bill = self.park(s, clock, book)
        assert s.resolve(second.run_id, "llm", pay_again=True).resumed
        third = claim(s, "w3")
        ctx = ctx_of(third, book)
        assert ctx.once("llm", REQ, bill, unknown="park") == {"text": "answer 1"}
        assert bill.calls == 1 and s.paid_call_totals().paid_again == 1

    def test_resolve_says_what_is_wrong(self, s: Store, clock: FakeClock, book: CallBook) -> None:
        second, _ = self.park(s, clock, book)
        with pytest.raises(StoreError, match="no call named 'other'"):
            s.resolve(second.run_id, "other", pay_again=True)
        with pytest.raises(StoreError, match="an answer or pay_again"):
            s.resolve(second.run_id, "llm")
        s.cancel_run(second.run_id)
        with pytest.raises(RunOver):
            s.resolve(second.run_id, "llm", answer=1)

    def test_an_answer_kept_already_wins(self, s: Store, clock: FakeClock, book: CallBook) -> None:
        second, _ = self.park(s, clock, book)
        key = call_key(second, "llm", REQ)
        s.keep_call(second, key, {"text": "late"})  # the first attempt's call came back late
        done = s.resolve(second.run_id, "llm", answer={"text": "operator"})
        assert not done.kept and done.resumed
        ctx = ctx_of(claim(s, "w3"), book)
        assert ctx.once("llm", REQ, Bill(), unknown="park") == {"text": "late"}


class TestKey:
    def test_once_key_is_stable_per_step_and_request(
        self, s: Store, clock: FakeClock, book: CallBook
    ) -> None:
        s.start_run("call")
        first = claim(s, "w1")
        key = ctx_of(first, book).once_key("charge", REQ)
        clock.advance(TTL + 1)
        second = claim(s, "w2")
        assert ctx_of(second, book).once_key("charge", dict(REQ)) == key
        assert ctx_of(second, book).once_key("charge", {**REQ, "prompt": "x"}) != key
        assert key.startswith("lk-") and len(key) == 43

    def test_two_databases_give_two_keys(self, tmp_path: Any) -> None:
        from workerproc.store import open_store  # noqa: PLC0415

        keys = []
        for name in ("a.db", "b.db"):
            with open_store(str(tmp_path / name)) as store:
                store.start_run("call")
                lease = claim(store, "w1")
                calls = CallBook(lambda store=store: store)  # type: ignore[misc]
                keys.append(ctx_of(lease, calls).once_key("charge", REQ))
        assert keys[0] != keys[1]


class TestSpend:
    def test_usage_and_calls_are_kept_by_task_and_field(self, s: Store, book: CallBook) -> None:
        s.start_runs([{"task": "call", "payload": {"tenant": t}} for t in ("a", "b")])
        for owner in ("w1", "w2"):
            lease = claim(s, owner)
            ctx = ctx_of(lease, book)
            ctx.once("llm", REQ, lambda: {"n": 1}, tokens=100, cost=0.25)
            ctx.usage(tokens=5, cost=0.01)
            ctx.finish({})
            written = concluded(lease, ctx)
            assert written is not None and written.usage is not None
            assert s.commit_many([written]).results == (CasResult.OK,)
        (by_task,) = s.spend()
        assert (by_task.key, by_task.entries, by_task.calls, by_task.tokens) == (
            "call", 4, 2, 210)  # fmt: skip
        assert by_task.cost == pytest.approx(0.52)
        by_tenant = {x.key: x.tokens for x in s.spend("tenant")}
        assert by_tenant == {"a": 105, "b": 105}
        assert s.spend(since=s.now() + 60) == []
        with pytest.raises(StoreError):
            s.spend('te"nant')

    def test_a_zombies_usage_is_not_kept(self, s: Store, clock: FakeClock, book: CallBook) -> None:
        s.start_run("call")
        lease = claim(s, "w1")
        ctx = ctx_of(lease, book)
        ctx.usage(tokens=7, cost=1.0)
        clock.advance(TTL + 1)
        claim(s, "w2")
        written = concluded(lease, ctx)
        assert written is not None
        assert s.commit_many([written]).results != (CasResult.OK,)
        assert s.spend() == []


def test_usage_needs_a_number() -> None:
    ctx = TaskContext(_lease_stub(), threading.Event())
    for bad in ({"tokens": -1}, {"cost": float("nan")}, {"cost": True}, {}):
        with pytest.raises(ValueError):
            ctx.usage(**bad)


def _lease_stub() -> Lease:
    return Lease(task_id=1, run_id=1, task="t", payload=None, attempt=1, owner="w",
                 expires_at=0.0, claimed_at=0.0)  # fmt: skip
