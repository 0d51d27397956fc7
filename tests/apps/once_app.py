"""Test app for paid once under chaos (tests/chaos/test_once_chaos.py): each step makes one paid
call that bills the ledger (``bill``: when it began, ``paid``: when it answered, with its
tokens), inside ``ctx.once`` when the payload says ``once`` (``kept``: once returned, so the
answer is stored), or bare otherwise, then works on a while (where kills and pauses mostly
land) and advances. The ledger is tests/apps/ledger_app.py's format."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from apps.ledger_app import NAP, note
from workerproc import App, TaskContext

app = App()


def work(ctx: TaskContext, seconds: float) -> None:
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(NAP, left))
        ctx.raise_if_lost()


@app.task(max_attempts=20)
def paid(ctx: TaskContext) -> None:
    payload = ctx.payload
    path, n = str(payload["ledger"]), int(payload["n"])
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id}
    rng = random.Random(ctx.task_id * 1000 + ctx.attempt)
    tokens = 1000 + ctx.task_id % 500
    note(path, "start", ids)

    def bill() -> dict[str, Any]:  # the paid call: a zombie's runs on to its end
        note(path, "bill", ids)
        time.sleep(rng.uniform(0.05, 0.12))
        note(path, "paid", {**ids, "tokens": tokens})
        return {"text": f"answer for step {n}", "tokens": tokens}

    request = {"model": "m", "prompt": f"run {ctx.run_id} step {n}"}
    if payload["once"]:
        answer = ctx.once("llm", request, bill, tokens=lambda r: int(r["tokens"]))
        note(path, "kept", {**ids, "reused": bool(ctx.reused)})
    else:
        answer = bill()
        ctx.usage(tokens=int(answer["tokens"]))
    work(ctx, rng.uniform(0.2, 0.4))  # what the step does with its answer
    if n + 1 < int(payload["steps"]):
        ctx.advance({"answers": n + 1}, next="paid", payload={**payload, "n": n + 1})
    else:
        ctx.finish({"answers": n + 1}, result=answer["text"])


def _cut_off(ctx: TaskContext) -> None:
    if ctx.attempt == 1:  # the answer was kept: the next attempt reuses it
        raise ConnectionError("cut off after the call")


@app.task(max_attempts=3)
def once_then_fail(ctx: TaskContext) -> None:
    """A plain handler (inline with one slot): pays, fails, and reuses on its retry."""
    path, ids = str(ctx.payload["ledger"]), {"task": ctx.task_id, "attempt": ctx.attempt,
                                             "run": ctx.run_id}  # fmt: skip

    def chat() -> dict[str, Any]:
        note(path, "bill", ids)
        return {"text": "plain", "tokens": 10}

    answer = ctx.once("llm", {"run": ctx.run_id}, chat, tokens=10)
    _cut_off(ctx)
    ctx.finish({"reused": ctx.reused}, result=answer["text"])


@app.task(max_attempts=3)
async def async_once_then_fail(ctx: TaskContext) -> None:
    """The same on the event loop, with ``once_async``."""
    path, ids = str(ctx.payload["ledger"]), {"task": ctx.task_id, "attempt": ctx.attempt,
                                             "run": ctx.run_id}  # fmt: skip

    async def achat() -> dict[str, Any]:
        note(path, "bill", ids)
        await asyncio.sleep(0.01)
        return {"text": "async", "tokens": 10}

    answer = await ctx.once_async("llm", {"run": ctx.run_id}, achat, tokens=10)
    _cut_off(ctx)
    ctx.finish({"reused": ctx.reused}, result=answer["text"])
