"""A release of an app, before: ``summarize`` finishes in one step (the rolling-deploy test's
old pool, tests/process/test_rolling_deploy.py)."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()


@app.task
def summarize(ctx: TaskContext) -> None:
    ctx.finish({**(ctx.state or {}), "by": "v1"})
