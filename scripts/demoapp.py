"""The demo's workload: a simulated agent, three steps per run.

prepare -> call (a "model" with random latency and occasional errors) -> complete.
Each step bills its tokens into the run's state under its own name, exactly once: the state is
written only through the fenced commit, so an execution that was killed or paused past its
lease (a zombie) can spend tokens but can never bill them. The model is called inside
``ctx.once``: its answer is kept the moment it returns, so an attempt that takes over after the
call had answered reuses it instead of paying again.
"""

from __future__ import annotations

import random
import time
import zlib

from workerproc import App, TaskContext

app = App()

STEPS = ("prepare", "call", "complete")


def tokens_for(run_id: int, step: str) -> int:
    """What a step costs: deterministic per run and step, so re-executions cost the same."""
    return 50 + zlib.crc32(f"{run_id}:{step}".encode()) % 950


def bill(ctx: TaskContext, step: str) -> dict[str, object]:
    state = dict(ctx.state or {})
    billed = dict(state.get("billed", {}))
    billed[step] = billed.get(step, 0) + tokens_for(ctx.run_id, step)
    state["billed"] = billed
    state["tokens"] = sum(billed.values())
    state["attempts"] = {**state.get("attempts", {}), step: ctx.attempt}
    return state


@app.task
def prepare(ctx: TaskContext) -> None:
    time.sleep(random.uniform(0.005, 0.03))
    ctx.advance(bill(ctx, "prepare"), next="call", payload=ctx.payload)


def model(run_id: int) -> dict[str, object]:
    """The expensive part: a model's latency, and now and then its error."""
    time.sleep(random.uniform(0.05, 0.3))
    if random.random() < 0.03:
        raise TimeoutError("the model timed out (simulated)")
    return {"text": f"an answer for run {run_id}", "tokens": tokens_for(run_id, "call")}


@app.task
def call(ctx: TaskContext) -> None:
    request = {"model": "simulated", "prompt": f"run {ctx.run_id}"}
    tokens = tokens_for(ctx.run_id, "call")
    ctx.once("model", request, lambda: model(ctx.run_id), tokens=tokens)  # paid once
    time.sleep(random.uniform(0.05, 0.2))  # what the step does with the answer
    ctx.advance(bill(ctx, "call"), next="complete", payload=ctx.payload)


@app.task
def complete(ctx: TaskContext) -> None:
    time.sleep(random.uniform(0.005, 0.03))
    ctx.finish(bill(ctx, "complete"), result={"tokens": bill(ctx, "complete")["tokens"]})
