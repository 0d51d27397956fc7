"""The chaos verdict states safety, not load, on histories the test builds itself in
a real store on each backend, with the fake clock. The verifier looks at the database as chaos
mode does (every 50 ms); what happens between looks is what the test does through the store.

- A takeover that waited for room under its limit, or for a worker to be free, is neither a
  violation nor a warning: its clock runs only while the task could be claimed.
- A task that could be claimed and sat is a warning with its figure, never a violation.
- A zombie write, two attempts on live leases at once, a run failed by chaos or lost, and a
  pool that claims nothing for 10 x the ttl while work is ready are violations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from chaos_fakes import TTL, StoreGate
from helpers import FakeClock
from supervisor_fakes import FakeProcs, make_arbiter

from supervisor.chaos import Chaos
from supervisor.chaos.verifier import FaultEvent, Verifier
from supervisor.config import ChaosConfig
from supervisor.loop.arbiter import Step
from supervisor.loop.progress import StallWatch
from workerproc.status import IDLE
from workerproc.store import AttemptEnd, Commit, Lease, Store, TaskOptions, WorkerInfo
from workerproc.store.limits import LimitSpec

LOOK = 0.05  # chaos mode's OBSERVE_EVERY


def worker(s: Store, name: str, slots: int = 1) -> str:
    """A worker of another host (never judged from here), alive for the whole test."""
    owner = f"elsewhere:{abs(hash(name)) % 10_000}:1.00:{name}"
    s.worker_seen(WorkerInfo(owner, "elsewhere", 1, 0.0, 3600.0, slots, None, "test"),
                  starting=True)  # fmt: skip
    return owner


def fault(v: Verifier, lease: Lease, at: float, kind: str = "kill") -> FaultEvent:
    ev = FaultEvent(kind, 4242, lease.task_id, lease.attempt, at, "handler", v.bound(kind),
                    lease.run_id, lease.owner, lease.expires_at)  # fmt: skip
    v.record(ev)
    return ev


def looks(v: Verifier, s: Store, clock: FakeClock, seconds: float) -> None:
    """Chaos mode looking at the database every 50 ms for ``seconds``."""
    for _ in range(round(seconds / LOOK)):
        clock.advance(LOOK)
        v.observe(s, clock())


def claim(s: Store, owner: str, ttl: float = TTL, max_attempts: int = 20) -> Lease:
    lease = s.claim(owner, ttl, max_attempts=max_attempts)
    assert lease is not None
    return lease


def finish(s: Store, lease: Lease) -> None:
    out = s.commit_many([Commit(lease, "finish", expected_revision=lease.revision,
                                new_state={})])  # fmt: skip
    assert out.results[0].value == "ok"


def verifier(**kw: Any) -> Verifier:
    return Verifier(ttl=TTL, poll_interval=0.2, fast_release=True, **kw)


# -- load is not a violation -----------------------------------------------------------------
def test_a_takeover_that_waited_for_room_under_its_limit_is_no_violation_nor_warning(
    s: Store, clock: FakeClock
) -> None:
    """A released task that waits while its limit is full was reported 'not taken
    over within 2 s'. Its clock runs only while the limit has room."""
    s.register_tasks({"call": TaskOptions(limits=("m",))})
    assert s.declare_limits({"m": LimitSpec.declare("m", concurrency=1)}, by="test") == []
    s.start_run("call")
    victim, other, third = worker(s, "victim"), worker(s, "other"), worker(s, "third")
    held = claim(s, victim)
    s.start_run("call", priority=5)  # a run that goes first once the slot frees
    v = verifier()
    ev = fault(v, held, clock())
    assert s.release_owner(victim) == 1  # fast release
    first = claim(s, other, ttl=60)  # the slot goes to the other run: the limit is full again
    assert first.run_id != held.run_id
    looks(v, s, clock, 5.0)  # five seconds behind its limit
    assert ev.outcome == "pending" and v.violations == []
    finish(s, first)  # room: the orphan is claimable now, and claimed at once
    taken = claim(s, third)
    assert taken.run_id == held.run_id and taken.takeover
    looks(v, s, clock, 0.1)
    doc = v.report()
    assert ev.outcome == "taken_over" and ev.taken_over_ms is not None
    assert ev.taken_over_ms >= 5000
    assert ev.claimable_ms is not None and ev.claimable_ms <= 100
    assert doc["ok"] and doc["violations"] == [] and doc["warnings"] == []


