"""Test app for chaos mode under limits (tests/chaos/test_limits_chaos.py): ``step`` (tests/apps/
chaos_app.py's, each committed step appending one write to the run's state) behind a shared cap
of 2 and a cap of 1 per tenant, so a released task waits its line's turn for room; ``capped``
behind the shared cap alone."""

from __future__ import annotations

import random
import time

from workerproc import App, TaskContext

app = App()
app.limit("shared", concurrency=2)
app.limit("tenant", concurrency=1, per="tenant")


def _step(ctx: TaskContext) -> None:
    n = int(ctx.payload["n"])
    low = float(ctx.payload["sleep"])
    high = float(ctx.payload.get("sleep_max", low))
    time.sleep(random.Random(ctx.task_id * 1000 + ctx.attempt).uniform(low, high))
    state = dict(ctx.state or {})
    state["writes"] = [*state.get("writes", []), {"step": n, "attempt": ctx.attempt}]
    if n + 1 < int(ctx.payload["steps"]):
        ctx.advance(state, next=ctx.task, payload={**ctx.payload, "n": n + 1})
    else:
        ctx.finish(state)


@app.task(limits=["shared", "tenant"])
def step(ctx: TaskContext) -> None:
    _step(ctx)


@app.task(limits=["shared"])
def capped(ctx: TaskContext) -> None:
    _step(ctx)
