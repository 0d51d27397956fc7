"""Test app of the attempt tests (tests/worker/test_attempts.py): a step deaf to its lease for a
while, and short steps that keep a worker's exchanges busy.

``deaf`` appends ``start`` and ``end`` lines to the ledger named by its payload
(``apps.ledger_app.note``), so a test can tell whether two attempts of one task overlapped.
"""

from __future__ import annotations

import time

from apps.ledger_app import note
from workerproc import App, TaskContext

app = App()


@app.task
def deaf(ctx: TaskContext) -> None:
    path, seconds = str(ctx.payload["ledger"]), float(ctx.payload["seconds"])
    ids = {"task": ctx.task_id, "attempt": ctx.attempt, "run": ctx.run_id}
    note(path, "start", ids)
    try:
        time.sleep(seconds)  # never looks at its lease meanwhile
        ctx.finish({"attempt": ctx.attempt})
    finally:
        note(path, "end", ids)


@app.task
def short(ctx: TaskContext) -> None:
    time.sleep(float(ctx.payload["seconds"]))
    ctx.raise_if_lost()
