"""A worker should not pay for what it does not use: each handler reports which of the modules
below its process has loaded (asyncio and filelock; ``heavy`` the whole list, for the pool's
lazy imports: ``tests/worker/test_worker_memory.py``)."""

from __future__ import annotations

import sys

from workerproc import App, TaskContext

app = App()

# What a pool of plain handlers without --chaos, --pidfile, schedules, paid calls, webhook
# deliveries or exported traces never needs (each costs its process from 0.4 to 9 MB of RSS),
# and the supervisor, which a worker never imports (forked from it, it has it already).
HEAVY = ("asyncio", "filelock", "statistics", "cronsim", "zoneinfo", "hashlib", "hmac",
         "importlib.metadata", "importlib.resources", "zipfile", "tempfile",
         "concurrent.futures.thread", "supervisor.chaos", "email", "ssl")  # fmt: skip


def _loaded() -> dict[str, bool]:
    return {name: name in sys.modules for name in ("asyncio", "filelock")}


@app.task
def modules(ctx: TaskContext) -> dict[str, bool]:
    return _loaded()


@app.task
async def modules_async(ctx: TaskContext) -> dict[str, bool]:
    return _loaded()


@app.task
def heavy(ctx: TaskContext) -> list[str]:
    """The modules of ``HEAVY`` (and of ``supervisor``) this process has loaded."""
    return sorted(name for name in sys.modules
                  if name.startswith(HEAVY) or name.split(".")[0] == "supervisor")  # fmt: skip
