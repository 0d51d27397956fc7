"""The worker's decisions (``workerproc/policy.py``) with a fake clock: no thread, no store.

What to claim and how many, when finished commits are written, when prefetched leases go back,
when a waiting lease may start (R4's start rule), when to wake, when to drain and exit."""

from __future__ import annotations

import random
import signal
from typing import Any

import pytest
from helpers import FakeClock

from workerproc import exitcodes
from workerproc.config import WorkerConfig
from workerproc.policy import (
    ADAPTIVE_PREFETCH,
    BUSY_WAIT,
    FAST,
    HOLD,
    RECENT,
    SLOW_BEHIND,
    Policy,
    Start,
    View,
)
from workerproc.signals import Signals


def policy(clock: FakeClock, **kw: Any) -> Policy:
    kw.setdefault("lease_ttl", 10.0)  # fresh: 1 s; late: 5 s
    config = WorkerConfig(db="x.db", app="tests:app", **kw)
    return Policy(config, Signals(), clock=clock, rng=random.Random(7))


def earn_prefetch(p: Policy) -> None:
    for _ in range(RECENT):
        p.task_done(FAST / 2)


# -- what to claim, and how many -------------------------------------------------------------------
def test_free_slots_are_claimed_at_once(clock: FakeClock) -> None:
    p = policy(clock, concurrency=4)
    turn = p.turn(View())
    assert turn.claim and turn.want == 4 and not turn.write and not turn.hand_back
    turn = p.turn(View(running=3, waiting=1))
    assert not turn.claim and turn.want == 0  # every slot has its task: nothing to ask for
    assert not turn.talks_to_store


def test_the_adaptive_prefetch_is_earned_by_recent_fast_handlers_only(clock: FakeClock) -> None:
    p = policy(clock)
    assert p.turn(View()).want == 1  # one slot, nothing earned yet
    for _ in range(RECENT - 1):
        p.task_done(FAST / 2)
    assert p.turn(View()).want == 1  # one short of RECENT
    p.task_done(FAST)
    assert p.turn(View()).want == 1 + ADAPTIVE_PREFETCH
    p.task_done(FAST * 2)  # one slow handler in the window: no prefetch
    assert p.turn(View()).want == 1
    earn_prefetch(p)
    assert p.turn(View(running=1, youngest=clock.now, waiting=10)).want == ADAPTIVE_PREFETCH - 10


def test_an_explicit_prefetch_needs_no_fast_handlers(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2, prefetch=3)
    p.task_done(60.0)
    assert p.turn(View()).want == 5
    assert policy(clock, concurrency=2, prefetch=0).turn(View()).want == 2


def test_a_claim_alone_waits_after_a_short_answer_until_something_changes(
    clock: FakeClock,
) -> None:
    p = policy(clock, concurrency=4)
    p.claimed(asked=4, got=1)  # the queue ran dry
    turn = p.turn(View(running=1))
    assert turn.want == 3 and not turn.claim and not turn.talks_to_store
    turn = p.turn(View(running=1, finished=1))
    assert turn.write and turn.want == 3  # a write is due anyway: the claim rides along
    p.watched()  # the idle wait saw a change, a due time or the poll interval
    assert p.turn(View(running=1)).claim
    p.claimed(asked=3, got=3)
    assert p.turn(View(running=0)).claim


def test_no_claim_alone_while_the_prefetched_work_is_deep(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2)
    earn_prefetch(p)
    assert p.turn(View(running=2, youngest=clock.now, waiting=2)).claim  # runs low: refill
    turn = p.turn(View(running=2, youngest=clock.now, waiting=3))
    assert turn.want == ADAPTIVE_PREFETCH - 3 and not turn.claim


