"""One slot never harms another: a bad value, a handler's leftovers, something escaping the event
loop, a handler blocking it. In-process workers on each backend, one bad handler among innocent
neighbours; every innocent run must succeed (or go back without spending an attempt), the bad
one fails alone with its error recorded, and the worker never wedges or dies with a traceback."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import Drains, unstarted_heartbeat
from store_backends import Backend

from workerproc import App, TaskContext, exitcodes
from workerproc.app import LeaseLost
from workerproc.completer import Completer
from workerproc.config import WorkerConfig
from workerproc.execution import Execution
from workerproc.store import CasResult, Commit, Lease, open_store
from workerproc.worker import Worker

INNOCENTS = 5


def run_worker(db: str, app: App, cls: type[Worker] = Drains, **kw: Any) -> int:
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("lease_ttl", 30.0)
    kw.setdefault("max_attempts", 1)
    kw.setdefault("concurrency", INNOCENTS + 1)
    config = WorkerConfig(db=db, app="tests:app", **kw)
    store = open_store(db)
    try:
        w = cls(store, app, config, owner="host:1:1.00:w", open_store=lambda: open_store(db))
        return w.run()
    finally:
        store.close()


def with_innocents(backend: Backend, bad: str, *, slow: str = "slow") -> tuple[int, list[int]]:
    with backend.open() as s:
        innocent = [s.start_run(slow) for _ in range(INNOCENTS)]
        culprit = s.start_run(bad)
    return culprit, innocent


def outcome(backend: Backend, culprit: int, innocent: list[int]) -> tuple[Any, list[str]]:
    with backend.open() as s:
        run = s.get_run(culprit)
        others = []
        for run_id in innocent:
            r = s.get_run(run_id)
            assert r is not None
            others.append(r.status)
    return run, others


def app_with(bad: Callable[[TaskContext], Any]) -> App:
    app = App()

    @app.task
    def slow(ctx: TaskContext) -> None:
        time.sleep(0.3)
        ctx.finish({"ok": True})

    @app.task
    async def aslow(ctx: TaskContext) -> None:
        await asyncio.sleep(0.3)
        ctx.finish({"ok": True})

    app.task("bad")(bad)
    return app


@pytest.mark.parametrize(
    ("next_task", "words"),
    [
        ("\ud800", "lone surrogate"),
        (["x"], "must be a string"),
        ("a\x00b", "control characters"),
        ("x" * 100_000, "1 to 200 characters"),
    ],
    ids=["surrogate", "list", "nul", "huge"],
)
def test_a_bad_next_task_fails_at_the_call_and_only_its_own_run(
    backend: Backend, next_task: Any, words: str
) -> None:
    def bad(ctx: TaskContext) -> None:
        time.sleep(0.05)  # its neighbours are running
        ctx.advance({}, next=next_task)

    culprit, innocent = with_innocents(backend, "bad")
    assert run_worker(backend.url, app_with(bad)) == exitcodes.OK
    run, others = outcome(backend, culprit, innocent)
    assert others == ["succeeded"] * INNOCENTS
    assert run is not None and run.status == "failed"
    assert "InvalidCommit" in (run.last_error or "") and words in (run.last_error or "")


def test_advance_checks_every_value_at_the_call(backend: Backend) -> None:
    tried: dict[str, str] = {}

    def bad(ctx: TaskContext) -> None:
        calls = {
            "delay nan": lambda: ctx.advance({}, next="x", delay=float("nan")),
            "delay text": lambda: ctx.advance({}, next="x", delay="soon"),  # type: ignore[arg-type]
            "queue": lambda: ctx.advance({}, next="x", queue="no spaces"),
            "state": lambda: ctx.advance({"f": float("inf")}, next="x"),
            "payload": lambda: ctx.advance({}, next="x", payload=object()),
        }
        for name, call in calls.items():
            try:
                call()
            except ValueError as exc:  # InvalidCommit is an InvalidPayload, a ValueError
                tried[name] = type(exc).__name__
        ctx.finish({})

    culprit, innocent = with_innocents(backend, "bad")
    assert run_worker(backend.url, app_with(bad)) == exitcodes.OK
    assert tried == dict.fromkeys(tried, "InvalidCommit") and len(tried) == 5
    run, _ = outcome(backend, culprit, innocent)
    assert run is not None and run.status == "succeeded"  # every bad call raised, nothing stuck


class Treacherous(dict[str, Any]):
    """A return value whose methods raise: encoding it must fail only its own task."""

    def values(self) -> Any:
        raise RuntimeError("values() is broken")

    def items(self) -> Any:
        raise RuntimeError("items() is broken")

    def keys(self) -> Any:
        raise RuntimeError("keys() is broken")

    def __iter__(self) -> Any:
        raise RuntimeError("iteration is broken")


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_return_value_whose_methods_raise_fails_only_its_task(
    backend: Backend, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    def bad(ctx: TaskContext) -> Any:
        return Treacherous(a=1)

    async def abad(ctx: TaskContext) -> Any:
        return Treacherous(a=1)

    culprit, innocent = with_innocents(backend, "bad", slow="slow" if kind == "thread" else "aslow")
    app = app_with(bad if kind == "thread" else abad)
    with caplog.at_level(logging.WARNING):
        assert run_worker(backend.url, app) == exitcodes.OK
    run, others = outcome(backend, culprit, innocent)
    assert others == ["succeeded"] * INNOCENTS
    assert run is not None and run.status == "failed"
    assert "RuntimeError" in (run.last_error or "") or "InvalidCommit" in (run.last_error or "")
    assert not [r for r in caplog.records if "Exception in thread" in r.getMessage()]


def test_system_exit_in_a_child_task_fails_only_its_handler(backend: Backend) -> None:
    async def bad(ctx: TaskContext) -> None:
        async def child() -> None:
            await asyncio.sleep(0.05)
            raise SystemExit(3)

        await asyncio.gather(child(), asyncio.sleep(0.2))

    culprit, innocent = with_innocents(backend, "bad", slow="aslow")
    begun = time.monotonic()
    assert run_worker(backend.url, app_with(bad)) == exitcodes.OK
    assert time.monotonic() - begun < 20  # no wedge: the loop went on
    run, others = outcome(backend, culprit, innocent)
    assert others == ["succeeded"] * INNOCENTS
    assert run is not None and run.status == "failed" and "SystemExit" in (run.last_error or "")


def test_a_handler_blocking_the_loop_is_blamed_alone_and_its_neighbours_go_back(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """``time.sleep(4)`` in an async handler with --task-timeout 2: the blocker is released
    with TaskTimeout (its attempt spent); its ten neighbours never ran past their timeout by
    their own fault, so they go back without spending an attempt, and the worker exits 70 to
    be replaced. A second worker, allowed one attempt per task, finishes every neighbour."""

    async def bad(ctx: TaskContext) -> None:
        await asyncio.sleep(0.05)
        time.sleep(4)  # blocks every coroutine of this worker

    app = app_with(bad)

    @app.task
    async def patient(ctx: TaskContext) -> None:
        await asyncio.sleep(1.5)  # well within the timeout, had the loop been free
        ctx.finish({"ok": True})

    with backend.open() as s:
        innocent = [s.start_run("patient") for _ in range(10)]
        culprit = s.start_run("bad")
    with caplog.at_level(logging.WARNING):
        code = run_worker(backend.url, app, cls=Worker, concurrency=11, task_timeout=2.0)
    assert code == exitcodes.TASK_TIMEOUT
    with backend.open() as s:
        (task,) = s.get_tasks(culprit)
        blamed = [
            r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()
        ]
        assert any(f"task {task.id} (bad)" in m for m in blamed), blamed  # the blocker, by name
        assert all(f"task {task.id} " in m for m in blamed), blamed  # and nobody else
        assert task.lease_owner is None and "TaskTimeout" in (task.last_error or "")
        assert task.attempts - task.attempt_base == 1  # the blocker's attempt was spent
        for run_id in innocent:
            (task,) = s.get_tasks(run_id)
            assert task.attempts - task.attempt_base == 0, task  # handed back: none spent
    # one attempt each is enough for every neighbour: none was spent
    assert run_worker(backend.url, app, concurrency=11, task_timeout=2.0) == exitcodes.OK
    run, others = outcome(backend, culprit, innocent)
    assert others == ["succeeded"] * 10
    assert run is not None and run.status == "failed"  # its one attempt is spent
    assert "TaskTimeout" in (run.last_error or "")


def test_a_commit_the_database_cannot_take_fails_alone_and_the_batch_lands(
    backend: Backend,
) -> None:
    """A commit built past the handler API (no check at a call) reaches the store: the batch is
    written one by one and the unwritable commit is replaced by its task's failure."""
    with backend.open() as s:
        good, bad = s.start_run("t"), s.start_run("t")
        leases = s.claim("host:1:1.00:w", 30.0, limit=2)
        by_run = {lease.run_id: lease for lease in leases}
        commits = [
            Commit(by_run[good], "finish", new_state={"ok": 1}),
            Commit(by_run[bad], "advance", next_task="\ud800"),
        ]
        completer = Completer(s, 30.0, unstarted_heartbeat())
        out = completer.write(commits, None)
        assert out.results == (CasResult.OK, CasResult.OK)  # the bad one: its failure landed
        done, failed = s.get_run(good), s.get_tasks(bad)[0]
        assert done is not None and done.status == "succeeded"
        assert failed.lease_owner is None and "InvalidPayload" in (failed.last_error or "")


