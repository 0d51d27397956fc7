"""A worker that paused past its own lease and took the task over itself (docs/protocol.md, R4
and B3): the new attempt waits here until the old handler ends, and that wait has a bound.

- A lease the claimer takes over from itself is recorded *waiting*, whatever slot it was claimed
  for: its older handler may still run in that worker, and the new one begins only once that one
  ended (the renewal that confirms it records its start). A kill meanwhile spends nothing of it.
- The old attempt, lost, is still watched: a handler that ignores ``LeaseLost`` for a whole ttl
  ends the process (``LEASE_STUCK``) even though the new attempt replaced it in the heartbeat;
  otherwise the new attempt, renewed all along, could wait behind it for ever.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import ledger
import pytest
from attempts_helpers import WORKER, Renewals, lapse, pause
from helpers import FakeClock, reports, wait_for
from limits_helpers import limited
from procs import spawn_worker
from store_backends import TTL, claim

from workerproc import App, TaskContext, exitcodes, testing
from workerproc.config import WorkerConfig
from workerproc.events import TaskFinished
from workerproc.execution import Execution, Mode
from workerproc.heartbeat import Heartbeat
from workerproc.store import ClaimRequest, Lease, Store, open_store
from workerproc.store.limits import LimitSpec
from workerproc.worker import Worker


def outcomes(s: Store, run_id: int) -> list[tuple[int, str]]:
    return [(a.attempt, a.outcome) for a in s.attempt_history(run_id)]


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "limited"])
def test_a_lease_taken_over_from_its_own_claimer_is_recorded_waiting(
    s: Store, clock: FakeClock, gated: bool
) -> None:
    """A claim for a free slot records its lease as begun, except one its claimer takes over from
    itself: that worker's older handler may still run, and the new attempt waits for it. It used
    to be recorded as begun, so a kill while it waited spent it (an attempt is spent only by a
    handler that began, B3)."""
    if gated:  # the gated claim leases by its own statement
        limited(s, LimitSpec("m", concurrency=2), task="t")
    run_id = s.start_run("t")
    assert claim(s, "w1").started
    lapse(clock)
    again = s.commit_many((), claim=ClaimRequest("w1", TTL, 3, 1)).leases[0]  # a free slot
    assert (again.attempt, again.tries, again.takeover, again.started) == (2, 2, True, False)
    assert again.previous_owner == "w1"
    lapse(clock)  # killed before the older handler ended: the new one never began
    other = claim(s, "w2")
    assert (other.attempt, other.tries, other.started) == (3, 2, True)
    assert outcomes(s, run_id) == [(1, "taken_over"), (2, "unstarted")]


def test_a_self_takeover_counts_once_its_start_is_recorded(s: Store, clock: FakeClock) -> None:
    run_id = s.start_run("t")
    claim(s, "w1")
    lapse(clock)
    again = claim(s, "w1")  # the pinned claim too
    assert not again.started
    assert s.renew(again, TTL, start=True)  # the older handler ended: this one begins
    lapse(clock)
    assert claim(s, "w2").tries == 3
    assert outcomes(s, run_id) == [(1, "taken_over"), (2, "taken_over")]


def watching(stuck: list[Lease]) -> Heartbeat:
    """A heartbeat with a short ttl whose stuck checks are recorded in ``stuck``."""
    store: Any = Renewals()
    return Heartbeat(lambda: store, ttl=0.2, interval=0.05,
                     post=reports(on_stuck=stuck.append))  # fmt: skip


def test_an_old_attempt_replaced_by_this_workers_takeover_is_still_watched() -> None:
    """The old attempt's handler began and never returns: a ttl after its loss, ``on_stuck``
    fires for it, though the heartbeat now holds the newer attempt of its task."""
    stuck: list[Lease] = []
    hb = watching(stuck)
    old, new = (Lease(7, 7, "t", None, n, "me", 0.0, 0.0) for n in (1, 2))
    hb.track(old, time.monotonic())
    hb.started(old)
    hb.start()
    try:
        hb.track(new, time.monotonic())  # this worker's own takeover: the old one is lost
        assert hb.is_lost(old) and not hb.is_lost(new)
        wait_for(lambda: stuck, timeout=10, what="the stuck check of the old attempt")
        assert stuck == [old]
        assert not hb.is_lost(new)
    finally:
        hb.close()


def test_an_old_attempt_that_returns_is_no_longer_watched() -> None:
    """Once the old handler returned (``finished``), nothing fires for it."""
    stuck: list[Lease] = []
    hb = watching(stuck)
    old, new = (Lease(7, 7, "t", None, n, "me", 0.0, 0.0) for n in (1, 2))
    hb.track(old, time.monotonic())
    hb.started(old)
    hb.start()
    try:
        hb.track(new, time.monotonic())
        hb.finished(old)
        hb.untrack([old], wait=False)
        time.sleep(1.0)  # five ttls: what must not happen has had its chance
        assert stuck == [] and not hb.is_lost(new)
    finally:
        hb.close()


def test_a_stuck_check_the_process_slept_through_gives_the_handler_a_ttl_from_the_wake() -> None:
    """The ttl after a loss is the process's own time: paused past it (the thread looks late),
    the handler, which could not run either, gets a ttl from the wake; one that returns as the
    process wakes is no stuck handler. Looked at on time, it fires."""
    stuck: list[Lease] = []
    hb = watching(stuck)  # never started: the thread's look, called by hand at given moments
    old, new = (Lease(7, 7, "t", None, n, "me", 0.0, 0.0) for n in (1, 2))
    hb.track(old, time.monotonic())
    hb.started(old)
    hb.track(new, time.monotonic())  # the old one is lost now
    lost = time.monotonic()
    due = lost + hb.ttl
    assert hb._next(due + 0.01)[3]  # on time: stuck
    late = due + 5.0  # the process was stopped across the moment
    assert hb._next(late)[3] == []
    assert hb._next(late + hb.ttl / 2)[3] == []
    (held,) = hb._next(late + hb.ttl + 0.01)[3]
    assert held.lease == old


def test_the_heartbeat_hears_of_a_handlers_end_when_it_ends(db_path: str) -> None:
    """Not when the conductor collects it: a conductor slow to collect (an exchange retried
    after a pause) must not make a lost lease's handler that returned look stuck (exit 74)."""
    store = open_store(db_path)
    try:
        app = App()
        config = WorkerConfig(db=db_path, app="tests:app", lease_ttl=1.0)
        w = Worker(store, app, config, owner="host:1:1.00:w", open_store=lambda: store)
        old = Lease(7, 7, "t", None, 1, w.owner, 0.0, 0.0)
        w.heartbeat.track(old, time.monotonic())
        w.heartbeat.started(old)
        w.heartbeat.track(dataclasses.replace(old, attempt=2), time.monotonic())  # old: lost
        w.inbox.post(TaskFinished(Execution(old, lambda ctx: None, Mode.THREAD)))  # its slot's
        assert w.inbox  # not collected by the conductor yet
        assert w.heartbeat._next(time.monotonic() + config.lease_ttl + 0.01)[3] == []
    finally:
        store.close()


