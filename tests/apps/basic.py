"""Test apps for worker and supervisor tests. Handlers report what they do through files whose
directory is given by LK_TEST_DIR, so tests can see executions from outside the process."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workerproc import App, TaskContext

app = App()


def _note(kind: str, ctx: TaskContext) -> None:
    directory = os.environ.get("LK_TEST_DIR")
    if directory:
        line = f"{kind} {ctx.run_id} {ctx.task_id} {ctx.attempt} {os.getpid()} {time.time()}\n"
        with open(Path(directory) / "events.log", "a") as f:
            f.write(line)


@app.task
def noop(ctx: TaskContext) -> str:
    return "ok"


@app.task("steps")
def steps(ctx: TaskContext) -> None:
    """Three steps; each adds its name to the state's log."""
    _note("start", ctx)
    step = ctx.payload.get("step", 0) if isinstance(ctx.payload, dict) else 0
    state = dict(ctx.state or {})
    state["log"] = [*state.get("log", []), f"step{step}:attempt{ctx.attempt}"]
    if step < 2:
        ctx.advance(state, next="steps", payload={"step": step + 1})
    else:
        ctx.finish(state)
    _note("done", ctx)


@app.task
def sleepy(ctx: TaskContext) -> dict[str, float]:
    """Sleeps payload["seconds"]; records start and end so tests can see overlaps."""
    _note("start", ctx)
    time.sleep(float(ctx.payload["seconds"]))
    _note("done", ctx)
    return {"slept": ctx.payload["seconds"]}


@app.task
def boom(ctx: TaskContext) -> None:
    _note("start", ctx)
    raise RuntimeError("boom on purpose")


@app.task
def die(ctx: TaskContext) -> None:
    _note("start", ctx)
    os._exit(1)


@app.task
def stubborn(ctx: TaskContext) -> str:
    """Tries to swallow LeaseLost with `except Exception` while sleeping past its lease."""
    _note("start", ctx)
    deadline = time.monotonic() + float(ctx.payload["seconds"])
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except Exception:  # cannot catch LeaseLost: it is a BaseException
            _note("swallowed", ctx)
    _note("done", ctx)
    return "stubborn"


@app.task
def record(ctx: TaskContext) -> None:
    """Sleeps payload["seconds"], then writes who finished it into the run's state."""
    _note("start", ctx)
    time.sleep(float(ctx.payload["seconds"]))
    _note("commit", ctx)
    ctx.finish({"attempt": ctx.attempt, "pid": os.getpid()})


@app.task
def deaf(ctx: TaskContext) -> None:
    """Swallows even BaseException (LeaseLost included): the worker must give up on it."""
    _note("start", ctx)
    deadline = time.monotonic() + float(ctx.payload["seconds"])
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except BaseException:  # the point of this handler
            _note("swallowed", ctx)
