"""Test app for flow control under chaos (tests/chaos/test_limits_chaos.py): every step waits behind
two limits, a shared one (``api``: concurrency, rate and tokens) and one per tenant, and keeps
an independent ledger (tests/apps/ledger_app.py's format, plus ``used``: the tokens it reported,
and ``retry``: it raised RetryAfter). A ``retries`` payload makes its first attempts raise
RetryAfter; the task allows 3 attempts only, so it succeeds only if RetryAfter spends none."""

from __future__ import annotations

import random
import time

from apps.ledger_app import NAP, note
from workerproc import App, LeaseLost, RetryAfter, TaskContext

app = App()
app.limit("api", concurrency=3, rate="10/s", burst=3, tokens="20000/s", token_burst=2000)
app.limit("per-tenant", concurrency=2, per="tenant")


@app.task(limits=["api", "per-tenant"], tokens=300, max_attempts=3)
def call(ctx: TaskContext) -> None:
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id,
           "tenant": ctx.payload["tenant"]}  # fmt: skip
    path = str(ctx.payload["ledger"])
    note(path, "start", ids)
    if ctx.attempt - 1 < int(ctx.payload.get("retries", 0)):
        note(path, "retry", ids)
        raise RetryAfter(0.2, limit=False)
    rng = random.Random(ctx.task_id * 1000 + ctx.attempt)
    try:
        until = time.monotonic() + rng.uniform(0.05, 0.2)
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(NAP, left))
            ctx.raise_if_lost()
        used = 100 + (ctx.task_id * 7 + ctx.attempt) % 200
        ctx.usage(tokens=used)
        n = int(ctx.payload["n"])
        if n + 1 < int(ctx.payload["steps"]):
            ctx.advance(ctx.state, next="call", payload={**ctx.payload, "n": n + 1})
        else:
            ctx.finish(ctx.state)
    except LeaseLost:
        note(path, "lost", ids)
        raise
    note(path, "end", {**ids, "used": used})
