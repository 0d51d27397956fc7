"""Test app for schedules (tests/process/test_schedules_process.py): a one-second schedule
whose task returns at once. ``catch_up="all"``: a tick that came due while a firer stalled (a loaded
machine) still runs, so the test judges "one run per tick" without a timing margin."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()


@app.schedule("* * * * * *", catch_up="all", payload={"from": "schedule"})
@app.task
def tick(ctx: TaskContext) -> dict[str, object]:
    return {"payload": ctx.payload}