def test_a_takeover_while_every_worker_was_busy_is_no_warning_a_free_worker_sitting_is_one(
    s: Store, clock: FakeClock
) -> None:
    """Under load: a kill taken over after 3159 ms was a violation (exit 8). While
    no worker had a free slot the task could not be claimed; once one had, the seconds it sat
    count, and a slow one is a warning with its figure: never a violation."""
    s.start_runs([{"task": "t"}] * 3)
    victim, busy = worker(s, "victim"), worker(s, "busy")
    v = verifier()
    held, work = claim(s, victim), claim(s, busy, ttl=60)
    ev = fault(v, held, clock())
    s.release_owner(victim)
    looks(v, s, clock, 3.2)  # the only other worker is busy for 3.2 s
    finish(s, work)
    taken = claim(s, busy)
    assert taken.run_id == held.run_id
    looks(v, s, clock, 0.1)
    assert ev.outcome == "taken_over" and ev.taken_over_ms is not None
    assert ev.taken_over_ms >= 3159 and v.report()["warnings"] == [] and v.violations == []
    # the same wait with a worker free all along: claimable, so it is reported, as a warning
    finish(s, taken)
    late = claim(s, busy)
    ev2 = fault(v, late, clock())
    s.release_owner(busy)
    idle = worker(s, "idle")
    looks(v, s, clock, 3.2)
    assert claim(s, idle).run_id == late.run_id
    looks(v, s, clock, 0.1)
    assert ev2.claimable_ms is not None and 3000 <= ev2.claimable_ms <= 3400
    (warning,) = v.report()["warnings"]
    assert f"task {late.task_id} taken over after" in warning
    assert "ms of it claimable, over its bound of 2 s" in warning
    assert v.report()["ok"] and v.violations == []


def test_the_time_every_other_worker_was_paused_by_chaos_does_not_count(
    s: Store, clock: FakeClock
) -> None:
    """The only other worker (two slots, one free) is frozen by chaos itself: nobody could take
    the orphan over. Its clock runs once that worker is awake."""
    s.start_runs([{"task": "t"}] * 3)
    victim, frozen = worker(s, "victim"), worker(s, "frozen", slots=2)
    v = verifier()
    pause = fault(v, claim(s, frozen, ttl=60), clock(), "pause")
    held = claim(s, victim)
    ev = fault(v, held, clock())
    s.release_owner(victim)
    looks(v, s, clock, 3.0)
    pause.woke_at = clock()  # SIGCONT: free again, and slow to claim
    looks(v, s, clock, 0.5)
    assert claim(s, frozen).run_id == held.run_id
    looks(v, s, clock, 0.1)
    assert ev.taken_over_ms is not None and ev.taken_over_ms >= 3500
    assert ev.claimable_ms is not None and 450 <= ev.claimable_ms <= 600
    assert v.report()["warnings"] == [] and v.violations == []


def test_a_paused_lease_counts_from_its_expiry(s: Store, clock: FakeClock) -> None:
    s.start_run("t")
    victim, other = worker(s, "victim"), worker(s, "other")
    v = verifier()
    held = claim(s, victim)
    clock.advance(0.3)
    ev = fault(v, held, clock(), "pause")
    looks(v, s, clock, 1.0)  # the lease expires 0.7 s after the pause: the clock starts then
    assert claim(s, other).run_id == held.run_id
    looks(v, s, clock, 0.1)
    assert ev.lease_ended_ms == pytest.approx(700, abs=1)
    assert ev.claimable_ms is not None and ev.claimable_ms <= 400
    assert v.report()["warnings"] == [] and v.violations == []


# -- safety is ------------------------------------------------------------------------------
@pytest.mark.parametrize("server", [True, False])
def test_a_commit_in_flight_is_no_zombie_write_one_past_the_lease_is(
    s: Store, clock: FakeClock, server: bool
) -> None:
    """On a database server a frozen worker's commit sent before the freeze still lands (it
    took 60 ms under load: 'a zombie write' on today's main); its lease lived then. A file
    database does nothing once its process stops. A commit after the lease could have ended
    (even stretched by one renewal in flight) is a zombie write everywhere."""
    s.start_runs([{"task": "t"}] * 2)
    owner = worker(s, "victim")
    v = verifier(server=server)
    held = claim(s, owner)
    clock.advance(0.2)
    ev = fault(v, held, clock(), "pause")
    clock.advance(0.3)
    finish(s, held)  # 0.3 s after the freeze, 0.5 s before its lease ends
    v.observe(s, clock())
    assert ev.outcome == ("committed_in_flight" if server else "committed_after_fault")
    assert (v.violations == []) is server
    later = claim(s, owner)  # a renewal in flight stretches it by a ttl; a commit after that
    ev = fault(v, later, clock(), "pause")
    clock.advance(0.9)
    assert s.renew(later, TTL)  # the renewal in flight
    clock.advance(0.8)
    assert s.renew(later, TTL)  # and a second one: no frozen process sends that
    clock.advance(0.5)
    finish(s, later)  # 2.2 s after the freeze: its lease would have ended at 2 s at most
    v.observe(s, clock())
    assert ev.outcome == "committed_after_fault"
    assert any(f"task {later.task_id} attempt 1 committed 2.20 s" in x for x in v.violations)


