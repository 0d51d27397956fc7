"""Worker lifecycle hooks: ``@app.on_worker_start`` / ``@app.on_worker_stop``, plain or async,
run in each worker process after the fork, the async ones on the loop that runs the async
handlers; a start hook that raises stops the worker before it claims anything."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from sv_harness import Supervisor
from worker_fakes import worker

from workerproc import App, TaskContext, exitcodes
from workerproc.store import open_store


def test_hooks_run_around_the_tasks_in_order_on_the_handlers_loop(db_path: str) -> None:
    app = App()
    seen: list[Any] = []

    @app.on_worker_start
    def first() -> None:
        seen.append(("start", "first", threading.current_thread().name))

    @app.on_worker_start
    async def second() -> None:
        seen.append(("start", "second", threading.current_thread().name))
        seen.append(asyncio.get_running_loop())

    @app.on_worker_stop
    def closes_first() -> None:
        seen.append(("stop", "first"))

    @app.on_worker_stop
    async def closes_second() -> None:
        seen.append(("stop", "second", threading.current_thread().name))

    @app.task
    async def step(ctx: TaskContext) -> None:
        seen.append(("task", asyncio.get_running_loop() is seen[2]))

    with open_store(db_path) as s:
        run_id = step.start(store=s)
    w, _ = worker(db_path, app, concurrency=2)
    assert w.run() == exitcodes.OK
    assert seen[0] == ("start", "first", "MainThread")
    assert seen[1] == ("start", "second", "slots-async")  # the async handlers' loop thread
    assert seen[3] == ("task", True)
    assert seen[4:] == [("stop", "second", "slots-async"), ("stop", "first")]
    with open_store(db_path) as s:
        assert s.get_run(run_id).status == "succeeded"  # type: ignore[union-attr]


def test_a_start_hook_that_raises_stops_the_worker_before_any_claim(db_path: str) -> None:
    app = App()
    stopped: list[str] = []

    @app.on_worker_start
    def broken() -> None:
        raise ConnectionError("no model API")

    app.on_worker_stop(lambda: stopped.append("stop"))
    app.task("step")(lambda ctx: None)
    with open_store(db_path) as s:
        run_id = s.start_run("step")
    w, spy = worker(db_path, app)
    assert w.run() == exitcodes.BOOT_FAILURE
    assert spy.exchanges == [] and stopped == []  # nothing claimed, nothing to stop
    with open_store(db_path) as s:
        assert s.get_run(run_id).status == "pending"  # type: ignore[union-attr]


def test_a_stop_hook_that_raises_does_not_keep_the_others_from_running(db_path: str) -> None:
    app = App()
    ran: list[str] = []
    app.on_worker_stop(lambda: ran.append("last"))

    @app.on_worker_stop
    def broken() -> None:
        raise RuntimeError("close failed")

    app.on_worker_stop(lambda: ran.append("first"))
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    assert ran == ["first", "last"]


@pytest.mark.slow
def test_each_forked_worker_runs_its_hooks_and_its_handlers_use_what_they_made(
    sv: Supervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hooks.log"
    monkeypatch.setenv("HOOKS_LOG", str(log))
    ids = [sv.enqueue(name) for name in ("uses_client", "uses_loop") * 3]
    sv.start("--drain", "--concurrency", "2", n=2, app="apps.hooks_app:app")
    assert sv.wait_exit(timeout=90) == 0, sv.text()
    lines = [line.split() for line in log.read_text().splitlines()]
    pids = {int(pid) for _, pid in lines}
    assert sv.pid not in pids and len(pids) >= 1  # after the fork, never in the supervisor
    for pid in pids:  # every worker: its start hooks, in order, then its stop hook
        assert [what for what, p in lines if int(p) == pid] == ["start", "async-start", "stop"]
    with open_store(sv.db) as store:
        results = [store.get_run(i).result for i in ids]  # type: ignore[union-attr]
    assert all(r["client"] == f"client of {r['pid']}" for r in results if "client" in r)
    assert all(r["same_loop"] for r in results if "same_loop" in r)


@pytest.mark.slow
def test_a_failing_start_hook_stops_the_pool(
    sv: Supervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOKS_LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setenv("HOOKS_FAIL", "1")
    sv.enqueue("uses_client")
    sv.start(n=1, app="apps.hooks_app:app")
    assert sv.wait_exit(timeout=60) == 4  # a worker could not boot: the supervisor stopped
    (failed,) = sv.events("worker_start_hook_failed")
    assert "the model API is down" in failed["msg"] and failed["error"] == "ConnectionError"
    assert os.path.exists(sv.db)
    with open_store(sv.db) as store:
        assert store.stats().runs == {"pending": 1}
