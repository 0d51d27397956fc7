"""The test mode on each backend: ``temporary_store(db)`` gives ``run_inline`` a store with a
test clock on the database a pool would use (a fresh PostgreSQL schema, or a SQLite file), and
signals, ``RetryAfter`` and a wait's timeout behave there as on the default temporary SQLite."""

from __future__ import annotations

import time

from workerproc import App, RetryAfter, TaskContext
from workerproc.testing import temporary_store

app = App()


@app.task
def ask(ctx: TaskContext) -> None:
    ctx.wait_for("approval", "decided", timeout=3600, state={"asked": True})


@app.task
def decided(ctx: TaskContext) -> None:
    signal = ctx.signal
    ctx.finish({**ctx.state, "approval": None if signal is None else signal.payload})


@app.task
def busy(ctx: TaskContext) -> None:
    if ctx.attempt < 3:
        raise RetryAfter(600)
    ctx.finish({"attempt": ctx.attempt})


def test_a_signal_resumes_the_wait(db: str) -> None:
    with temporary_store(db) as store:
        began = time.monotonic()
        run = app.run_inline(ask, store=store, signals={"approval": {"ok": True}},
                             clock="virtual")  # fmt: skip
        assert (run.status, run.state) == ("succeeded", {"asked": True, "approval": {"ok": True}})
        assert time.monotonic() - began < 60  # no real wait (bounded for a loaded machine)


def test_a_wait_without_its_signal_times_out_on_the_virtual_clock(db: str) -> None:
    with temporary_store(db) as store:
        run = app.run_inline(ask, store=store, clock="virtual")
        assert (run.status, run.state) == ("succeeded", {"asked": True, "approval": None})
        assert store.now() - run.created_at >= 3600  # the hour passed on the test's clock


def test_retry_after_is_no_error_and_its_delay_passes_at_once(db: str) -> None:
    with temporary_store(db) as store:
        run = app.run_inline(busy, store=store, clock="virtual")
        assert (run.status, run.state) == ("succeeded", {"attempt": 3})
        assert store.now() - run.created_at >= 2 * 600 * 0.5  # two delays (with their jitter)
