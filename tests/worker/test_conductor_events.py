"""The conductor's event handling (``workerproc/worker.py``, ``workerproc/events.py``): what happens
on the spot, on the thread that reports, and what the conductor does when it takes the events at
its turn. A real ``Worker`` with a store it must never talk to here (``NoStore``), its heartbeat
thread never started, and a fake clock for its decisions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import FakeClock

from workerproc import App, exitcodes
from workerproc.config import WorkerConfig
from workerproc.events import (
    DrainAsked,
    HeartbeatDied,
    Inbox,
    LeaseLost,
    Reaction,
    SlowBehind,
    TaskFinished,
)
from workerproc.execution import Execution, Mode, Stopped
from workerproc.policy import RECENT
from workerproc.signals import Waker
from workerproc.store import Commit, Lease
from workerproc.worker import Worker

OWNER = "host:1:1.00:w"


class NoStore:
    """A store the conductor must not use in these tests: any call fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the conductor talked to the store ({name})")


def lease(task_id: int, attempt: int = 1) -> Lease:
    return Lease(task_id, task_id, "t", {}, attempt, OWNER, 0.0, 0.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_worker(clock: FakeClock | None = None, app: App | None = None, **options: Any) -> Worker:
    config = WorkerConfig(db="x.db", app="tests:app", **options)
    store: Any = NoStore()
    w = Worker(store, app or App(), config, owner=OWNER, open_store=lambda: store)
    if clock is not None:
        w.policy.clock = clock  # the decisions' clock (the heartbeat's is never started)
    return w


@pytest.fixture
def worker(clock: FakeClock) -> Iterator[Worker]:
    w = make_worker(clock, concurrency=2, graceful_timeout=30.0, max_tasks=3)
    yield w
    w.waker.close()


def running(w: Worker, ex: Execution) -> Execution:
    """``ex``'s lease held and its handler running, as the starter leaves them."""
    w.heartbeat.track(ex.lease, time.monotonic())
    with w.holdings.lock:
        w.holdings.begin(ex)
    return ex


def on_a_thread(post: Any) -> Any:
    """Call ``post`` on a thread of its own (as a slot thread or the heartbeat does)."""
    answers: list[Any] = []
    t = threading.Thread(target=lambda: answers.append(post()))
    t.start()
    t.join(10)
    assert answers, "the post did not return"
    return answers[0]


def wakes(waker: Waker) -> int:
    """How many wake-ups wait in the conductor's self-pipe (taking them)."""
    try:
        return len(os.read(waker.rfd, 512))
    except BlockingIOError:
        return 0


def ended(ex: Execution, commit: Commit | None, seconds: float = 0.01) -> Execution:
    """What an executor records on ``ex`` as its handler ends."""
    ex.began, ex.commit, ex.seconds = True, commit, seconds
    return ex


def test_an_ending_frees_its_slot_on_the_spot_and_is_collected_at_the_turn(
    worker: Worker,
) -> None:
    ex = running(worker, Execution(lease(1), lambda ctx: None, Mode.THREAD))
    commit = Commit(ex.lease, "finish", new_state={"done": True})
    assert on_a_thread(lambda: worker.inbox.post(TaskFinished(ended(ex, commit)))) is None
    # on the spot: the slot is free (a slot thread may start the next task at once) ...
    assert worker.holdings.running == {} and not worker.holdings.busy()
    # ... the conductor has not heard of it yet, and is woken for it
    assert len(worker.inbox) == 1 and worker.completer.pending == []
    assert wakes(worker.waker) == 1
    worker._react(worker.inbox.take())
    assert worker.completer.pending == [commit]  # written with the next exchange
    assert worker.counters.done == 1 and worker.policy.tasks_done == 1
    assert worker.heartbeat.confirmed_at(ex.lease) is not None  # renewed until that commit


def test_a_batch_of_endings_wakes_the_conductor_once(worker: Worker) -> None:
    executions = [running(worker, Execution(lease(n), lambda ctx: None, Mode.THREAD))
                  for n in (1, 2)]  # fmt: skip
    for ex in executions:
        on_a_thread(lambda: worker.inbox.post(TaskFinished(ended(ex, Commit(ex.lease, "finish")))))  # noqa: B023
    assert len(worker.inbox) == 2
    assert wakes(worker.waker) == 1  # the first since the conductor last took them
    worker._react(worker.inbox.take())
    assert [c.lease.task_id for c in worker.completer.pending] == [1, 2]


def test_the_conductors_own_posts_wake_nothing(worker: Worker) -> None:
    """An inline handler's ending is posted on the conductor's thread: it is awake."""
    ex = running(worker, Execution(lease(1), lambda ctx: None, Mode.INLINE))
    worker.inbox.post(TaskFinished(ended(ex, Commit(ex.lease, "finish"))))
    assert len(worker.inbox) == 1 and wakes(worker.waker) == 0


def test_an_ending_with_nothing_to_write_stops_its_renewal(worker: Worker) -> None:
    ex = running(worker, Execution(lease(1), lambda ctx: None, Mode.THREAD))
    ex.lost.set()  # lost: whatever it made is discarded
    worker.inbox.post(TaskFinished(ended(ex, None)))
    worker._react(worker.inbox.take())
    assert worker.completer.pending == []
    assert worker.heartbeat.confirmed_at(ex.lease) is None  # no longer renewed


def test_an_abandoned_ending_is_counted_and_writes_nothing(worker: Worker) -> None:
    """Timed out on a thread: its lease was released on the heartbeat's connection already."""
    ex = running(worker, Execution(lease(1), lambda ctx: None, Mode.THREAD))
    ex.stopped = Stopped.ABANDONED
    worker.heartbeat.untrack([ex.lease], wait=False)  # (the timeout's reaction did)
    worker.inbox.post(TaskFinished(ended(ex, None, seconds=5.0)))
    worker._react(worker.inbox.take())
    assert worker.completer.pending == [] and worker.counters.done == 1


def test_a_handler_that_never_began_is_no_task_done(worker: Worker) -> None:
    ex = running(worker, Execution(lease(1), lambda ctx: None, Mode.THREAD))
    ex.stopped = Stopped.LATE
    worker.inbox.post(TaskFinished(ended(ex, Commit(ex.lease, "handback"))))
    worker._react(worker.inbox.take())
    assert worker.counters.done == 0 and worker.policy.tasks_done == 0
    assert [c.kind for c in worker.completer.pending] == ["handback"]


def test_max_tasks_done_drains_the_worker_for_recycling(worker: Worker) -> None:
    for n in (1, 2, 3):
        ex = running(worker, Execution(lease(n), lambda ctx: None, Mode.THREAD))
        worker.inbox.post(TaskFinished(ended(ex, Commit(ex.lease, "finish"))))
        assert worker.policy.accepting  # not before the conductor hears of it
    worker._react(worker.inbox.take())
    assert not worker.policy.accepting and worker.policy.drain_code == exitcodes.RECYCLE
    worker.completer.take()  # (written by the next exchange)
    assert worker._drained() == exitcodes.RECYCLE


def test_a_drain_asked_waits_for_the_slots_then_for_the_graceful_timeout_at_most(
    worker: Worker, clock: FakeClock
) -> None:
    busy = running(worker, Execution(lease(1), lambda ctx: None, Mode.THREAD))
    worker.inbox.post(DrainAsked(exitcodes.TASK_TIMEOUT, "a timeout cost a slot"))
    worker.inbox.post(DrainAsked(exitcodes.RECYCLE, "later"))  # the first drain keeps its code
    assert worker.policy.accepting  # the conductor decides, at its turn
    worker._react(worker.inbox.take())
    assert not worker.policy.accepting
    assert worker._drained() is None  # a slot still runs
    clock.advance(29.0)
    assert worker._drained() is None
    clock.advance(1.0)  # --graceful-timeout passed
    assert worker._drained() == exitcodes.TASK_TIMEOUT
    assert busy.lease.task_id in worker.holdings.running  # exits without it


def test_an_event_not_taken_yet_keeps_a_drained_worker_from_exiting(worker: Worker) -> None:
    worker._react([DrainAsked(exitcodes.TASK_TIMEOUT, "a timeout")])
    ex = Execution(lease(1), lambda ctx: None, Mode.THREAD)
    worker.inbox.post(TaskFinished(ended(ex, Commit(ex.lease, "finish"))))
    assert worker._drained() is None  # its commit is not buffered yet
    worker._react(worker.inbox.take())
    assert worker._drained() is None  # buffered, not written
    worker.completer.take()
    assert worker._drained() == exitcodes.TASK_TIMEOUT


def test_the_heartbeats_death_interrupts_every_handler_and_the_conductor_exits(
    worker: Worker,
) -> None:
    executions = [running(worker, Execution(lease(n), lambda ctx: None, Mode.THREAD))
                  for n in (1, 2)]  # fmt: skip
    worker.heartbeat.close()  # (it never started: it is not alive either way)
    worker.inbox.post(HeartbeatDied(RuntimeError("boom")))
    assert all(ex.lost.is_set() for ex in executions)  # on the spot
    assert worker.exit_code is None
    worker._react(worker.inbox.take())
    assert worker.exit_code == exitcodes.HEARTBEAT_DIED
    assert worker._health() == exitcodes.HEARTBEAT_DIED


def test_a_lost_lease_interrupts_its_handler_on_the_spot_and_never_the_next_attempt(
    worker: Worker,
) -> None:
    ex = running(worker, Execution(lease(1), lambda ctx: None, Mode.THREAD))
    assert worker.inbox.post(LeaseLost(lease(1, attempt=2), "a late word")) is None
    assert not ex.lost.is_set()  # another attempt's word: never this one's
    assert worker.inbox.post(LeaseLost(ex.lease, "refused")) is None
    assert ex.lost.is_set() and ex.ctx.lease_lost
    worker._react(worker.inbox.take())  # nothing more: its ending comes as TaskFinished
    assert ex.lease.task_id in worker.holdings.running and worker.completer.pending == []


def test_a_lost_waiting_lease_never_starts_and_the_heartbeat_forgets_it(worker: Worker) -> None:
    """Lost while it waited for a slot (here: this worker's own claim took it over, reported on
    the conductor's thread): out of the waiting line on the spot, and renewed no more."""
    old = lease(1)
    worker.heartbeat.track(old, time.monotonic())
    worker.holdings.add_waiting([old])
    assert worker.alarms.react(LeaseLost(old, "x")) == Reaction(forget=(old,))
    worker.holdings.add_waiting([old])
    worker.heartbeat.track(lease(1, attempt=2), time.monotonic())  # takes the old one over
    assert list(worker.holdings.waiting) == []
    assert worker.heartbeat.confirmed_at(old) is None
    assert worker.heartbeat.confirmed_at(lease(1, attempt=2)) is not None
    assert [type(e) for e in worker.inbox.take()] == [LeaseLost]


def test_a_hand_back_behind_a_slow_inline_handler_resets_the_prefetch(worker: Worker) -> None:
    for _ in range(RECENT):
        worker.policy.task_done(0.001)
    assert worker.policy.fast
    waiting = [lease(1), lease(2)]
    worker.holdings.add_waiting(waiting)
    chore = worker.alarms.hand_back_behind()  # on the heartbeat thread, while the handler runs
    assert [c.kind for c in chore.write] == ["handback", "handback"]
    assert chore.forget == tuple(waiting) and chore.then == SlowBehind(2)
    assert list(worker.holdings.waiting) == []
    assert worker.policy.fast  # the conductor's decision, not the heartbeat thread's
    worker._react([SlowBehind(2)])
    assert not worker.policy.fast


def test_the_wait_returns_at_once_while_an_event_waits(worker: Worker) -> None:
    worker.inbox.post(DrainAsked(exitcodes.OK, "x"))
    began = time.monotonic()
    worker._wait(want=1)  # (with NoStore: it must not even look at the store)
    assert time.monotonic() - began < 1.0


def test_an_inline_handlers_ending_is_taken_before_the_next_start() -> None:
    """One slot, plain handlers: each runs within ``submit`` on the conductor's thread; the
    conductor takes its ending before it starts the next one, so ``--max-tasks 1`` starts one."""
    app = App()
    ran: list[int] = []
    app.task("t")(lambda ctx: ran.append(ctx.task_id))
    w = make_worker(app=app, concurrency=1, max_tasks=1)
    try:
        first, second = lease(1), lease(2)
        for x in (first, second):
            w.heartbeat.track(x, time.monotonic())  # confirmed a moment ago: may start
        w.holdings.add_waiting([first, second])
        w._start_waiting()
        assert ran == [1]
        assert w.policy.drain_code == exitcodes.RECYCLE
        assert list(w.holdings.waiting) == [second]  # handed back by the next exchange
        assert [c.lease for c in w.completer.pending] == [first]
    finally:
        w.waker.close()


def test_the_inbox_runs_the_reflex_on_the_posting_thread_and_keeps_the_order() -> None:
    waker = Waker()
    seen: list[tuple[str, int]] = []

    def reflex(report: Any) -> Reaction | None:
        seen.append((threading.current_thread().name, report.code))
        return Reaction(postpone=True) if report.code == 2 else None

    inbox = Inbox(waker, reflex)
    try:
        answers: list[Reaction | None] = []
        t = threading.Thread(target=lambda: answers.append(inbox.post(DrainAsked(2, "b"))),
                             name="poster")  # fmt: skip
        assert inbox.post(DrainAsked(1, "a")) is None
        t.start()
        t.join(10)
        assert answers == [Reaction(postpone=True)]
        assert seen == [("MainThread", 1), ("poster", 2)]
        assert [e.code for e in inbox.take()] == [1, 2]  # type: ignore[union-attr]
        assert not inbox and inbox.take() == []
    finally:
        waker.close()
