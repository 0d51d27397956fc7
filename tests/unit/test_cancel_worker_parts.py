"""Cancel in flight (B15), the worker's parts one by one: the context raises ``RunCancelled``, an
execution of a cancelled run ends its lease and writes nothing else (or never begins: a
hand-back), each executor stops its handler
as far as its kind allows, the heartbeat reports a cancelled lease once, and a lease that waits
for a slot never starts once a renewal says its run is cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

import workerproc
from workerproc.alarms import Alarms
from workerproc.app import LeaseLost, RunCancelled, TaskContext
from workerproc.config import WorkerConfig
from workerproc.execution import Execution, Mode, Stopped, conclude
from workerproc.executors import Executor
from workerproc.executors.aio import AsyncExecutor
from workerproc.executors.inline import InlineExecutor
from workerproc.executors.threads import ThreadExecutor
from workerproc.heartbeat import Heartbeat
from workerproc.holdings import Holdings
from workerproc.signals import Signals, Waker
from workerproc.store import Lease, Renewal, open_store

CONFIG = WorkerConfig(db="x.db", app="tests:app", concurrency=2, max_attempts=3)


def lease(task_id: int = 1) -> Lease:
    return Lease(task_id, task_id, "t", {"n": task_id}, 1, "me", 0.0, 0.0)


class Endings:
    def __init__(self) -> None:
        self.ended: list[Execution] = []

    def __call__(self, ex: Execution) -> None:
        self.ended.append(ex)


def make(mode: Mode, done: Endings) -> Executor:
    if mode is Mode.THREAD:
        return ThreadExecutor(2, CONFIG, lambda ex: done(ex))
    return AsyncExecutor(CONFIG, done)


@pytest.fixture
def waker() -> Any:
    w = Waker()
    yield w
    w.close()


def test_run_cancelled_is_exported_and_escapes_except_exception() -> None:
    assert workerproc.RunCancelled is RunCancelled
    assert issubclass(RunCancelled, BaseException) and not issubclass(RunCancelled, Exception)


def test_every_ctx_call_raises_run_cancelled_once_the_run_is_cancelled() -> None:
    cancelled = threading.Event()
    ctx = TaskContext(lease(), threading.Event(), None, cancelled)
    assert ctx.payload == {"n": 1} and not ctx.cancelled
    cancelled.set()
    assert ctx.cancelled
    calls = [
        lambda: ctx.payload,
        lambda: ctx.state,
        lambda: ctx.revision,
        ctx.raise_if_lost,
        lambda: ctx.finish({"x": 1}),
        lambda: ctx.advance({"x": 1}, next="t"),
        lambda: ctx.usage(tokens=5),
    ]
    for call in calls:
        with pytest.raises(RunCancelled):
            call()
    assert ctx.commit is None
    assert (ctx.run_id, ctx.task_id, ctx.task, ctx.attempt) == (1, 1, "t", 1)  # for logs


def test_a_cancelled_execution_writes_nothing_but_the_end_of_its_lease() -> None:
    ran = Execution(lease(), lambda ctx: None, Mode.THREAD)
    assert ran.may_begin()
    ran.ctx.used_tokens = 7
    ran.ctx.finish({"late": True})  # recorded before the cancel: discarded
    ran.cancelled.set()
    commit = conclude(ran, {"ignored": True}, None, CONFIG)
    assert commit is not None and (commit.kind, commit.used_tokens) == ("release", 7)
    assert commit.new_state is None and commit.result is None
    assert (commit.error or "").startswith("RunCancelled")
    ran.lost.set()  # lost as well: someone else holds the task, nothing is ours to write
    assert conclude(ran, None, RunCancelled(), CONFIG) is None
    unstarted = Execution(lease(), lambda ctx: None, Mode.THREAD)
    unstarted.cancelled.set()
    assert not unstarted.may_begin()  # never begins on a cancelled run
    commit = conclude(unstarted, None, None, CONFIG)
    assert commit is not None and commit.kind == "handback"  # no attempt spent


def test_a_handler_raising_run_cancelled_itself_is_a_failure_not_a_cancel() -> None:
    """Only the worker's word makes an ending a cancel: a drop of a live run's task would
    leave the run with nothing to do."""
    ex = Execution(lease(), lambda ctx: None, Mode.THREAD)
    commit = conclude(ex, None, RunCancelled(), CONFIG)
    assert (
        commit is not None and commit.kind == "release" and "RunCancelled" in (commit.error or "")
    )


def test_a_thread_hears_the_cancel_at_its_next_ctx_call() -> None:
    done = Endings()
    executor = make(Mode.THREAD, done)
    running, heard = threading.Event(), threading.Event()

    def loops(ctx: TaskContext) -> None:
        running.set()
        try:
            while True:
                ctx.raise_if_lost()
                time.sleep(0.005)
        except RunCancelled:
            heard.set()
            raise

    ex = Execution(lease(), loops, Mode.THREAD)
    try:
        executor.submit(ex)
        assert running.wait(10)
        ex.cancelled.set()  # what the alarm does first
        assert executor.interrupt(ex, Stopped.CANCELLED) is False  # a thread cannot be stopped
        wait_for(lambda: done.ended, timeout=10, what="the ending")
    finally:
        executor.close()
    assert heard.is_set()
    assert ex.commit is not None and ex.commit.kind == "release"


def test_the_event_loop_cancels_a_cancelled_run_s_handler() -> None:
    done = Endings()
    executor = make(Mode.ASYNC, done)
    started, heard = threading.Event(), threading.Event()

    async def hangs(ctx: TaskContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            heard.set()
            raise

    ex = Execution(lease(), hangs, Mode.ASYNC)
    try:
        executor.submit(ex)
        assert started.wait(10)
        ex.cancelled.set()
        assert executor.interrupt(ex, Stopped.CANCELLED) is True
        wait_for(lambda: done.ended, timeout=10, what="the ending")
    finally:
        executor.close()
    assert heard.is_set() and ex.stopped is Stopped.CANCELLED
    assert ex.commit is not None and ex.commit.kind == "release"


def test_the_inline_executor_raises_run_cancelled_in_the_handler(waker: Waker) -> None:
    signals = Signals()
    executor = InlineExecutor(CONFIG, signals, waker, Endings(), before=lambda: None,
                              after=lambda: None)  # fmt: skip
    ex = Execution(lease(), lambda ctx: None, Mode.INLINE)
    assert executor.interrupt(ex, Stopped.CANCELLED) is True
    assert signals.interrupt is RunCancelled
    assert executor.interrupt(ex, Stopped.LOST) is True and signals.interrupt is LeaseLost


class Answers:
    """A store stand-in for the heartbeat: every lease renewed, those of ``cancelled`` runs
    answering so."""

    def __init__(self, cancelled: set[int]) -> None:
        self.cancelled = cancelled
        self.rounds = 0

    def renew_each(self, leases: list[Lease], ttl: float, *, starting: Any = ()) -> list[Renewal]:
        self.rounds += 1
        return [Renewal(time.time() + ttl, cancelled=x.run_id in self.cancelled) for x in leases]

    def close(self) -> None:
        pass


def test_the_heartbeat_reports_a_cancelled_lease_once_and_keeps_it_alive() -> None:
    store = Answers(cancelled={2})
    told: list[int] = []
    hb = Heartbeat(lambda: store, ttl=3.0, interval=0.02,  # type: ignore[arg-type, return-value]
                   on_lost=lambda x, why: told.append(-x.task_id),
                   on_timeout=lambda x, s: None, on_death=lambda exc: told.append(0),
                   on_cancelled=lambda x, s: told.append(x.task_id))  # fmt: skip
    one, two = lease(1), lease(2)
    hb.start()
    try:
        begun = time.monotonic()
        hb.track(one, begun)
        hb.track(two, begun)
        wait_for(lambda: store.rounds >= 5, timeout=10, what="five renewal rounds")
        assert told == [2]  # once, however many renewals said so
        renewed = hb.confirmed_at(two)
        assert renewed is not None and renewed > begun  # still renewed: its drop is fenced
        assert set(hb.confirm([one, two], timeout=10)) == {1}  # never confirmed for a start
    finally:
        hb.close()


def test_a_waiting_lease_of_a_cancelled_run_never_starts(tmp_path: Path, waker: Waker) -> None:
    """R4's start renewal of a lease that waited for a slot answers ``cancelled``: the lease
    leaves the waiting line and is handed back (fenced, on the heartbeat's connection);
    a live run's lease in the same round is confirmed and starts."""
    db = str(tmp_path / "lk.db")
    with open_store(db) as s:
        doomed_run = s.start_run("a")
        s.start_run("b")
        doomed, live = s.claim("host:1:1.00:w", 30.0, limit=2)
        if doomed.run_id != doomed_run:
            doomed, live = live, doomed
        assert s.cancel_run(doomed_run)
    holdings = Holdings()
    holdings.add_waiting([doomed, live])
    alarms: list[Alarms] = []
    hb = Heartbeat(lambda: open_store(db), ttl=30.0, interval=10.0,
                   on_lost=lambda x, why: None, on_timeout=lambda x, s: None,
                   on_death=lambda exc: None,
                   on_cancelled=lambda x, s: alarms[0].run_cancelled(x, s))  # fmt: skip
    # the waiting path needs no executor nor policy
    alarms.append(Alarms(CONFIG, holdings, None, None, hb, waker, drain=lambda c, w: None))  # type: ignore[arg-type]
    stale = time.monotonic() - 20.0  # waited long: renewed before it may start
    hb.track(doomed, stale)
    hb.track(live, stale)
    hb.start()
    try:
        confirmed = hb.confirm([doomed, live], timeout=10)
    finally:
        hb.close()
    assert set(confirmed) == {live.task_id}
    assert list(holdings.waiting) == [live] and hb.confirmed_at(doomed) is None
    with open_store(db) as s:
        (task,) = s.get_tasks(doomed_run)
        assert task.done_at is None and task.lease_owner is None  # handed back
        assert task.attempts - task.attempt_base == 0  # no attempt spent
        run = s.get_run(doomed_run)
        assert run is not None and run.status == "cancelled"
        assert s.fence_rejections() == []
