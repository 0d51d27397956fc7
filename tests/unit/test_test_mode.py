"""The test mode: ``app.run_inline`` runs a handler, or a whole run through all its steps, in
this process against a temporary store, with the worker's own claim, context and commits, the
app's hooks and per-task options; delays and backoffs pass at once. ``leasekeeper_store`` is the
pytest fixture the package ships (its plugin is loaded by pytest from the entry point)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest

from workerproc import App, RetryAfter, TaskContext
from workerproc.store import Store, open_store
from workerproc.testing import temporary_store

app = App()
calls: list[str] = []


@app.on_worker_start
def started() -> None:
    calls.append("start")


@app.on_worker_stop
async def stopped() -> None:
    calls.append("stop")


@app.task
def prepare(ctx: TaskContext) -> None:
    ctx.advance({"doc": ctx.payload["doc"]}, next=summarise, delay=3600)  # an hour later


@app.task(queue="llm")
async def summarise(ctx: TaskContext) -> None:
    await asyncio.sleep(0)
    ctx.finish({**ctx.state, "tokens": 3}, result=f"a summary of {ctx.state['doc']}")


@app.task(max_attempts=2, retry_backoff=600)
def flaky(ctx: TaskContext) -> None:
    raise ValueError(f"attempt {ctx.attempt} failed")


@app.task
def typo(ctx: TaskContext) -> None:
    ctx.advance({}, next="sumarise")


def test_a_whole_run_through_its_steps_in_milliseconds() -> None:
    calls.clear()
    begun = time.monotonic()
    run = app.run_inline(prepare, {"doc": "cv.pdf"})
    assert (run.status, run.result, run.state) == (
        "succeeded", "a summary of cv.pdf", {"doc": "cv.pdf", "tokens": 3},
    )  # fmt: skip
    assert run.queue == "llm"  # the next task's declared queue
    assert time.monotonic() - begun < 30  # the hour's delay passed at once
    assert calls == ["start", "stop"]


def test_one_step_runs_one_handler() -> None:
    run = app.run_inline("prepare", {"doc": "a.pdf"}, steps=1, hooks=False)
    assert run.status == "pending" and run.state == {"doc": "a.pdf"} and run.revision == 1


def test_a_handler_error_fails_the_test_with_its_own_traceback() -> None:
    with pytest.raises(ValueError, match="attempt 1 failed"):
        app.run_inline(flaky)


def test_without_raise_errors_the_run_retries_and_fails_as_in_a_pool(
    leasekeeper_store: Store,
) -> None:
    run = app.run_inline(flaky, store=leasekeeper_store, raise_errors=False)
    assert run.status == "failed" and run.failure_reason == "task_attempts_exhausted"
    (task,) = leasekeeper_store.get_tasks(run.id)
    assert task.attempts == 2 and "attempt 2 failed" in (task.last_error or "")  # its own bound


def test_a_misspelt_task_is_found_at_once() -> None:
    with pytest.raises(LookupError, match="'sumarise'"):
        app.run_inline(typo)
    with pytest.raises(ValueError, match="no task 'nope'"):
        app.run_inline("nope")


def test_the_fixture_keeps_the_store_for_the_test_to_read(leasekeeper_store: Store) -> None:
    run = app.run_inline(prepare, {"doc": "b.pdf"}, store=leasekeeper_store)
    names = [t.name for t in leasekeeper_store.get_tasks(run.id)]
    assert names == ["prepare", "summarise"] and run.status == "succeeded"


def test_it_works_inside_a_running_event_loop() -> None:
    async def an_async_test() -> str:
        return app.run_inline(prepare, {"doc": "c.pdf"}, hooks=False).status

    assert asyncio.run(an_async_test()) == "succeeded"


def test_it_leaves_no_file_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app.run_inline(prepare, {"doc": "d.pdf"}, hooks=False)
    assert list(tmp_path.iterdir()) == []


# -- as in a pool: signals, RetryAfter, wait timeouts and limits on the virtual clock ----------
waits = App()
waits.limit("api", rate="1/m", burst=1)


@waits.task
def ask(ctx: TaskContext) -> None:
    ctx.wait_for("approval", "decided", timeout=3600, state={"asked": True})


@waits.task
def ask_for_ever(ctx: TaskContext) -> None:
    ctx.wait_for("approval", "decided")


@waits.task
def decided(ctx: TaskContext) -> None:
    signal = ctx.signal
    ctx.finish({**ctx.state, "approval": None if signal is None else signal.payload})


@waits.task
def busy(ctx: TaskContext) -> None:
    if ctx.attempt < 3:
        raise RetryAfter(600)  # the provider said "not now"
    ctx.finish({"attempt": ctx.attempt})


@waits.task(limits=["api"])
def call_api(ctx: TaskContext) -> None:
    calls = ctx.state.get("calls", 0) + 1
    if calls < 3:
        ctx.advance({"calls": calls}, next="call_api")
    else:
        ctx.finish({"calls": calls})


def test_a_wait_resumes_with_the_signal_the_test_sends() -> None:
    began = time.monotonic()
    run = waits.run_inline(ask, signals={"approval": {"ok": True}}, clock="virtual")
    assert (run.status, run.state) == ("succeeded", {"asked": True, "approval": {"ok": True}})
    assert time.monotonic() - began < 30  # (no real wait: bounded for a loaded machine)


def test_a_wait_without_its_signal_times_out_on_the_virtual_clock() -> None:
    with temporary_store() as store:
        run = waits.run_inline(ask, store=store, clock="virtual")
        assert (run.status, run.state) == ("succeeded", {"asked": True, "approval": None})
        assert store.now() - run.created_at >= 3600  # the hour passed, on the test's clock


def test_a_wait_for_ever_without_its_signal_is_an_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match=r"waits for 'approval' with no timeout.*signals="):
        waits.run_inline(ask_for_ever)


def test_retry_after_is_no_error_and_its_delay_passes_at_once() -> None:
    with temporary_store() as store:
        run = waits.run_inline(busy, store=store)  # raise_errors: RetryAfter is not one
        assert (run.status, run.state) == ("succeeded", {"attempt": 3})
        assert store.now() - run.created_at >= 2 * 600 * 0.5  # two delays (with their jitter)


def test_the_apps_limits_gate_the_run_as_in_a_pool() -> None:
    with temporary_store() as store:
        run = waits.run_inline(call_api, store=store)
        assert (run.status, run.state) == ("succeeded", {"calls": 3})
        assert store.now() - run.created_at >= 120  # one start a minute: three starts
        (api,) = store.limits()
        assert api.declared_by == "inline"


def test_a_virtual_clock_needs_a_store_with_a_test_clock(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "own.db")) as own, pytest.raises(ValueError, match="virtual"):
        waits.run_inline(ask, store=own, clock="virtual")
    with pytest.raises(ValueError, match="clock must be"):
        waits.run_inline(ask, clock="fast")  # type: ignore[arg-type]
