"""A task that holds its worker until the test lets it go: ``hold`` writes ``running`` into
HOLD_DIR, then waits (at most 120 s) for ``go`` there. With ``noop``s around it, a drain is
live for as long as the test needs (tests/process/test_wal_scribble.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workerproc import App, TaskContext

app = App()


@app.task
def hold(ctx: TaskContext) -> None:
    here = Path(os.environ["HOLD_DIR"])
    (here / "running").write_text("1", encoding="utf-8")
    deadline = time.monotonic() + 120
    while not (here / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    ctx.finish({}, result="held")


@app.task
def noop(ctx: TaskContext) -> str:
    return "ok"
