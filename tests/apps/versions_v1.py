"""A release whose task ``translate`` reads its state at version 1 (the default): the
rolling-deploy test's old pool for task versions (tests/process/test_rolling_deploy.py)."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()


@app.task
def translate(ctx: TaskContext) -> None:
    ctx.finish({**(ctx.state or {}), "by": "v1"})