def test_no_work_is_taken_after_term_or_a_drain(clock: FakeClock) -> None:
    p = policy(clock, concurrency=4)
    p.signals.stop = signal.SIGTERM
    turn = p.turn(View(running=1))
    assert turn.want == 0 and not turn.claim and not p.accepting
    q = policy(clock, concurrency=4)
    q.drain(exitcodes.RECYCLE)
    assert q.turn(View()).want == 0 and not q.accepting


# -- prefetched leases go back ---------------------------------------------------------------------
def test_waiting_leases_go_back_behind_slots_that_turned_out_slow(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2)
    earn_prefetch(p)
    started = clock.now
    clock.advance(SLOW_BEHIND / 2)
    assert not p.turn(View(running=2, youngest=started, waiting=5)).hand_back
    assert not p.turn(View(running=1, youngest=started, waiting=5)).hand_back  # a slot is free
    clock.advance(SLOW_BEHIND * 0.51)
    turn = p.turn(View(running=2, youngest=started, waiting=5))
    assert turn.hand_back and turn.want == 0  # nothing more claimed to go back again
    assert p.turn(View(running=1)).want == 1  # the adaptive prefetch is earned again
    assert not p.turn(View(running=2, youngest=started)).hand_back  # nothing waits


def test_slow_slots_stop_the_prefetch_even_with_nothing_waiting(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2, prefetch=4)
    started = clock.now
    assert p.turn(View(running=2, youngest=started)).want == 4
    clock.advance(SLOW_BEHIND * 1.01)
    assert p.turn(View(running=2, youngest=started)).want == 0


def test_stopping_hands_back_whatever_waits(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2)
    earn_prefetch(p)
    p.signals.stop = signal.SIGTERM
    turn = p.turn(View(running=1, youngest=clock.now, waiting=3))
    assert turn.hand_back and turn.want == 0
    p.signals.stop = None
    assert p.turn(View()).want == 2 + ADAPTIVE_PREFETCH  # stopping is not slowness


# -- finished commits ------------------------------------------------------------------------------
def test_finished_commits_are_written_at_once_with_nothing_prefetched(clock: FakeClock) -> None:
    p = policy(clock, concurrency=4)
    turn = p.turn(View(running=3, finished=1, finished_since=clock.now))
    assert turn.write and turn.want == 1


def test_finished_commits_wait_for_prefetched_work_at_most_hold(clock: FakeClock) -> None:
    p = policy(clock)
    earn_prefetch(p)
    since = clock.now
    view = View(running=1, youngest=since, waiting=5, finished=3, finished_since=since)
    assert not p.turn(view).write
    clock.advance(HOLD * 0.9)
    assert not p.turn(view).write
    clock.advance(HOLD * 0.1)
    assert p.turn(view).write
    full = View(running=1, youngest=clock.now, waiting=5, finished=1 + ADAPTIVE_PREFETCH,
                finished_since=clock.now)  # fmt: skip
    assert p.turn(full).write  # a batch that big goes at once
    p.signals.stop = signal.SIGTERM
    assert p.turn(View(waiting=5, finished=1, finished_since=clock.now)).write


# -- the start rule (R4) ---------------------------------------------------------------------------
def test_a_lease_starts_only_confirmed_a_moment_ago(clock: FakeClock) -> None:
    p = policy(clock)  # ttl 10 s: fresh up to 1 s
    confirmed = clock.now
    assert p.start(None, None, renewed=False) is Start.DROP  # lost while it waited
    assert p.start(confirmed, None, renewed=False) is Start.NOW
    clock.advance(1.0)
    assert p.start(confirmed, None, renewed=False) is Start.NOW
    clock.advance(0.01)
    assert p.start(confirmed, None, renewed=False) is Start.RENEW
    assert p.start(confirmed, None, renewed=True) is Start.LATER  # asked once this turn


