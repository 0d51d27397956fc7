"""An app whose task declares options (tests/worker/test_task_options.py)."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()


@app.task(queue="llm", priority=9, max_attempts=5)
def call(ctx: TaskContext) -> None:
    ctx.finish(ctx.state)


@app.task
def plain(ctx: TaskContext) -> None:
    ctx.finish(ctx.state)
