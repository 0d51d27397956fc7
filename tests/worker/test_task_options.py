"""Per-task options (B11): ``@app.task(max_attempts=, retry_backoff=, timeout=, queue=, priority=)``
override the pool's defaults for that task, kept in the database by task name so every worker on
every host applies the same ones: the claim bounds attempts by the task's own number (R6), the
worker backs off and times out by it, and runs start (and move) to the task's queue."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sv_harness import env_with_tests
from worker_fakes import worker

from supervisor import exitcodes
from supervisor.commands.cli import cli
from workerproc import App, TaskContext
from workerproc.config import WorkerConfig
from workerproc.execution import failure
from workerproc.store import Lease, Store, TaskOptions, open_store
from workerproc.store.types import NO_OPTIONS

TESTS = Path(__file__).resolve().parents[1]  # tests/: the apps and the support scripts


# -- the store: the options live in the database, the claim reads them ------------------------
def test_the_claim_bounds_a_task_by_its_own_max_attempts(s: Store) -> None:
    s.register_tasks({"fragile": TaskOptions(max_attempts=1), "sturdy": TaskOptions()})
    fragile, sturdy = s.start_run("fragile"), s.start_run("sturdy")
    leases = s.claim("w1", 60, max_attempts=3, limit=2)
    assert {lease.task: lease.options.max_attempts for lease in leases} == {
        "fragile": 1, "sturdy": None,
    }  # fmt: skip
    s.release_owner("w1")  # the worker died in both handlers
    again = s.claim("w2", 60, max_attempts=3, limit=2)
    assert [lease.task for lease in again] == ["sturdy"]  # fragile's 2nd attempt never runs
    run = s.get_run(fragile)
    assert run is not None and run.failure_reason == "task_attempts_exhausted"
    assert "1 attempts of task 'fragile'" in (run.last_error or "")
    still = s.get_run(sturdy)
    assert still is not None and still.status == "running"


def test_the_database_decides_not_the_claimer(s: Store) -> None:
    """A worker whose own pool allows 5 attempts still stops at the task's stored 2: what one
    host declared, every host applies."""
    s.register_tasks({"step": TaskOptions(max_attempts=2, retry_backoff=7.0, timeout=9.0)})
    run_id = s.start_run("step")
    for owner in ("w1", "w2"):
        lease = s.claim(owner, 60, max_attempts=5)
        assert lease is not None and lease.options == TaskOptions(2, 7.0, 9.0)
        s.release_owner(owner)
    assert s.claim("w3", 60, max_attempts=5) is None
    run = s.get_run(run_id)
    assert run is not None and run.status == "failed"


def test_registering_writes_only_what_changed_and_forgets_what_went(s: Store) -> None:
    declared = {"a": TaskOptions(max_attempts=4, queue="llm"), "b": TaskOptions(timeout=3.0)}
    assert s.register_tasks(declared) == 2
    assert s.register_tasks(declared) == 0  # a pool of identical workers writes once
    assert s.task_options() == declared
    s.register_tasks({"c": TaskOptions(priority=5)})  # another app's task: a and b stay
    assert set(s.task_options()) == {"a", "b", "c"}
    assert s.register_tasks({"a": TaskOptions(), "b": TaskOptions(timeout=4.0)}) == 2
    assert s.task_options() == {"b": TaskOptions(timeout=4.0), "c": TaskOptions(priority=5)}


def test_a_tasks_options_refuse_assignment_at_run_time(s: Store) -> None:
    """One ``TaskOptions`` is shared by every lease of a task (and ``NO_OPTIONS`` by every task
    that declared none) and by the app's task, and a handler reaches it (``ctx.lease.options``):
    an assignment no type checker saw raises, never changes every later lease's options (nor
    writes an unchecked value to the database)."""
    s.register_tasks({"t": TaskOptions(timeout=9.0)})
    s.start_run("t")
    s.start_run("u")
    declared, plain = s.claim("w", 60, limit=2)
    app = App()
    task = app.task("t", timeout=9.0)(lambda ctx: None)
    for options in (declared.options, plain.options, NO_OPTIONS, task.options):
        with pytest.raises(dataclasses.FrozenInstanceError):
            options.timeout = 0.0  # type: ignore[misc]
    assert declared.options == TaskOptions(timeout=9.0) and TaskOptions() == NO_OPTIONS
    assert app.task_options() == {"t": TaskOptions(timeout=9.0)}


# -- the decorator ---------------------------------------------------------------------------
def test_options_are_checked_at_import_with_the_pool_options_ranges() -> None:
    app = App()
    bad: list[tuple[dict[str, Any], str]] = [
        ({"max_attempts": 0}, "max_attempts must be >= 1 and <= 1000"),
        ({"max_attempts": 2.5}, "max_attempts must be a whole number"),
        ({"retry_backoff": -1}, "retry_backoff must be >= 0"),
        ({"timeout": 0.01}, "timeout must be >= 0.1"),
        ({"timeout": True}, "timeout must be a number of seconds"),
        ({"queue": ""}, "queue"),
        ({"priority": 5000}, "priority"),
    ]
    for options, words in bad:
        with pytest.raises(ValueError, match=r"@app.task\('t'\)") as caught:
            app.task("t", **options)(lambda ctx: None)
        assert words in str(caught.value), (options, caught.value)
    assert "t" not in app.tasks


def test_a_task_object_is_its_function_and_knows_its_options(tmp_path: Path) -> None:
    app = App()

    @app.task
    def plain(ctx: TaskContext) -> str:
        """Its docstring."""
        return "plain"

    @app.task("named", max_attempts=5, queue="llm", priority=3)
    def other(ctx: TaskContext) -> str:
        return "other"

    assert plain.name == "plain" and other.name == "named"
    assert plain(None) == "plain" and other(None) == "other"  # type: ignore[arg-type]
    assert plain.__doc__ == "Its docstring." and plain.__name__ == "plain"
    assert other.options == TaskOptions(max_attempts=5, queue="llm", priority=3)
    assert app.handlers["named"] is other.fn and app.tasks["named"] is other
    again = App().task(other)  # a task object registers again, elsewhere: the same function
    assert again.fn is other.fn and again.name == "named"
    with pytest.raises(ValueError, match="registered twice"):
        app.task("named")(lambda ctx: None)


def test_start_and_start_many_use_the_declared_queue_and_priority(tmp_path: Path) -> None:
    app = App()

    @app.task(queue="llm", priority=7)
    def call(ctx: TaskContext) -> None: ...

    with open_store(str(tmp_path / "lk.db")) as store:
        one = call.start({"doc": 1}, key="k1", store=store)
        assert call.start({"doc": 1}, key="k1", store=store) == one  # idempotent, as start_run
        run = store.get_run(one)
        assert run is not None and (run.task, run.queue, run.priority) == ("call", "llm", 7)
        assert store.get_tasks(one)[0].payload == {"doc": 1}
        elsewhere = store.get_run(call.start(queue="bulk", priority=0, delay=60, store=store))
        assert elsewhere is not None and (elsewhere.queue, elsewhere.priority) == ("bulk", 0)
        ids = call.start_many([{"n": i} for i in range(3)], keys=["a", None, "c"], store=store)
        assert len(ids) == 3 and [store.get_tasks(i)[0].payload for i in ids] == [
            {"n": 0}, {"n": 1}, {"n": 2},
        ]  # fmt: skip
        assert {store.get_run(i).queue for i in ids} == {"llm"}  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="3 payloads but 1 keys"):
            call.start_many([1, 2, 3], keys=["x"], store=store)


def test_advance_to_a_task_moves_the_run_to_its_queue(tmp_path: Path) -> None:
    app = App()

    @app.task
    def first(ctx: TaskContext) -> None:
        ctx.advance({}, next=second)  # the object itself: a typo is a NameError at import

    @app.task(queue="gpu")
    def second(ctx: TaskContext) -> None:
        ctx.finish({"queue": "seen"})

    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        run_id = first.start(store=store)
    w, _ = worker(db, app, queues=("default", "gpu"))
    assert w.run() == 0
    with open_store(db) as store:
        run = store.get_run(run_id)
        assert run is not None and (run.status, run.queue) == ("succeeded", "gpu")
        assert [t.name for t in store.get_tasks(run_id)] == ["first", "second"]


def test_no_task_of_an_app_declares_or_moves_to_leasekeepers_own_queue(tmp_path: Path) -> None:
    """The webhooks' lane claims ``leasekeeper.webhooks`` with slots of its own: a task of an app
    may neither be declared there nor advance a run there (the handler's call raises, and the
    run fails with that error, as for any bad value)."""
    app = App()
    with pytest.raises(ValueError, match="leasekeeper's own"):
        app.task(queue="leasekeeper.webhooks")(lambda ctx: None)

    @app.task(max_attempts=1)
    def sneak(ctx: TaskContext) -> None:
        ctx.advance({}, next="sneak", queue="leasekeeper.webhooks")

    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        run_id = sneak.start(store=store)
    w, _ = worker(db, app)
    assert w.run() == 0
    with open_store(db) as store:
        run = store.get_run(run_id)
        assert run is not None and (run.status, run.queue) == ("failed", "default")
        assert "leasekeeper's own" in (run.last_error or "")
        assert store.list_runs(queue="leasekeeper.webhooks", system=True) == []


# -- the worker applies them ---------------------------------------------------------------------
def lease(**options: Any) -> Lease:
    return Lease(1, 1, "t", None, attempt=1, owner="w", expires_at=0.0, claimed_at=0.0,
                 tries=1, options=TaskOptions(**options))  # fmt: skip


def test_a_handler_error_backs_off_and_fails_by_the_tasks_own_numbers() -> None:
    pool = WorkerConfig(db="x", app="m:a", max_attempts=3, retry_backoff=1.0)
    assert failure(lease(max_attempts=1), RuntimeError("boom"), pool).kind == "fail"
    assert failure(lease(), RuntimeError("boom"), pool).kind == "release"
    slow = failure(lease(retry_backoff=600.0), RuntimeError("boom"), pool)
    assert slow.kind == "release" and 450 <= slow.delay <= 750  # ±25 %, above the 300 s cap


def test_a_task_times_out_by_its_own_timeout(tmp_path: Path) -> None:
    app = App()

    @app.task(timeout=0.3, max_attempts=1)
    async def hang(ctx: TaskContext) -> None:
        await asyncio.sleep(60)

    @app.task
    async def slow_but_allowed(ctx: TaskContext) -> None:
        await asyncio.sleep(0.6)  # longer than hang's timeout: the pool has none

    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        hung = hang.start(store=store)
        fine = slow_but_allowed.start(store=store)
    w, _ = worker(db, app, concurrency=2)
    assert w.run() == 0
    with open_store(db) as store:
        run = store.get_run(hung)
        assert run is not None and run.status == "failed"
        assert "TaskTimeout: handler ran longer than 0.3 s" in (run.last_error or "")
        ok = store.get_run(fine)
        assert ok is not None and ok.status == "succeeded"
        assert store.task_options() == {"hang": TaskOptions(max_attempts=1, timeout=0.3)}


# -- supervisor enqueue --app ----------------------------------------------------------------
def enqueue(*args: str) -> Any:
    return CliRunner().invoke(cli, ["enqueue", *args], env=env_with_tests())


def test_enqueue_with_app_refuses_a_name_the_app_lacks(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    result = enqueue("nosuch", "--db", db, "--app", "apps.options_app:app")
    assert result.exit_code == exitcodes.USAGE, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "apps.options_app:app has no task 'nosuch'" in line and "call" in line
    assert not Path(db).exists()  # refused before anything was created
    result = enqueue("x", "--db", db, "--app", "no_such_module:app")
    assert result.exit_code == exitcodes.APP_LOAD and len(result.stderr.splitlines()) == 1


def test_enqueue_with_app_starts_in_the_declared_queue(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    result = enqueue("call", "--db", db, "--app", "apps.options_app:app", "--payload", "{}")
    assert result.exit_code == 0, result.output
    override = enqueue("call", "--db", db, "--app", "apps.options_app:app", "--queue", "bulk")
    plain = enqueue("call", "--db", db)  # without --app: the name is not checked, nor declared
    with open_store(db) as store:
        runs = {r.id: (r.queue, r.priority) for r in store.list_runs()}
    assert runs == {
        int(result.stdout): ("llm", 9), int(override.stdout): ("bulk", 9),
        int(plain.stdout): ("default", 0),
    }  # fmt: skip


def test_an_alias_serves_the_old_name_s_runs_with_the_task_s_handler_and_options() -> None:
    app = App()

    @app.task("summarise", aliases=["summarize", "summary_v0"], max_attempts=5)
    def summarise(ctx: TaskContext) -> str:
        return "ok"

    assert summarise.name == "summarise"
    for name in ("summarise", "summarize", "summary_v0"):
        assert app.handlers[name] is summarise.fn and app.tasks[name] is summarise
    assert app.task_options() == {name: TaskOptions(max_attempts=5)
                                  for name in ("summarise", "summarize", "summary_v0")}  # fmt: skip


@pytest.mark.parametrize(
    ("aliases", "match"),
    [("summarize", "a list of names"), (["taken"], "registered twice"),
     (["leasekeeper.x"], "leasekeeper's own"), (["bad\x00"], "control characters")],
)  # fmt: skip
def test_a_bad_alias_is_refused_at_import(aliases: object, match: str) -> None:
    app = App()

    @app.task
    def taken(ctx: TaskContext) -> None: ...

    with pytest.raises(ValueError, match=match):
        app.task("new", aliases=aliases)(lambda ctx: None)  # type: ignore[arg-type]
