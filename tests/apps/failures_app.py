"""Test app of the failure reports (tests/supervisor/test_failures.py): runs that fail in the
ways a user meets first, each to be said where the user looks."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()


@app.task
def draft(ctx: TaskContext) -> None:
    ctx.advance({"draft": True}, next="sumarise")  # a typo: no task has that name


@app.task
def summarise(ctx: TaskContext) -> None:
    ctx.finish({"summary": True})


@app.task
def unstorable(ctx: TaskContext) -> None:
    ctx.advance({"seen": {1, 2}}, next="summarise")  # a set is not JSON: no retry can fix it


@app.task(limits=[])  # no limits, as None
def fine(ctx: TaskContext) -> None:
    return None