def test_a_worker_whose_old_handler_ignores_its_lost_lease_exits_stuck(
    tmp_path: Path, db: str
) -> None:
    """Paused inside a handler deaf to its lease, a worker wakes and takes the task over
    itself; the old handler never looks at its lease. A ttl after the loss the worker exits
    74 (the old attempt's stuck check), as it would had no takeover replaced it. It used to
    renew the new attempt for as long as the old handler ran: here a minute, or for ever."""
    path = tmp_path / "ledger.jsonl"
    store = open_store(db)
    try:
        run_id = store.start_run("deaf", {"ledger": str(path), "seconds": 120.0})
        worker = spawn_worker(db, tmp_path, *WORKER)
        try:
            wait_for(lambda: ledger.read(path), timeout=30, what="the handler started")
            pause(worker)
            wait_for(lambda: worker.popen.poll() is not None, timeout=40, interval=0.05,
                     what="the worker's exit, a ttl after the loss")  # fmt: skip
        finally:
            worker.kill()
        assert worker.popen.returncode == exitcodes.LEASE_STUCK, worker.output()
        out = worker.output()  # each line names the attempt and its try the same way
        assert "task 1 attempt 1 (try 1 of 3): lease lost" in out, out
        assert "task 1 attempt 1 (try 1 of 3): the handler ignored LeaseLost for a whole ttl" in out
        (task,) = store.get_tasks(run_id)
        assert task.attempts == 2, task  # it did take the task over itself
        assert [e.attempt for e in ledger.read(path) if e.ev == "start"] == [1]
    finally:
        store.close()


def test_a_worker_killed_while_its_self_takeover_waits_spends_no_attempt_of_it(
    tmp_path: Path, db: str
) -> None:
    """A worker paused inside a deaf handler wakes, takes its own task over (the new attempt
    waits for the old handler) and dies there. The next owner's claim counts the attempt that
    began, not the one that waited: it used to claim attempt 3 with ``tries`` 3, one pause
    and one kill from failing the run."""
    path = tmp_path / "ledger.jsonl"
    store = open_store(db)
    try:
        run_id = store.start_run("deaf", {"ledger": str(path), "seconds": 120.0})
        worker = spawn_worker(db, tmp_path, *WORKER)
        try:
            wait_for(lambda: ledger.read(path), timeout=30, what="the handler started")
            pause(worker)
            wait_for(lambda: store.get_tasks(run_id)[0].attempts == 2, timeout=30,
                     what="the worker taking its own task over")  # fmt: skip
        finally:
            worker.kill()
        lease = wait_for(lambda: store.claim("thief", 60.0), timeout=30, interval=0.05,
                         what="the dead worker's lease lapsing")  # fmt: skip
        assert (lease.attempt, lease.tries) == (3, 2), worker.output()
        assert outcomes(store, run_id) == [(1, "taken_over"), (2, "unstarted")]
        assert [e.attempt for e in ledger.read(path) if e.ev == "start"] == [1]
    finally:
        store.close()


def test_run_inline_records_the_start_of_its_own_lease_it_took_over(tmp_path: Path) -> None:
    """The test mode claims as one owner: a handler that outlives its lease is taken over by
    the next step of ``run_inline`` itself, which runs it at once, so it records that start
    (B3) and ``max_attempts`` bounds the run as in a pool. (The claim that fails the run is
    its last step: ``run_inline`` used to raise there, reading the run from before it.)"""
    clock = FakeClock()
    store = open_store(str(tmp_path / "lk.db"), clock=clock)
    app = App()

    @app.task
    def slow(ctx: TaskContext) -> None:
        clock.advance(testing.TTL + 1.0)  # past its lease: its release is refused
        raise ValueError("too late")

    try:
        run = app.run_inline(slow, store=store, raise_errors=False, steps=5)
        assert (run.status, run.failure_reason) == ("failed", "task_attempts_exhausted")
        assert outcomes(store, run.id) == [(1, "taken_over"), (2, "taken_over"),
                                           (3, "taken_over"), (4, "exhausted")]  # fmt: skip
    finally:
        store.close()
