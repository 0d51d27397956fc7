"""The executors (``workerproc/executors``), one per handler mode, behind one interface: each runs
a handler and reports its ending with the commit to write; each interrupts its handlers as far as
its kind allows (``Executor.interrupt``: True only when the interruption reaches the handler)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from helpers import wait_for

from workerproc.app import TaskContext
from workerproc.config import WorkerConfig
from workerproc.execution import Execution, Mode, Stopped
from workerproc.executors import Executor, Executors
from workerproc.executors.aio import AsyncExecutor
from workerproc.executors.inline import InlineExecutor
from workerproc.executors.threads import LaneExecutor, ThreadExecutor
from workerproc.signals import Signals, Waker
from workerproc.store import Lease

CONFIG = WorkerConfig(db="x.db", app="tests:app", concurrency=2, max_attempts=3)


def lease(task_id: int = 1) -> Lease:
    return Lease(task_id, task_id, "t", {"n": task_id}, 1, "me", 0.0, 0.0)


class Endings:
    """The worker's side of the callback: every ending, in order."""

    def __init__(self) -> None:
        self.ended: list[Execution] = []

    def __call__(self, ex: Execution) -> None:
        self.ended.append(ex)


@pytest.fixture
def waker() -> Any:
    w = Waker()
    yield w
    w.close()


def make(mode: Mode, done: Endings, waker: Waker) -> Executor:
    if mode is Mode.INLINE:
        return InlineExecutor(CONFIG, Signals(), waker, done, before=lambda: None,
                              after=lambda: None)  # fmt: skip
    if mode is Mode.THREAD:
        return ThreadExecutor(2, CONFIG, lambda ex: done(ex))
    if mode is Mode.LANE:  # (the delivery lane: threads of its own, B20)
        return LaneExecutor(1, CONFIG, lambda ex: done(ex))
    return AsyncExecutor(CONFIG, done)


def handler_for(mode: Mode) -> Any:
    if mode is Mode.ASYNC:

        async def double(ctx: TaskContext) -> int:
            await asyncio.sleep(0)
            return int(ctx.payload["n"]) * 2  # type: ignore[index]

        return double
    return lambda ctx: int(ctx.payload["n"]) * 2


@pytest.mark.parametrize("mode", list(Mode))
def test_each_executor_runs_a_handler_and_reports_its_commit(mode: Mode, waker: Waker) -> None:
    done = Endings()
    executor = make(mode, done, waker)
    assert executor.mode is mode
    ex = Execution(lease(21), handler_for(mode), mode)
    try:
        executor.submit(ex)
        wait_for(lambda: done.ended, timeout=10, what="the ending")
    finally:
        executor.close()
    assert done.ended == [ex]
    assert ex.commit is not None and ex.commit.kind == "finish" and ex.commit.result == 42
    assert executor.dead() is None


def test_a_thread_cannot_be_interrupted_its_next_ctx_call_learns(waker: Waker) -> None:
    done = Endings()
    executor = make(Mode.THREAD, done, waker)
    running = threading.Event()

    def loops(ctx: TaskContext) -> None:
        running.set()
        while True:
            ctx.raise_if_lost()
            time.sleep(0.005)

    ex = Execution(lease(), loops, Mode.THREAD)
    try:
        executor.submit(ex)
        assert running.wait(10)
        ex.lost.set()  # what the heartbeat's report does first
        assert executor.interrupt(ex, Stopped.LOST) is False
        assert executor.interrupt(ex, Stopped.TIMEOUT) is False
        wait_for(lambda: done.ended, timeout=10, what="the ending")
    finally:
        executor.close()
    assert ex.commit is None  # lost: whatever it would have written is discarded


def test_the_event_loop_cancels_and_the_ending_says_why(waker: Waker) -> None:
    done = Endings()
    executor = make(Mode.ASYNC, done, waker)
    started = threading.Event()

    async def hangs(ctx: TaskContext) -> None:
        started.set()
        await asyncio.sleep(60)

    ex = Execution(lease(), hangs, Mode.ASYNC)
    try:
        executor.submit(ex)
        assert started.wait(10)
        assert executor.interrupt(ex, Stopped.TIMEOUT) is True
        wait_for(lambda: done.ended, timeout=10, what="the ending")
    finally:
        executor.close()
    assert ex.stopped is Stopped.TIMEOUT
    assert ex.commit is not None and ex.commit.kind == "release"
    assert "TaskTimeout" in (ex.commit.error or "")


def test_the_inline_executor_interrupts_only_for_a_lost_lease(waker: Waker) -> None:
    signals = Signals()
    executor = InlineExecutor(CONFIG, signals, waker, Endings(), before=lambda: None,
                              after=lambda: None)  # fmt: skip
    ex = Execution(lease(), lambda ctx: None, Mode.INLINE)
    assert executor.interrupt(ex, Stopped.TIMEOUT) is False  # a Python call cannot be stopped
    assert executor.interrupt(ex, Stopped.QUIT) is False  # QUIT's own signal raises Abort
    assert signals.interrupt is None and not waker.drain()
    assert executor.interrupt(ex, Stopped.LOST) is True
    assert signals.interrupt is not None and signals.interrupt.__name__ == "LeaseLost"
    assert executor.on_conductor and not ThreadExecutor.on_conductor


def test_the_inline_executor_hands_the_conductor_s_thread_over_and_back(waker: Waker) -> None:
    order: list[str] = []
    done = Endings()
    executor = InlineExecutor(CONFIG, Signals(), waker, done, before=lambda: order.append("away"),
                              after=lambda: order.append("back"))  # fmt: skip
    executor.submit(Execution(lease(), lambda ctx: order.append("handler"), Mode.INLINE))
    assert order == ["away", "handler", "back"] and len(done.ended) == 1


def test_there_is_one_executor_per_mode(waker: Waker) -> None:
    done = Endings()
    executors = Executors(*(make(mode, done, waker) for mode in Mode))
    assert [executors[mode].mode for mode in Mode] == list(Mode)
    assert executors.dead() is None and executors.blocked() is None
    with pytest.raises(AssertionError):
        Executors(make(Mode.INLINE, done, waker), make(Mode.THREAD, done, waker))
    executors.close()
