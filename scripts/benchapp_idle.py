"""The idle benchmark's apps (``scripts/bench idle``): plain handlers only, so a worker's memory
is the pool's own and not an import of the app's (asyncio costs about 9 MB)."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()
# The same, with a schedule whose next tick is hours away: its firer thread sleeps until then
# (the idle CPU is measured with it; the memory without: cronsim is the schedule's import).
scheduled = App()


@app.task("noop")
@scheduled.task("noop")
def noop(ctx: TaskContext) -> None:
    return None


@scheduled.schedule("0 3 * * *")
@scheduled.task("nightly")
def nightly(ctx: TaskContext) -> None:
    return None
