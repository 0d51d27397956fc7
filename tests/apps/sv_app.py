"""Tasks for the supervisor's process-level tests (tests/supervisor/)."""

from __future__ import annotations

import os
import time
from typing import Any

from workerproc import App, TaskContext

app = App()
_ballast: list[bytes] = []


@app.task("noop")
def noop(ctx: TaskContext) -> Any:
    return {"pid": os.getpid()}


@app.task("sleep")
def sleep(ctx: TaskContext) -> Any:
    """Sleep ``payload["s"]`` seconds; the result names the worker pid and the attempt."""
    time.sleep(float((ctx.payload or {}).get("s", 1.0)))
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@app.task("hold")
def hold(ctx: TaskContext) -> Any:
    """Write a marker file (payload["marker"]) then sleep: a test knows who holds the task."""
    payload = ctx.payload or {}
    with open(payload["marker"], "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()} {ctx.attempt}\n")
    time.sleep(float(payload.get("s", 60.0)))
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@app.task("crash")
def crash(ctx: TaskContext) -> Any:
    """Kill this worker process outright (a segfault, an OOM kill)."""
    os._exit(9)


@app.task("grow")
def grow(ctx: TaskContext) -> Any:
    """Allocate ``payload["mb"]`` MB and keep it: memory-based recycling must notice."""
    _ballast.append(b"x" * int((ctx.payload or {}).get("mb", 50)) * 1024 * 1024)
    return {"pid": os.getpid()}


@app.task("chain")
def chain(ctx: TaskContext) -> Any:
    """A multi-step run: ``payload["left"]`` more steps."""
    left = int((ctx.payload or {}).get("left", 0))
    state = dict(ctx.state or {})
    state["steps"] = int(state.get("steps", 0)) + 1
    if left > 0:
        ctx.advance(state, next="chain", payload={"left": left - 1})
    else:
        ctx.finish(state, result={"pid": os.getpid()})


@app.task("boot_fail")
def boot_fail(ctx: TaskContext) -> Any:
    """Exit as a worker that cannot boot would (workerproc.exitcodes.BOOT_FAILURE)."""
    os._exit(3)


@app.task("wait_file")
def wait_file(ctx: TaskContext) -> Any:
    """Hold the task until the file ``payload["release"]`` exists (at most 120 s)."""
    release = (ctx.payload or {})["release"]
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@app.task("exit0_once")
def exit0_once(ctx: TaskContext) -> Any:
    """The first attempt ends the worker with exit code 0 while it holds the lease."""
    if ctx.attempt == 1:
        os._exit(0)
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@app.task("fails")
def fails(ctx: TaskContext) -> Any:
    """A handler error: recorded on the task, logged by the worker as an event."""
    raise ValueError(f"attempt {ctx.attempt} went wrong")
