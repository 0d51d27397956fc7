"""The benchmarks' no-op handler behind a limit that never binds (scripts/bench limits):
every claim goes through the gated path, and no run ever waits for room."""

from __future__ import annotations

from workerproc import App, TaskContext

app = App()
app.limit("roomy", rate="1000000/s", burst=1_000_000, concurrency=1_000_000)


@app.task(limits=["roomy"])
def noop(ctx: TaskContext) -> None:
    return None
