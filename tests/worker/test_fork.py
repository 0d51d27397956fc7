"""Re-run a failed run from a step (B24), end to end on every backend: a worker runs a three
step run that fails at its last step; once the cause is fixed, a fork from step 2 runs steps 2
and 3 only (step 1 is neither run nor paid again), pays anew for its own steps' calls and
succeeds with the state the steps made, while the failed run stays failed, as it was."""

from __future__ import annotations

from typing import Any

from worker_fakes import worker

from workerproc import App, TaskContext
from workerproc.store import open_store

app = App()
ran: list[tuple[int, str]] = []  # (run, step) of every execution, in order
paid: list[str] = []  # every paid call that was really made
broken = {"c": True}  # step c fails until the test fixes it


def bill(step: str) -> dict[str, Any]:
    paid.append(step)
    return {"answer": f"for {step}"}


@app.task()
def a(ctx: TaskContext) -> None:
    ran.append((ctx.run_id, "a"))
    ctx.once("llm", {"step": "a"}, lambda: bill("a"))
    ctx.advance({**ctx.state, "a": 1}, next="b")


@app.task()
def b(ctx: TaskContext) -> None:
    ran.append((ctx.run_id, "b"))
    ctx.once("llm", {"step": "b"}, lambda: bill("b"))
    ctx.advance({**ctx.state, "b": ctx.state["a"] + 1}, next="c")


@app.task(max_attempts=1)
def c(ctx: TaskContext) -> None:
    ran.append((ctx.run_id, "c"))
    if broken["c"]:
        raise RuntimeError("the model is down")
    ctx.finish({**ctx.state, "c": ctx.state["b"] + 1})


def test_a_fork_of_a_failed_run_runs_only_the_steps_from_there_and_succeeds(db: str) -> None:
    ran.clear(), paid.clear()
    broken["c"] = True
    with open_store(db) as store:
        source = a.start({}, state={"seed": 7}, store=store)
    w, _ = worker(db, app)
    assert w.run() == 0
    with open_store(db) as store:
        failed = store.get_run(source)
        assert failed is not None and failed.status == "failed"
        before = (failed, store.get_tasks(source), store.paid_calls(source))
    assert [step for _, step in ran] == ["a", "b", "c"] and paid == ["a", "b"]

    broken["c"] = False  # the cause is fixed: run it again from step 2
    ran.clear(), paid.clear()
    with open_store(db) as store:
        new = store.fork(source, from_step=2)
    w, _ = worker(db, app)
    assert w.run() == 0
    assert ran == [(new, "b"), (new, "c")]  # step 1 did not run again
    assert paid == ["b"]  # step 1's call was not paid again; step 2's is new work
    with open_store(db) as store:
        run = store.get_run(new)
        assert run is not None and run.status == "succeeded"
        assert run.state == {"seed": 7, "a": 1, "b": 2, "c": 3}
        assert [t.name for t in store.get_tasks(new)] == ["b", "c"]
        after = store.get_run(source)
        assert (after, store.get_tasks(source), store.paid_calls(source)) == before
