"""A worker of plain handlers should not pay for asyncio or filelock: each handler reports which
of the two its process has loaded."""

from __future__ import annotations

import sys

from workerproc import App, TaskContext

app = App()


def _loaded() -> dict[str, bool]:
    return {name: name in sys.modules for name in ("asyncio", "filelock")}


@app.task
def modules(ctx: TaskContext) -> dict[str, bool]:
    return _loaded()


@app.task
async def modules_async(ctx: TaskContext) -> dict[str, bool]:
    return _loaded()