def test_a_renewal_asked_for_this_turn_lets_a_lease_start_however_long_it_took(
    clock: FakeClock,
) -> None:
    p = policy(clock)
    sent = clock.now
    clock.advance(3.0)  # a slow database: the answer came 3 s after the renewal was sent
    assert p.start(sent, vouched=sent, renewed=True) is Start.NOW
    assert p.start(sent - 1, vouched=sent, renewed=True) is Start.LATER  # older than asked for
    assert p.begin_by(sent) == sent + 5.0  # but never past half the ttl (the slot's check)


def test_stale_names_the_leases_to_renew_before_they_start(clock: FakeClock) -> None:
    p = policy(clock)
    now = clock.now
    confirmations = [now, now - 0.5, now - 1.5, None]
    assert p.needs_renewal((c, True) for c in confirmations) == [False, False, True, True]
    # a lease claimed to wait (a prefetch) is renewed before it starts, however fresh (B3)
    assert p.needs_renewal([(now, False)]) == [True]
    assert p.start(now, None, renewed=False, recorded=False) is Start.RENEW
    assert p.start(now, vouched=now, renewed=True, recorded=False) is Start.NOW
    assert not p.thread_may_start(now, recorded=False)


def test_a_slot_thread_chains_only_a_fresh_lease(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2)
    assert p.thread_may_start(clock.now) and not p.thread_may_start(None)
    assert not p.thread_may_start(clock.now - 1.01)
    assert p.slot_free(1) and not p.slot_free(2)


# -- waiting ---------------------------------------------------------------------------------------
def test_an_idle_worker_waits_the_poll_interval_with_jitter(clock: FakeClock) -> None:
    p = policy(clock, poll_interval=2.0)
    waits = [p.wake_at(View(), want=1) - clock.now for _ in range(50)]
    assert all(1.8 <= w <= 2.2 for w in waits) and len(set(waits)) > 1
    assert p.wake_at(View(), want=0) == clock.now + 2.0  # not looking for work: no jitter


def test_busy_slots_wake_for_health_a_due_hand_back_or_a_held_batch(clock: FakeClock) -> None:
    p = policy(clock, concurrency=2, poll_interval=5.0)
    now = clock.now
    assert p.wake_at(View(running=1), want=1) == now + BUSY_WAIT
    assert p.wake_at(View(running=2, youngest=now - 0.05, waiting=1), want=0) == pytest.approx(
        now - 0.05 + SLOW_BEHIND
    )
    held = View(running=1, waiting=1, finished=2, finished_since=now - 0.001)
    assert p.wake_at(held, want=0) == pytest.approx(now - 0.001 + HOLD)


# -- draining and exiting --------------------------------------------------------------------------
def test_a_drain_exits_with_its_code_once_idle_or_overdue(clock: FakeClock) -> None:
    p = policy(clock, graceful_timeout=30.0)
    assert p.drained(busy=False) is None  # still taking work
    assert p.drain(exitcodes.TASK_TIMEOUT)
    assert not p.drain(exitcodes.RECYCLE)  # the first drain keeps its code and deadline
    assert p.drained(busy=True) is None
    assert p.drained(busy=False) == exitcodes.TASK_TIMEOUT
    clock.advance(29.9)
    assert p.drained(busy=True) is None and not p.overdue
    clock.advance(0.1)
    assert p.overdue and p.drained(busy=True) == exitcodes.TASK_TIMEOUT


def test_term_exits_zero_once_idle(clock: FakeClock) -> None:
    p = policy(clock)
    p.signals.stop = signal.SIGTERM
    assert p.drained(busy=True) is None  # TERM has no deadline of its own (the supervisor's)
    clock.advance(3600)
    assert p.drained(busy=True) is None
    assert p.drained(busy=False) == exitcodes.OK


def test_recycling_is_due_after_max_tasks(clock: FakeClock) -> None:
    p = policy(clock, max_tasks=3)
    for _ in range(2):
        p.task_done(0.1)
    assert not p.recycle_due
    p.task_done(0.1)
    assert p.recycle_due and p.tasks_done == 3
    assert not policy(clock).recycle_due
