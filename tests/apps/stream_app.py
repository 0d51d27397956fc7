"""Test app for runs' streams under chaos (tests/chaos/test_streams_chaos.py): each run's one
step emits ``chunks`` chunks (``"<i>@<attempt> "``), a few milliseconds apart, so kills and
pauses land mid-stream, then notes in the ledger what this attempt emitted (``emitted``: its
chunks, in order) just before its commit, and finishes with its text. A zombie learns
``LeaseLost`` at an emit and stops there. The ledger is tests/apps/ledger_app.py's format."""

from __future__ import annotations

import time

from apps.ledger_app import note
from workerproc import App, TaskContext

app = App()
PAUSE = 0.002  # seconds between two chunks


@app.task(max_attempts=30)
def answer(ctx: TaskContext) -> None:
    payload = ctx.payload
    path, chunks = str(payload["ledger"]), int(payload["chunks"])
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id}
    note(path, "start", ids)
    emitted = [f"{i}@{ctx.attempt} " for i in range(chunks)]
    for text in emitted:
        ctx.emit(text)
        time.sleep(PAUSE)
    note(path, "emitted", {**ids, "chunks": emitted})
    ctx.finish({"chunks": chunks}, result=len(ctx.emitted_text()))
