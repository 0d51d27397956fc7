"""Test app for the dashboard's browser test: chaos mode's three-step runs, and a run that
fails every attempt of its first delivery and succeeds once retried."""

from __future__ import annotations

from workerproc import App, TaskContext

from .chaos_app import step

app = App()
app.task(step)


@app.task
def flaky(ctx: TaskContext) -> None:
    if ctx.attempt <= int(ctx.payload["fail_attempts"]):
        raise RuntimeError(f"flaky: attempt {ctx.attempt} fails on purpose")
    ctx.finish({"succeeded_at_attempt": ctx.attempt})
