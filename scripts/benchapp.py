"""Handlers for the benchmarks and the demo's smoke runs: no-ops, time stamps, and I/O-bound
calls (a sleep standing in for an HTTP or model call) as a plain and as an async handler."""

from __future__ import annotations

import asyncio
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


@app.task
def io_sync(ctx: TaskContext) -> None:
    """An I/O-bound call of payload seconds on a slot's thread."""
    time.sleep(float(ctx.payload))


@app.task
async def io_async(ctx: TaskContext) -> None:
    """The same call on the worker's event loop."""
    await asyncio.sleep(float(ctx.payload))
