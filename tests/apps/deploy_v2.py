"""The next release of ``deploy_v1``'s app: the task is renamed ``summarise`` (its old name an
alias, so runs the old release started still run) and goes on to a new step, ``publish``,
which the old release has no handler for."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()


@app.task("summarise", aliases=["summarize"])
def summarise(ctx: TaskContext) -> None:
    ctx.advance({**(ctx.state or {}), "summarised_by": ctx.task}, "publish")


@app.task
def publish(ctx: TaskContext) -> None:
    ctx.finish({**(ctx.state or {}), "by": "v2"})
