"""Test app where limits, paid calls, waits and webhooks meet under chaos
(tests/chaos/test_all_features_chaos.py): every step waits behind a shared cap and a cap per
tenant, makes one paid call inside ``ctx.once`` (``bill`` when it began, ``paid`` when it
answered, ``kept`` once ``once`` returned), works on a while with lease checks (where kills and
pauses mostly land) and advances. The ledger is tests/apps/ledger_app.py's format, so the caps
are judged as tests/chaos/test_limits_chaos.py judges them."""

from __future__ import annotations

import random
import time
from typing import Any

from apps.ledger_app import NAP, note
from workerproc import App, LeaseLost, TaskContext

app = App()
API_CAP, TENANT_CAP = 3, 2
app.limit("api", concurrency=API_CAP)
app.limit("per-tenant", concurrency=TENANT_CAP, per="tenant")


@app.task(limits=["api", "per-tenant"])
def call(ctx: TaskContext) -> None:
    payload = ctx.payload
    path, n = str(payload["ledger"]), int(payload["n"])
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id,
           "tenant": payload["tenant"]}  # fmt: skip
    rng = random.Random(ctx.task_id * 1000 + ctx.attempt)
    note(path, "start", ids)
    try:

        def bill() -> dict[str, Any]:  # the paid call: a zombie's runs on to its end
            note(path, "bill", ids)
            time.sleep(rng.uniform(0.03, 0.08))
            note(path, "paid", ids)
            return {"text": f"answer for step {n}"}

        answer = ctx.once("llm", {"run": ctx.run_id, "step": n}, bill)
        note(path, "kept", {**ids, "reused": bool(ctx.reused)})
        until = time.monotonic() + rng.uniform(0.1, 0.3)
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(NAP, left))
            ctx.raise_if_lost()
        if n + 1 < int(payload["steps"]):
            ctx.advance({"answers": n + 1}, next="call", payload={**payload, "n": n + 1})
        else:
            ctx.finish({"answers": n + 1}, result=answer["text"])
    except LeaseLost:
        note(path, "lost", ids)
        raise
    note(path, "end", ids)