class Tampered:
    """The real store, whose attempt history a broken claim would have left: the next attempt
    claimed before the faulted one's lease ended."""

    def __init__(self, store: Store, early: float) -> None:
        self.store, self.early = store, early

    def attempt_history(self, run_id: int) -> list[AttemptEnd]:
        return [dataclasses.replace(h, ended_at=h.ended_at + self.early)
                if h.ended_at is not None else h
                for h in self.store.attempt_history(run_id)]  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_two_attempts_of_one_task_on_live_leases_are_a_violation(
    s: Store, clock: FakeClock
) -> None:
    s.start_run("t")
    victim, other = worker(s, "victim"), worker(s, "other")
    v = verifier()
    ev = fault(v, claim(s, victim), clock(), "pause")
    clock.advance(TTL + 0.1)
    claim(s, other)
    v.observe(Tampered(s, 0.5), clock())  # type: ignore[arg-type]
    assert ev.outcome == "taken_over"
    (violation,) = v.violations
    assert "attempt 2 was claimed 400 ms before attempt 1's lease ended" in violation


def test_a_run_failed_by_chaos_is_a_violation_a_handler_failing_its_last_attempt_is_not(
    s: Store, clock: FakeClock
) -> None:
    """Attempts that ran out with no handler failing the run: the claim after the last one
    failed it (task_attempts_exhausted). Chaos struck one of them, or the last one itself."""
    s.start_runs([{"task": "t"}] * 3)
    a, b, c = worker(s, "a"), worker(s, "b"), worker(s, "c")
    v = verifier()
    lost = claim(s, a, max_attempts=2)
    fault(v, lost, clock())
    s.release_owner(a)
    claim(s, b, max_attempts=2)  # attempt 2, the last: its lease lapses (nobody struck it)
    clock.advance(TTL + 0.1)
    struck = claim(s, c, max_attempts=2)  # the second run; the first failed in this claim
    assert struck.run_id != lost.run_id
    assert s.get_run(lost.run_id).status == "failed"  # type: ignore[union-attr]
    clock.advance(0.1)
    fault(v, struck, clock())  # the third run: struck on its first attempt, then its handler
    s.release_owner(c)  # fails its last one: the code under test failed it
    again = claim(s, b, max_attempts=2)
    out = s.commit_many([Commit(again, "fail", reason="task_attempts_exhausted", error="boom")])
    assert out.results[0].value == "ok"
    v.observe(s, clock(), final=True, drained=True)
    (violation,) = v.violations
    assert violation.startswith(f"run {lost.run_id} failed (task_attempts_exhausted) after chaos")
    # struck on its last allowed attempt: chaos spent it
    last = claim(s, a, max_attempts=2)
    clock.advance(TTL + 0.1)
    on_last = claim(s, b, max_attempts=2)
    assert on_last.run_id == last.run_id and on_last.tries == 2
    fault(v, on_last, clock())
    s.release_owner(b)
    assert s.claim(c, TTL, max_attempts=2) is None  # the claim that fails it
    v.observe(s, clock(), final=True, drained=True)
    spent = f"a fault struck task {on_last.task_id} on attempt 2, its last allowed one"
    assert spent in v.violations[-1]


def test_a_faulted_task_never_taken_over_when_the_drain_ends_is_a_lost_run(
    s: Store, clock: FakeClock
) -> None:
    s.start_run("t")
    owner = worker(s, "victim")
    stopped, drained = verifier(), verifier()
    lease = claim(s, owner)
    for v in (stopped, drained):
        fault(v, lease, clock())
    s.release_owner(owner)
    clock.advance(0.1)
    stopped.observe(s, clock(), final=True)  # a stop by signal: the pool may come back
    drained.observe(s, clock(), final=True, drained=True)
    assert stopped.events[0].outcome == "unresolved" and stopped.violations == []
    assert drained.events[0].outcome == "lost"
    (violation,) = drained.violations
    assert f"run {lease.run_id} lost: task {lease.task_id} was never taken over" in violation


# -- a pool that stands still --------------------------------------------------------------
@pytest.mark.parametrize(("seconds", "violated"), [(8, False), (12, True)])
def test_a_pool_that_claims_nothing_for_ten_ttls_while_work_is_ready_is_no_progress(
    store: Store, clock: FakeClock, seconds: int, violated: bool
) -> None:
    """429 faults on workers still claiming, 0 runs claimed in 175 s, the log said
    no_progress and the verdict said 0 violations."""
    arb = make_arbiter(clock, FakeProcs(), workers=2, lease_ttl=TTL)
    arb.gate = StoreGate(store)  # type: ignore[assignment]
    arb.add_step(Step("progress", StallWatch().step), before="publish")
    chaos = Chaos(ChaosConfig(enabled=True, interval=3600.0), ttl=TTL, poll_interval=0.2,
                  fast_release=True, max_attempts=3, wall=clock)  # fmt: skip
    chaos.install(arb)
    arb.turn()
    for w in arb.pool.workers.values():  # free, and never a claim
        arb.board.slot(w.slot).publish(w.pid, IDLE)
    for _ in range(seconds + 1):
        clock.advance(1.0)
        arb.turn()
    code = chaos.conclude(arb, 0, 8)
    doc = chaos.report()
    assert doc["longest_stall_s"] >= seconds - 1
    assert (code, any(v.startswith("no_progress") for v in doc["violations"])) == (
        (8, True) if violated else (0, False)
    )