def test_a_dead_slot_thread_releases_its_tasks_and_the_worker_exits_to_be_replaced(
    db_path: str,
) -> None:
    """Our own bug in a slot thread's bookkeeping must not wedge the worker silently."""

    class Buggy(Worker):
        def _ended_on_thread(self, ex: Execution) -> Execution | None:
            raise RuntimeError("a bug in the slot's bookkeeping")

    app = App()
    app.task("t")(lambda ctx: time.sleep(0.05))
    with open_store(db_path) as s:
        runs = [s.start_run("t") for _ in range(3)]
    assert run_worker(db_path, app, cls=Buggy, concurrency=2) == exitcodes.SLOT_DIED
    with open_store(db_path) as s:
        assert s.stats().leased == 0  # nothing left to lapse: given back at once
        errors = [t.last_error for run_id in runs for t in s.get_tasks(run_id)]
        assert any("WorkerCrashed" in (e or "") for e in errors), errors


def test_an_event_loop_that_ends_releases_its_tasks_and_the_worker_exits_to_be_replaced(
    backend: Backend,
) -> None:
    """A handler that stops the event loop ends its thread (nothing raised, so nothing to catch
    and run the loop again): every async slot is gone. The worker must not wedge with its leases
    renewed: it releases them (WorkerCrashed) and exits SLOT_DIED at once."""

    async def bad(ctx: TaskContext) -> None:
        await asyncio.sleep(0.05)  # its neighbours are running
        asyncio.get_running_loop().stop()
        await asyncio.sleep(30)

    culprit, innocent = with_innocents(backend, "bad", slow="aslow")
    begun = time.monotonic()
    assert run_worker(backend.url, app_with(bad), lease_ttl=60.0) == exitcodes.SLOT_DIED
    assert time.monotonic() - begun < 20  # at once: not when the 60 s leases ran out
    with backend.open() as s:
        assert s.stats().leased == 0  # given back, not left to lapse
        errors = [t.last_error or "" for r in [culprit, *innocent] for t in s.get_tasks(r)]
        assert any("WorkerCrashed" in e for e in errors), errors


def test_ctx_reads_of_run_data_raise_once_the_lease_is_lost() -> None:
    lost = threading.Event()
    ctx = TaskContext(Lease(7, 3, "t", {"p": 1}, 2, "me", 0.0, 0.0, {"s": 1}, 4), lost)
    assert (ctx.payload, ctx.state, ctx.revision) == ({"p": 1}, {"s": 1}, 4)
    lost.set()
    for name in ("payload", "state", "revision"):
        with pytest.raises(LeaseLost):
            getattr(ctx, name)
    with pytest.raises(LeaseLost):
        ctx.finish({})
    assert (ctx.run_id, ctx.task_id, ctx.task, ctx.attempt) == (3, 7, "t", 2)  # for logs
