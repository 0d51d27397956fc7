"""The lease protocol (docs/protocol.md, R1-R6), one test per rule and sub-rule, on every backend.

Shaped like huey's StorageTests: the tests live in one class and receive the store from a
fixture parametrized over ``store_backends.BACKENDS``; a new backend adds one entry there.
Time is a FakeClock: no test sleeps for a ttl.
"""

from __future__ import annotations

import sys
import threading

import pytest
from helpers import FakeClock, wait_for
from store_backends import TTL, Backend, advance, claim, fail_run, finish, renew_until, snapshot

from workerproc.store import CasResult, ClaimRequest, Lease, Store


def blocked_inside(thread: threading.Thread, method: str) -> bool:
    """``thread`` is below ``method`` in its stack and asleep in the kernel: waiting (for a
    lock, a socket), no longer on its way in."""

    def stack() -> list[str]:
        frame = sys._current_frames().get(thread.ident or -1)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        return names

    def below(names: list[str]) -> bool:
        return method in names and names[0] != method

    if not below(stack()):
        return False
    with open(f"/proc/self/task/{thread.native_id}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    return state == "S" and below(stack())


class TestLeaseProtocol:
    # -- R1: atomic claim -----------------------------------------------------------------
    def test_r1_claim_writes_owner_expiry_and_attempt(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("step", {"doc": 1}, state={"n": 0})
        lease = claim(s, "w1", 30)
        assert (lease.run_id, lease.task, lease.payload, lease.owner) == (
            run_id, "step", {"doc": 1}, "w1",
        )  # fmt: skip
        assert (lease.attempt, lease.expires_at, lease.claimed_at) == (1, clock.now + 30, clock.now)
        assert (lease.state, lease.revision) == ({"n": 0}, 0)
        (task,) = s.get_tasks(run_id)
        assert (task.lease_owner, task.lease_expires_at, task.attempts) == ("w1", clock.now + 30, 1)
        run = s.get_run(run_id)
        assert run is not None and run.status == "running"
        assert s.claim("w2", TTL) is None

    def test_r1_claim_is_atomic_under_racing_threads(self, s: Store) -> None:
        for i in range(200):
            s.start_run("t", {"i": i})
        got: list[list[int]] = [[] for _ in range(8)]

        def worker(k: int) -> None:
            while (lease := s.claim(f"w{k}", TTL)) is not None:  # each thread: own connection
                got[k].append(lease.task_id)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        every = [tid for part in got for tid in part]
        assert len(every) == len(set(every)) == 200

    def test_r1_skips_delayed_task_until_available(self, s: Store, clock: FakeClock) -> None:
        s.start_run("later", delay=10)
        assert s.claim("w1", TTL) is None
        clock.advance(9.999)
        assert s.claim("w1", TTL) is None
        clock.advance(0.001)
        assert claim(s).task == "later"

    def test_r1_skips_run_with_live_lease_on_other_task(
        self, s: Store, backend: Backend, clock: FakeClock
    ) -> None:
        hot = s.start_run("first")
        held = claim(s, "w1")
        second = backend.add_task(hot, "second", clock.now, clock.now)
        other = s.start_run("other")
        assert claim(s, "w2").run_id == other  # not the hot run's ready second task
        assert s.claim("w3", TTL) is None
        assert s.ack(held)
        assert claim(s, "w3").task_id == second

    def test_r1_skips_run_whose_new_first_task_is_free_while_another_holds_a_lease(
        self, s: Store, backend: Backend, clock: FakeClock
    ) -> None:
        """A task written into a run ahead of its leased one (by hand, say) becomes the run's
        first task in R1 order; the run still holds a live lease, so nothing of it is claimed."""
        hot = s.start_run("first")
        held = claim(s, "w1")
        ahead = backend.add_task(hot, "ahead", clock.now - 5, clock.now - 5)
        assert s.claim("w2", TTL) is None
        assert s.claim("w2", TTL, limit=5) == []
        assert s.ack(held)
        assert claim(s, "w3").task_id == ahead

    def test_r1_a_batch_takes_one_task_per_run(
        self, s: Store, backend: Backend, clock: FakeClock
    ) -> None:
        """Runs with several ready tasks: one statement claiming ten hands out one lease per
        run, each run's first task in R1 order, and nothing more until they are done."""
        runs = [s.start_run("later") for _ in range(3)]
        firsts = [backend.add_task(r, "earlier", clock.now - 1, clock.now - 1) for r in runs]
        leases = s.claim("w1", TTL, limit=10)
        assert sorted((lease.run_id, lease.task_id) for lease in leases) == list(
            zip(runs, firsts, strict=True)
        )
        assert s.claim("w2", TTL, limit=10) == []
        assert s.integrity_violations() == []
        for lease in leases:
            assert s.ack(lease)
        assert sorted(lease.task for lease in s.claim("w2", TTL, limit=10)) == ["later"] * 3

    def test_r1_takeover_of_expired_lease(self, s: Store, clock: FakeClock) -> None:
        s.start_run("t")
        first = claim(s, "w1", 10)
        clock.advance(9.999)
        assert s.claim("w2", TTL) is None
        clock.advance(0.001)  # expires_at <= now: the lease is dead
        taken = claim(s, "w2")
        assert (taken.task_id, taken.attempt, taken.owner) == (first.task_id, 2, "w2")

    def test_r1_skips_failed_and_cancelled_runs(self, s: Store, clock: FakeClock) -> None:
        failed, cancelled, alive = (s.start_run(n) for n in ("f", "c", "a"))
        assert fail_run(s, failed, "operator")
        assert s.cancel_run(cancelled)
        assert claim(s).run_id == alive
        assert s.claim("w2", TTL) is None
        clock.advance(TTL * 10)  # nothing of the dead runs becomes claimable later either
        lease = claim(s, "w3")  # only the expired lease on the live run
        assert lease.run_id == alive and s.claim("w4", TTL) is None

    def test_r1_order_available_at_created_at_id(self, s: Store, clock: FakeClock) -> None:
        t0 = clock.now
        early = s.start_run("early")  # created first, but its next task comes later (below)
        s.start_run("a30", delay=30)  # available t0+30
        s.start_run("b10", delay=10)  # available t0+10, created t0
        clock.advance(1)
        s.start_run("c10", delay=9)  # available t0+10, created t0+1
        s.start_run("d10", delay=9)  # same available_at and created_at: id decides
        clock.advance(4)
        lease = claim(s)
        assert lease.run_id == early
        assert advance(s, lease, 0, None, "e10", delay=5) is CasResult.OK  # t0+10, created t0+5
        clock.advance(100)
        order = [claim(s, f"w{i}").task for i in range(5)]
        assert order == ["b10", "c10", "d10", "e10", "a30"]
        assert clock.now - t0 == 105

    def test_r1_order_takeover_keeps_its_place_by_available_at(
        self, s: Store, clock: FakeClock
    ) -> None:
        orphan = s.start_run("orphan")  # available t0
        claim(s, "dead", 10)  # lease until t0+10, its holder dies
        clock.advance(5)
        s.start_run("younger")  # available t0+5: R1 orders it after the orphan
        clock.advance(10)
        assert claim(s, "w2").run_id == orphan

    # -- R2: the attempt is the fencing token ---------------------------------------------
    def test_r2_every_claim_increments_attempt(self, s: Store, clock: FakeClock) -> None:
        s.start_run("t")
        attempts = []
        for i in range(3):
            lease = claim(s, f"w{i}", max_attempts=10)
            attempts.append(lease.attempt)
            if i == 0:
                assert s.release(lease)
            else:
                clock.advance(TTL)
        assert attempts == [1, 2, 3]

    def test_r2_ack_needs_owner_and_attempt(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t")
        old = claim(s, "w1", 10)
        clock.advance(10)
        new = claim(s, "w1", 10)  # the same owner again: only the attempt tells them apart
        before = snapshot(s, run_id)
        assert not s.ack(old)
        assert not s.ack(Lease(**{**new.__dict__, "owner": "w2"}))
        assert not s.ack(Lease(**{**new.__dict__, "attempt": new.attempt + 1}))
        assert snapshot(s, run_id) == before
        assert s.ack(new)
        assert not s.ack(new)  # acked: the lease is gone
        run = s.get_run(run_id)
        assert run is not None and run.status == "succeeded"

    def test_r2_release_fenced(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t")
        old = claim(s, "w1", 10)
        clock.advance(10)
        new = claim(s, "w2", 10)
        before = snapshot(s, run_id)
        assert not s.release(old, error="zombie")
        assert not s.release(Lease(**{**new.__dict__, "owner": "w1"}))
        assert snapshot(s, run_id) == before
        assert s.release(new, delay=5, error="boom")
        (task,) = s.get_tasks(run_id)
        assert (task.lease_owner, task.available_at, task.last_error) == (
            None,
            clock.now + 5,
            "boom",
        )
        assert not s.release(new)  # released: no longer the holder
        assert s.claim("w3", TTL) is None
        clock.advance(5)
        assert claim(s, "w3").attempt == 3

    def test_r2_renew_fenced(self, s: Store, clock: FakeClock) -> None:
        s.start_run("t")
        old = claim(s, "w1", 10)
        clock.advance(10)
        new = claim(s, "w2", 10)
        assert renew_until(s, old, 100) is None
        assert renew_until(s, Lease(**{**new.__dict__, "attempt": old.attempt}), 100) is None
        assert renew_until(s, new, 100) == clock.now + 100

    def test_r2_zombie_after_takeover_changes_nothing(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t", state={"v": 0})
        zombie = claim(s, "w1", 10)
        clock.advance(11)
        live = claim(s, "w2", 10)
        before = snapshot(s, run_id)
        assert s.compare_and_set(zombie, 0, {"v": 666}) is CasResult.LEASE_LOST
        assert advance(s, zombie, 0, {"v": 666}, "next") is CasResult.LEASE_LOST
        assert finish(s, zombie, 0, {"v": 666}) is CasResult.LEASE_LOST
        assert not s.renew(zombie, TTL) and not s.ack(zombie) and not s.release(zombie)
        assert snapshot(s, run_id) == before
        assert finish(s, live, 0, {"v": 1}) is CasResult.OK

    # -- R3: renewal -------------------------------------------------------------------------
    def test_r3_renew_is_max_old_now_plus_ttl(self, s: Store, clock: FakeClock) -> None:
        s.start_run("t")
        t0 = clock.now
        lease = claim(s, "w1", 60)
        assert renew_until(s, lease, 10) == t0 + 60  # a shorter ttl never shortens the lease
        clock.advance(55)
        assert renew_until(s, lease, 10) == t0 + 65  # now + ttl, not old + ttl
        assert renew_until(s, lease, 10) == t0 + 65  # repeated heartbeats do not pile up
        clock.advance(5)
        assert renew_until(s, lease, 30) == t0 + 90
        assert s.get_tasks(lease.run_id)[0].lease_expires_at == t0 + 90

    def test_r3_expired_lease_cannot_be_renewed_even_if_nobody_took_it(
        self, s: Store, clock: FakeClock
    ) -> None:
        run_id = s.start_run("t")
        lease = claim(s, "w1", 10)
        clock.advance(10)  # expires_at == now: expired
        assert renew_until(s, lease, 60) is None
        (task,) = s.get_tasks(run_id)
        assert task.lease_expires_at == clock.now  # not revived
        assert claim(s, "w2").attempt == 2  # the task went back to the queue

    # -- R5: the database decides who may write ---------------------------------------------
    def test_r5_cas_three_answers(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t", state={"v": 0})
        lease = claim(s, "w1", 10)
        assert s.compare_and_set(lease, 0, {"v": 1}) is CasResult.OK
        assert s.compare_and_set(lease, 0, {"v": 2}) is CasResult.CONFLICT  # revision moved
        assert s.compare_and_set(lease, 1, {"v": 2}) == "ok"
        run = s.get_run(run_id)
        assert run is not None and (run.state, run.revision) == ({"v": 2}, 2)
        clock.advance(10)  # expired, nobody took it: still lease_lost, even at the right revision
        assert s.compare_and_set(lease, 2, {"v": 3}) is CasResult.LEASE_LOST
        assert (
            s.compare_and_set(lease, 0, {"v": 3}) is CasResult.LEASE_LOST
        )  # lease is checked first
        run = s.get_run(run_id)
        assert run is not None and (run.state, run.revision) == ({"v": 2}, 2)

    # -- R6: attempts are bounded ------------------------------------------------------------
    def test_r6_attempt_max_plus_one_fails_run_and_claims_next_in_same_call(
        self, s: Store, clock: FakeClock
    ) -> None:
        poison = s.start_run("poison")
        for attempt in (1, 2, 3):
            lease = claim(s, "w1", max_attempts=3)
            assert (lease.run_id, lease.attempt, lease.tries) == (poison, attempt, attempt)
            assert s.release(lease, error=f"crash {attempt}")
        healthy = s.start_run("healthy")
        lease = claim(s, "w1", max_attempts=3)  # attempt 4 of poison never runs
        assert lease.run_id == healthy
        run = s.get_run(poison)
        assert run is not None and run.status == "failed"
        assert (run.failure_reason, run.last_error) == ("task_attempts_exhausted", "crash 3")
        (task,) = s.get_tasks(poison)
        assert task.lease_owner is None and task.done_at is None  # kept for retry_run
        assert s.claim("w1", TTL) is None

    def test_r6_exhausted_claim_with_nothing_else_returns_none(self, s: Store) -> None:
        run_id = s.start_run("poison")
        assert s.release(claim(s, max_attempts=1))
        assert s.claim("w1", TTL, max_attempts=1) is None
        run = s.get_run(run_id)
        assert run is not None and run.status == "failed"

    def test_r6_expired_leases_count_as_attempts(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t")
        for owner in ("w1", "w3"):  # two workers (B3: one's own takeover would wait)
            claim(s, owner, 10, max_attempts=2)
            clock.advance(10)  # the holder died silently
        assert s.claim("w2", TTL, max_attempts=2) is None
        run = s.get_run(run_id)
        assert run is not None and run.failure_reason == "task_attempts_exhausted"

    # -- "now" is read after the write lock --------------------------------------------------
    def test_now_is_read_after_the_write_lock(
        self, s: Store, backend: Backend, clock: FakeClock
    ) -> None:
        s.start_run("t")
        held = claim(s, "w1", 10)
        s.start_run("u")
        out: dict[str, object] = {}

        def waiter() -> None:
            out["renewed"] = renew_until(s, held, 10)
            out["claimed"] = s.claim("w2", 10)

        with backend.hold_write_lock():
            thread = threading.Thread(target=waiter)
            thread.start()
            wait_for(lambda: blocked_inside(thread, "renew_until"), what="a wait on the lock")
            clock.advance(15)  # time passes while it waits: the lease expires meanwhile
        thread.join(30)
        assert out["renewed"] is None  # judged at the instant it got the lock, not before
        lease = out["claimed"]
        assert isinstance(lease, Lease)
        assert (lease.claimed_at, lease.expires_at) == (clock.now, clock.now + 10)  # not stale


def test_a_claim_s_start_and_a_renewal_s_starting_leases_are_checked(s: Store) -> None:
    """``start`` is None or a whole number from 0; a renewal records the start only of leases it
    renews (the same attempt): a caller's bug is refused before anything is written."""
    s.start_run("t")
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="start is None or a whole number"):
            s.commit_many((), claim=ClaimRequest("w1", TTL, limit=2, start=bad))  # type: ignore[arg-type]
    lease = claim(s, "w1")
    other = Lease(lease.task_id, lease.run_id, "t", None, lease.attempt + 1, "w1", 0.0, 0.0)
    for starting in ([other], [lease]):
        renewing = [] if starting == [lease] else [lease]
        with pytest.raises(ValueError, match="starting leases must be among"):
            s.renew_each(renewing, TTL, starting=starting)
    assert s.renew_each([lease], TTL, starting=[lease])[0].expires_at is not None
