"""Test app whose handlers keep an independent ledger of when they run.

Every handler appends one JSON line per event to the O_APPEND file named by its payload's
``ledger``: ``start`` when it begins, ``end`` when it returns, ``lost`` when it learns its lease
is gone. One ``os.write`` per line (far below PIPE_BUF), so lines of concurrent processes never
interleave. The chaos tests read the ledger to prove that no handler of attempt k starts after
attempt k+1 of the same task began, whatever the workers' own logs say.

Each run has ``steps`` steps; a step sleeps between ``sleep`` and ``sleep_max`` seconds (drawn per
task and attempt), in short naps with a lease check between them, and appends one write to the
run's state (so the state shows whether any step committed twice).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

from workerproc import App, LeaseLost, TaskContext

app = App()
NAP = 0.01


def note(path: str, event: str, ids: dict[str, Any]) -> None:
    line = json.dumps({"ev": event, "t": time.time(), "pid": os.getpid(), **ids}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _begin(ctx: TaskContext) -> tuple[str, dict[str, Any], float]:
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id}
    path = str(ctx.payload["ledger"])
    note(path, "start", ids)
    low = float(ctx.payload["sleep"])
    high = float(ctx.payload.get("sleep_max", low))
    return path, ids, random.Random(ctx.task_id * 1000 + ctx.attempt).uniform(low, high)


def _last_word(ctx: TaskContext, name: str) -> None:
    n = int(ctx.payload["n"])
    state = dict(ctx.state or {})
    state["writes"] = [*state.get("writes", []), {"step": n, "attempt": ctx.attempt}]
    if n + 1 < int(ctx.payload["steps"]):
        ctx.advance(state, next=name, payload={**ctx.payload, "n": n + 1})
    else:
        ctx.finish(state)


@app.task
def step(ctx: TaskContext) -> None:
    path, ids, seconds = _begin(ctx)
    try:
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(NAP, left))
            ctx.raise_if_lost()
        _last_word(ctx, "step")
    except LeaseLost:
        note(path, "lost", ids)
        raise
    note(path, "end", ids)


@app.task
async def astep(ctx: TaskContext) -> None:
    import asyncio  # noqa: PLC0415 - only the async variant needs it

    path, ids, seconds = _begin(ctx)
    try:
        await asyncio.sleep(seconds)
        _last_word(ctx, "astep")
    except (asyncio.CancelledError, LeaseLost):
        if ctx.lease_lost:
            note(path, "lost", ids)
        raise
    note(path, "end", ids)


@app.task
def mark(ctx: TaskContext) -> None:
    """Only notes that it began (and ended)."""
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id}
    note(str(ctx.payload["ledger"]), "start", ids)
    note(str(ctx.payload["ledger"]), "end", ids)


@app.task
def freeze(ctx: TaskContext) -> None:
    """Stops its own process (all of it: the heartbeat too) the moment it begins, as a frozen VM
    would; the test resumes it with SIGCONT."""
    note(str(ctx.payload["ledger"]), "start", {"task": ctx.task_id, "attempt": ctx.attempt,
                                                "run": ctx.run_id})  # fmt: skip
    began = time.monotonic()
    os.kill(os.getpid(), signal.SIGSTOP)  # lands a moment later: never return before it did
    while time.monotonic() - began < 0.5:
        time.sleep(0.01)


@app.task
async def afreeze(ctx: TaskContext) -> None:
    freeze(ctx)


@app.task
async def amark(ctx: TaskContext) -> None:
    mark(ctx)


@app.task
def nap(ctx: TaskContext) -> None:
    """Sleeps ``seconds`` (a neighbour that is still running when the process freezes)."""
    time.sleep(float(ctx.payload["seconds"]))


@app.task
async def anap(ctx: TaskContext) -> None:
    import asyncio  # noqa: PLC0415 - only the async variant needs it

    await asyncio.sleep(float(ctx.payload["seconds"]))


@app.task
def late_reader(ctx: TaskContext) -> Any:
    """Works for 1.5 s before it first reads its payload (its lease renewed meanwhile)."""
    time.sleep(1.5)
    return ctx.payload
