"""The handler scripts/bench once measures: one paid call (``ctx.once``) whose fn returns at
once, timed from fn's last line to ``once``'s return, split in three by a wrapper around the
keep (``workerproc.once.keep_answer``, installed when this module is imported in the worker):
fn's return -> the keep begins (the checks, the hand-off to the thread that keeps), the keep
itself (the database's transaction, its retries), the keep's end -> ``once`` returns (the
hand-back). On SQLite, the keep's wait for the write lock (``BEGIN IMMEDIATE`` and its
retries) and its COMMIT are timed apart. The run's result carries the six figures in
microseconds."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from workerproc import App, TaskContext
from workerproc import once as paid
from workerproc.store.sqlite.dialect import SQLiteDialect, SQLiteTx

app = App()
_keeps: dict[int, tuple[float, ...]] = {}  # the run's keep, by run id (any thread)
_keep = paid.keep_answer
_retrying = SQLiteDialect._retrying
_flush = SQLiteTx.flush
_local = threading.local()  # the thread that keeps: its write lock wait


def _timed_keep(store: Any, lease: Any, *args: Any, **kwargs: Any) -> Any:
    _local.waited = 0.0
    _local.flushed = 0.0
    _local.keeping = True
    began = time.perf_counter()
    try:
        return _keep(store, lease, *args, **kwargs)
    finally:
        _local.keeping = False
        ended = time.perf_counter()
        committed = ended - _local.flushed if _local.flushed else 0.0
        _keeps[lease.run_id] = (began, ended, _local.waited, committed)


def _timed_retrying(
    self: SQLiteDialect, fn: Any, urgent: bool = False, started: float | None = None
) -> Any:
    if not getattr(_local, "keeping", False):
        return _retrying(self, fn, urgent, started)
    began = time.perf_counter()
    try:
        return _retrying(self, fn, urgent, started)
    finally:
        _local.waited += time.perf_counter() - began


def _timed_flush(self: SQLiteTx) -> None:
    _flush(self)
    if getattr(_local, "keeping", False):
        _local.flushed = time.perf_counter()  # what follows is the COMMIT


paid.keep_answer = _timed_keep
SQLiteDialect._retrying = _timed_retrying  # type: ignore[method-assign]
SQLiteTx.flush = _timed_flush  # type: ignore[method-assign,assignment]


@app.task
def paid_call(ctx: TaskContext) -> None:
    returned = 0.0

    def call() -> dict[str, Any]:
        nonlocal returned
        answer = {"text": f"an answer for run {ctx.run_id}", "tokens": 42}
        returned = time.perf_counter()  # fn's last line
        return answer

    ctx.once("llm", {"model": "m", "prompt": f"run {ctx.run_id}"}, call, tokens=42)
    back = time.perf_counter()
    began, ended, waited, committed = _keeps.pop(ctx.run_id, (returned, back, 0.0, 0.0))
    work = float(ctx.payload or 0)
    if work:
        time.sleep(work)  # what the step does with its answer: keeps the load low
    marks = (returned, began, ended, back)
    # fn's return -> once returns, its three parts, the write lock's wait and the COMMIT (on
    # SQLite): in microseconds
    ctx.finish(
        None,
        result=[round((back - returned) * 1e6)]
        + [round((b - a) * 1e6) for a, b in itertools.pairwise(marks)]
        + [round(waited * 1e6), round(committed * 1e6)],
    )
