"""Handlers for the benchmarks and the demo's smoke runs: no-ops and time stamps."""

from __future__ import annotations

import time

from workerproc import App, TaskContext

app = App()


@app.task
def noop(ctx: TaskContext) -> None:
    return None


@app.task
def stamp(ctx: TaskContext) -> float:
    """The handler's start time: pickup latency = this minus the enqueue time."""
    return time.time()


@app.task
def hold(ctx: TaskContext) -> float:
    """Sleeps payload seconds; returns when it started (for takeover timing)."""
    started = time.time()
    time.sleep(float(ctx.payload))
    return started


@app.task
def bench(ctx: TaskContext) -> None:
    """The no-op task bench_store's bulk loader enqueues."""
    return None
