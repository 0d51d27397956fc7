"""An app with worker lifecycle hooks (tests/worker/test_worker_hooks.py): each worker writes a line
to ``$HOOKS_LOG`` when its hooks run; with ``HOOKS_FAIL=1`` the start hook raises."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from workerproc import App, TaskContext

app = App()
clients: dict[str, Any] = {}  # what the start hooks make, per worker process


def note(what: str) -> None:
    with open(os.environ["HOOKS_LOG"], "a", encoding="utf-8") as fh:
        fh.write(f"{what} {os.getpid()}\n")


@app.on_worker_start
def connect() -> None:
    if os.environ.get("HOOKS_FAIL") == "1":
        raise ConnectionError("the model API is down")
    clients["http"] = f"client of {os.getpid()}"
    note("start")


@app.on_worker_start
async def open_async() -> None:
    clients["loop"] = asyncio.get_running_loop()
    note("async-start")


@app.on_worker_stop
def disconnect() -> None:
    note("stop")


@app.task
def uses_client(ctx: TaskContext) -> Any:
    return {"client": clients["http"], "pid": os.getpid()}


@app.task
async def uses_loop(ctx: TaskContext) -> Any:
    return {"same_loop": asyncio.get_running_loop() is clients["loop"], "pid": os.getpid()}
