"""Test app for chaos mode: three steps per run; each committed step appends one write to the
run's state, so the state itself shows whether any step was committed twice."""

from __future__ import annotations

import time

from workerproc import App, TaskContext

app = App()


@app.task
def step(ctx: TaskContext) -> None:
    n = int(ctx.payload["n"])
    time.sleep(float(ctx.payload["sleep"]))
    state = dict(ctx.state or {})
    state["writes"] = [*state.get("writes", []), {"step": n, "attempt": ctx.attempt}]
    if n + 1 < int(ctx.payload["steps"]):
        ctx.advance(state, next="step", payload={**ctx.payload, "n": n + 1})
    else:
        ctx.finish(state)
