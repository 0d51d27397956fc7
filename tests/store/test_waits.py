"""Runs that wait for signals (docs/protocol.md B14), in the store, on every
backend, with the fake clock: a wait is a next task that is not due (no lease, no claim), a
signal is kept until a wait of its name takes it and resumes that one wait, a timeout resumes
it without one, a finished or unknown run refuses signals, and a zombie's wait is refused."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import FakeClock
from store_backends import Backend

from workerproc.store import (
    CasResult,
    Commit,
    Lease,
    RunNotFound,
    RunOver,
    Store,
    open_async_store,
)
from workerproc.store.codec import WAIT_FOREVER

TTL = 30.0


def wait(
    s: Store, lease: Lease, name: str, nxt: str = "after", timeout: float | None = None
) -> CasResult:
    commit = Commit(lease, "wait", expected_revision=lease.revision, new_state={"w": name},
                    next_task=nxt, next_payload={"n": 1},
                    delay=WAIT_FOREVER if timeout is None else timeout,
                    wait_for=f"signal:{name}")  # fmt: skip
    return s.commit_many([commit]).results[0]


def finish(s: Store, lease: Lease) -> None:
    out = s.commit_many([Commit(lease, "finish", expected_revision=lease.revision, new_state={})])
    assert out.results == (CasResult.OK,)


def one(s: Store, owner: str = "w") -> Lease:
    (lease,) = s.claim(owner, TTL, limit=5)
    return lease


def waiting_run(s: Store, name: str = "approval", timeout: float | None = None) -> int:
    run_id = s.start_run("draft")
    assert wait(s, one(s), name, timeout=timeout) is CasResult.OK
    return run_id


def test_a_waiting_run_is_never_claimed_and_shows_waiting(s: Store, clock: FakeClock) -> None:
    run_id = waiting_run(s)
    assert s.claim("w", TTL, limit=5) == []
    clock.advance(86_400 * 365)  # a year on: a wait without a timeout still waits
    assert s.claim("w", TTL, limit=5) == []
    run = s.get_run(run_id)
    assert run is not None and run.status == "waiting" and run.waiting_for == "signal:approval"
    assert [r.id for r in s.list_runs(status="waiting")] == [run_id]
    assert s.list_runs(status="pending") == []
    assert s.stats().runs.get("waiting") == 1 and "pending" not in s.stats().runs


def test_a_signal_during_the_wait_resumes_it_once(s: Store) -> None:
    run_id = waiting_run(s)
    sid = s.signal(run_id, "approval", {"ok": True})
    lease = one(s)
    assert lease.task == "after" and lease.payload == {"n": 1} and lease.state == {"w": "approval"}
    assert lease.signal is not None and lease.signal.name == "approval"
    assert lease.signal.payload == {"ok": True} and sid > 0
    run = s.get_run(run_id)
    assert run is not None and run.status == "running" and run.waiting_for is None
    finish(s, lease)
    run = s.get_run(run_id)
    assert run is not None and run.status == "succeeded"


def test_a_signal_sent_before_the_wait_is_kept_and_delivered_when_it_waits(s: Store) -> None:
    run_id = s.start_run("draft")
    first = one(s)
    s.signal(run_id, "approval", {"early": 1})
    s.signal(run_id, "other", {"no": 1})  # another name: no wait of this run takes it
    assert wait(s, first, "approval") is CasResult.OK
    lease = one(s)  # due at once: the kept signal was delivered by the wait commit
    assert lease.signal is not None and lease.signal.payload == {"early": 1}


@pytest.mark.parametrize("early", [True, False])
def test_a_wait_of_timeout_zero_takes_a_signal_sent_before_it(
    s: Store, clock: FakeClock, early: bool
) -> None:
    """The order of the signal and the wait does not matter with ``timeout=0``
    either: the wait commit takes the kept signal at once (its deadline is now)."""
    run_id = s.start_run("draft")
    first = one(s)
    if early:
        s.signal(run_id, "approval", {"early": 1})
    assert wait(s, first, "approval", timeout=0) is CasResult.OK
    clock.advance(5)  # claimed after its deadline: the signal was taken by the wait already
    lease = one(s)
    assert lease.task == "after"
    if not early:  # nothing kept: due at once, without one (a signal now is kept for later)
        assert lease.signal is None
        return
    assert lease.signal is not None and lease.signal.payload == {"early": 1}
    finish(s, lease)
    (sent,) = s.run_signals(run_id)
    assert sent.task_id == lease.task_id  # taken, not kept on a finished run


def test_a_signal_after_a_timeout_is_kept_for_a_later_wait(s: Store, clock: FakeClock) -> None:
    run_id = waiting_run(s, timeout=60)
    assert s.claim("w", TTL, limit=5) == []
    clock.advance(61)
    run = s.get_run(run_id)
    assert run is not None and run.status == "pending"  # the deadline passed: no longer waiting
    timed_out = one(s)
    assert timed_out.task == "after" and timed_out.signal is None
    s.signal(run_id, "approval", {"late": True})  # the wait is over: the signal is kept
    assert wait(s, timed_out, "approval", nxt="again") is CasResult.OK
    lease = one(s)
    assert lease.task == "again" and lease.signal is not None
    assert lease.signal.payload == {"late": True}


def test_one_signal_resumes_one_wait(s: Store) -> None:
    run_id = waiting_run(s)
    s.signal(run_id, "approval", 1)
    s.signal(run_id, "approval", 2)  # the wait was resumed by the first: this one is kept
    lease = one(s)
    assert lease.signal is not None and lease.signal.payload == 1
    assert wait(s, lease, "approval", nxt="second") is CasResult.OK
    second = one(s)
    assert second.task == "second" and second.signal is not None and second.signal.payload == 2
    assert wait(s, second, "approval", nxt="third") is CasResult.OK
    assert s.claim("w", TTL, limit=5) == []  # no third signal: it waits


def test_a_failed_attempt_of_the_resumed_task_keeps_its_signal(s: Store) -> None:
    run_id = waiting_run(s)
    s.signal(run_id, "approval", "yes")
    lease = one(s)
    out = s.commit_many([Commit(lease, "release", error="boom")])
    assert out.results == (CasResult.OK,)
    again = one(s)
    assert again.task_id == lease.task_id and again.signal is not None
    assert again.signal.payload == "yes"


def test_a_signal_to_a_finished_or_unknown_run_is_an_error(s: Store) -> None:
    run_id = s.start_run("draft")
    finish(s, one(s))
    with pytest.raises(RunOver, match="succeeded"):
        s.signal(run_id, "approval")
    with pytest.raises(RunNotFound):
        s.signal(run_id + 100, "approval")
    cancelled = waiting_run(s)
    assert s.cancel_run(cancelled)
    with pytest.raises(RunOver, match="cancelled"):
        s.signal(cancelled, "approval")
    with pytest.raises(ValueError):
        s.signal(cancelled, "")


def test_a_zombie_wait_is_refused_and_waits_nothing(s: Store, clock: FakeClock) -> None:
    run_id = s.start_run("draft")
    zombie = one(s, "zombie")
    clock.advance(TTL + 1)
    taker = one(s, "taker")
    assert wait(s, zombie, "approval") is CasResult.LEASE_LOST
    run = s.get_run(run_id)
    assert run is not None and run.status == "running" and run.waiting_for is None
    s.signal(run_id, "approval")  # kept: the run waits for nothing yet
    assert wait(s, taker, "approval") is CasResult.OK
    assert one(s).signal is not None


def test_a_cancelled_waiting_run_retried_is_due_and_not_waiting(s: Store) -> None:
    run_id = waiting_run(s)
    assert s.cancel_run(run_id) and s.retry_run(run_id)
    run = s.get_run(run_id)
    assert run is not None and run.status == "pending" and run.waiting_for is None
    assert one(s).signal is None


def test_concurrent_signals_to_one_wait_resume_it_once(backend: Backend) -> None:
    """Two signals sent at once from two connections while the run waits: one resumes the
    wait, the other is kept for the next wait (real clock, real concurrency)."""
    with backend.open() as s:
        run_id = waiting_run(s)
        start = threading.Barrier(2)

        def send(n: int) -> None:
            with backend.open() as mine:
                start.wait(10)
                mine.signal(run_id, "approval", n)

        threads = [threading.Thread(target=send, args=(n,)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        (lease,) = s.claim("w", TTL, limit=5)
        assert lease.signal is not None
        assert s.claim("w", TTL, limit=5) == []  # one wait, one delivery
        assert wait(s, lease, "approval", nxt="second") is CasResult.OK
        (second,) = s.claim("w", TTL, limit=5)
        assert second.signal is not None
        assert {lease.signal.payload, second.signal.payload} == {1, 2}
        assert wait(s, second, "approval", nxt="third") is CasResult.OK
        assert s.claim("w", TTL, limit=5) == []


def test_the_async_store_signals_as_the_sync_one_does(backend: Backend) -> None:
    with backend.open() as s:
        run_id = waiting_run(s)
        done = s.start_run("other")
        finish(s, one(s))

    async def main() -> int:
        async with await open_async_store(backend.url) as store:
            with pytest.raises(RunOver):
                await store.signal(done, "approval")
            with pytest.raises(RunNotFound):
                await store.signal(run_id + 100, "approval")
            return await store.signal(run_id, "approval", {"async": True})

    assert asyncio.run(main()) > 0
    with backend.open() as s:
        lease = one(s)
        assert lease.signal is not None and lease.signal.payload == {"async": True}
