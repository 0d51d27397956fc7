"""Test app for runs that wait under chaos (tests/chaos/test_waits_chaos.py).

- ``draft`` waits for signal ``go``; each ``step`` appends the signal's payload to the run's
  state and waits again until it has ``k`` of them, then finishes with the list: the state
  moves only by fenced commits, so a signal delivered twice or lost shows in the result.
- ``parent`` spawns ``n`` ``kid`` runs and joins them in ``join``, which counts its commits in
  the state (``joins``) and finishes with the children's results in spawn order.

Every handler naps a little, checking its lease, so kills and pauses land mid-handler.
"""

from __future__ import annotations

import random
import time

from workerproc import App, TaskContext

app = App()


def nap(ctx: TaskContext) -> None:
    rng = random.Random(ctx.task_id * 1000 + ctx.attempt)
    until = time.monotonic() + rng.uniform(0.02, 0.15)
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(0.01, left))
        ctx.raise_if_lost()


@app.task
def draft(ctx: TaskContext) -> None:
    nap(ctx)
    ctx.wait_for("go", next="step", state={"got": [], "k": ctx.payload["k"]})


@app.task
def step(ctx: TaskContext) -> None:
    nap(ctx)
    signal = ctx.signal
    got = [*ctx.state["got"], None if signal is None else signal.payload]
    if len(got) < ctx.state["k"]:
        ctx.wait_for("go", next="step", state={**ctx.state, "got": got})
    else:
        ctx.finish({**ctx.state, "got": got}, result=got)


@app.task
def parent(ctx: TaskContext) -> None:
    nap(ctx)
    kids = [{"task": "kid", "payload": {"i": i}} for i in range(ctx.payload["n"])]
    ctx.spawn(kids, then="join", state={"joins": 0})


@app.task
def kid(ctx: TaskContext) -> dict[str, int]:
    nap(ctx)
    i = int(ctx.payload["i"])
    return {"i": i, "sq": i * i}


@app.task
def join(ctx: TaskContext) -> None:
    nap(ctx)
    results = [c.result for c in ctx.children]
    ctx.finish({"joins": ctx.state["joins"] + 1}, result=results)
