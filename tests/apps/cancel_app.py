"""Handlers for the cancel-in-flight process tests (tests/process/test_cancel_in_flight.py,
B15). Each notes, as JSON lines in ``payload["log"]``, when it started and when it heard of the
cancel, with the wall clock (the test compares it with the moment it cancelled) and its pid."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from workerproc import App, RunCancelled, TaskContext

app = App()


def note(path: str, ev: str, ctx: TaskContext, **more: Any) -> None:
    line = {"ev": ev, "run": ctx.run_id, "pid": os.getpid(), "t": time.time(), **more}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@app.task("spin")
def spin(ctx: TaskContext) -> Any:
    """Runs until cancelled: with ``calls`` it reads its state every 20 ms (a ctx call: where a
    handler on a slot thread hears the cancel), else it sleeps without one (inline: interrupted
    at once). Once cancelled it tries to finish anyway: refused."""
    payload = dict(ctx.payload or {})
    path = payload["log"]
    note(path, "start", ctx)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if payload.get("calls"):
                _ = ctx.state
                time.sleep(0.02)
            else:
                time.sleep(120)
    except RunCancelled:
        note(path, "cancelled", ctx)
        try:
            ctx.finish({"written": "after the cancel"}, result={"late": True})
        except RunCancelled:
            note(path, "finish_refused", ctx)
        raise
    return {"never": True}


@app.task("spin_async")
async def spin_async(ctx: TaskContext) -> Any:
    """Awaits until cancelled (the coroutine is cancelled when its run is)."""
    path = (ctx.payload or {})["log"]
    note(path, "start", ctx)
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        note(path, "cancelled", ctx)
        raise
    return {"never": True}


@app.task("quick")
def quick(ctx: TaskContext) -> Any:
    return {"pid": os.getpid()}


@app.task("quick_async")
async def quick_async(ctx: TaskContext) -> Any:
    return {"pid": os.getpid()}
