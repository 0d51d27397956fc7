"""Test app for chaos mode: three steps per run; each committed step appends one write to the
run's state, so the state itself shows whether any step was committed twice. A step sleeps
``sleep`` seconds, or between ``sleep`` and ``sleep_max`` (drawn per task and attempt)."""

from __future__ import annotations

import random
import time

from workerproc import App, TaskContext

app = App()


@app.task
def step(ctx: TaskContext) -> None:
    n = int(ctx.payload["n"])
    low = float(ctx.payload["sleep"])
    high = float(ctx.payload.get("sleep_max", low))
    time.sleep(random.Random(ctx.task_id * 1000 + ctx.attempt).uniform(low, high))
    state = dict(ctx.state or {})
    state["writes"] = [*state.get("writes", []), {"step": n, "attempt": ctx.attempt}]
    if n + 1 < int(ctx.payload["steps"]):
        ctx.advance(state, next="step", payload={**ctx.payload, "n": n + 1})
    else:
        ctx.finish(state)
