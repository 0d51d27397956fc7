"""Batch steps (``@app.task(batch=...)``), in-process with a real SQLite store: one call for many
runs' tasks, each item committed on its own; items fail alone; ``batch.once`` keeps each item's
answer, reused by any later attempt of that item whatever its neighbours."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from worker_fakes import worker

from workerproc import App, Batch, TaskContext, exitcodes
from workerproc.alarms import Alarms
from workerproc.execution import Execution, Mode
from workerproc.holdings import Holdings
from workerproc.store import ClaimRequest, open_store


def finished(db: str, ids: list[int]) -> dict[int, Any]:
    with open_store(db) as s:
        runs = {i: s.get_run(i) for i in ids}
    return {i: (r.status, r.state) for i, r in runs.items() if r is not None}


def test_a_batch_takes_many_runs_in_one_call_and_commits_each(db_path: str) -> None:
    app = App()
    sizes: list[int] = []

    @app.task(batch=64, batch_wait=0.2)
    def embed(batch: Batch) -> None:
        sizes.append(len(batch))
        for ctx in batch:
            ctx.finish({**ctx.state, "vector": [ctx.payload["i"], len(batch)]})

    with open_store(db_path) as s:
        ids = embed.start_many([{"i": i} for i in range(150)], state={"s": 1}, store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    runs = finished(db_path, ids)
    assert {status for status, _ in runs.values()} == {"succeeded"}
    assert [state["vector"][0] for _, state in runs.values()] == list(range(150))
    assert sum(sizes) == 150 and max(sizes) == 64 and len(sizes) <= 4
    assert w.counters.batches == len(sizes) and w.counters.batch_items == 150


def test_items_fail_alone(db_path: str) -> None:
    app = App()
    calls: list[int] = []

    @app.task(batch=10, batch_wait=0.2, max_attempts=2, retry_backoff=0.01)
    def step(batch: Batch) -> None:
        calls.append(len(batch))
        for ctx in batch:
            kind = ctx.payload["kind"]
            if kind == "fail":
                ctx.fail("this one is bad")  # type: ignore[attr-defined]
            elif kind == "later" and ctx.attempt == 1:
                ctx.retry_after(0.01)  # type: ignore[attr-defined]
            elif kind == "forgotten":
                continue  # left unconcluded: retried alone, then failed
            else:
                ctx.finish({"done": kind})

    kinds = ["ok", "fail", "ok", "later", "forgotten", "ok"]
    with open_store(db_path) as s:
        ids = step.start_many([{"kind": k} for k in kinds], store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    runs = finished(db_path, ids)
    assert [runs[i][0] for i in ids] == [
        "succeeded", "failed", "succeeded", "succeeded", "failed", "succeeded"]  # fmt: skip
    with open_store(db_path) as s:
        failed = s.get_run(ids[1])
        forgotten = s.get_run(ids[4])
    assert failed is not None and "this one is bad" in (failed.last_error or "")
    assert forgotten is not None and "NotConcluded" in (forgotten.last_error or "")
    assert calls[0] == 6  # one call for all of them at first


def test_a_handler_error_reaches_only_the_items_it_left_unconcluded(db_path: str) -> None:
    app = App()

    @app.task(batch=10, batch_wait=0.2, max_attempts=1)
    def step(batch: Batch) -> None:
        for ctx in batch:
            if ctx.payload == "boom":
                raise RuntimeError("the provider broke")
            ctx.finish({"ok": True})

    with open_store(db_path) as s:
        ids = step.start_many(["a", "b", "boom", "c"], store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    assert [finished(db_path, ids)[i][0] for i in ids] == [
        "succeeded", "succeeded", "failed", "failed"]  # fmt: skip


def test_a_cancelled_item_does_not_fail_its_neighbours(db_path: str) -> None:
    app = App()

    @app.task(batch=10, batch_wait=0.2)
    def step(batch: Batch) -> None:
        with open_store(db_path) as s:
            s.cancel_run(batch[1].run_id)  # cancelled under the batch: its finish is refused
        for ctx in batch:
            ctx.finish({"ok": True})

    with open_store(db_path) as s:
        ids = step.start_many([1, 2, 3], store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    assert [finished(db_path, ids)[i][0] for i in ids] == ["succeeded", "cancelled", "succeeded"]


def test_batch_once_keeps_each_items_answer_for_any_later_attempt(db_path: str) -> None:
    app = App()
    billed: list[list[str]] = []
    lock = threading.Lock()

    def provider(texts: list[Any]) -> list[Any]:
        with lock:
            billed.append(list(texts))
        return [f"v:{t}" for t in texts]

    @app.task(batch=8, batch_wait=0.3, retry_backoff=0.01)
    def embed(batch: Batch) -> None:
        vectors = batch.once("embed", [c.payload for c in batch], provider)
        if any(c.attempt == 1 for c in batch):
            raise ConnectionError("lost after the call")  # every item retried
        for ctx, v in zip(batch, vectors, strict=True):
            ctx.finish({"vector": v})

    with open_store(db_path) as s:
        ids = embed.start_many([f"t{i}" for i in range(5)], store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    runs = finished(db_path, ids)
    assert [runs[i] for i in ids] == [("succeeded", {"vector": f"v:t{i}"}) for i in range(5)]
    assert billed == [[f"t{i}" for i in range(5)]]  # paid once, reused by the second attempts
    with open_store(db_path) as s:
        calls = s.paid_calls(ids[0])
    assert [(c.name, c.reused) for c in calls] == [("embed", 1)]


def test_batch_once_asks_only_for_the_items_without_a_kept_answer(db_path: str) -> None:
    app = App()
    billed: list[list[Any]] = []

    @app.task(batch=8, batch_wait=0.3)
    def embed(batch: Batch) -> None:
        def provider(texts: list[Any]) -> list[Any]:
            billed.append(texts)
            return [t * 10 for t in texts]

        vectors = batch.once("embed", [c.payload for c in batch], provider)
        for ctx, v in zip(batch, vectors, strict=True):
            if ctx.payload == 2 and ctx.attempt == 1:
                ctx.retry_after(0)  # type: ignore[attr-defined]
                continue
            ctx.finish({"vector": v})

    with open_store(db_path) as s:
        ids = embed.start_many([1, 2, 3], store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    assert [finished(db_path, ids)[i][1] for i in ids] == [{"vector": v} for v in (10, 20, 30)]
    assert billed == [[1, 2, 3]]  # the item alone later reused its kept answer


@pytest.mark.parametrize(
    ("kw", "error"),
    [({"batch": 0}, "batch must be"), ({"batch": 2, "batch_wait": -1}, "batch_wait must be"),
     ({"batch_wait": 1.0}, "batch_wait is for a batch step")],
)  # fmt: skip
def test_batch_options_are_checked_at_import(kw: dict[str, Any], error: str) -> None:
    app = App()
    with pytest.raises(ValueError, match=error):
        app.task(**kw)(lambda batch: None)


def test_a_batch_handler_is_a_plain_def() -> None:
    app = App()

    async def embed(batch: Batch) -> None:
        return None

    with pytest.raises(ValueError, match="plain def"):
        app.task(batch=4)(embed)


def test_batch_is_a_sequence_of_task_contexts(db_path: str) -> None:
    app = App()
    seen: list[tuple[bool, int, str]] = []

    @app.task(batch=4, batch_wait=0.1)
    def step(batch: Batch) -> None:
        first = f"{batch[0].task_id}.{batch[0].attempt}"
        seen.append((all(isinstance(c, TaskContext) for c in batch), len(batch[0:2]),
                     batch.id == first))  # fmt: skip
        for ctx in batch:
            ctx.finish(None)

    with open_store(db_path) as s:
        ids = step.start_many([1, 2, 3], store=s)
    w, _ = worker(db_path, app)
    assert w.run() == exitcodes.OK
    assert seen == [(True, 2, True)]
    assert {finished(db_path, ids)[i][0] for i in ids} == {"succeeded"}


def test_run_inline_runs_a_batch_step_as_a_batch_of_one() -> None:
    app = App()

    @app.task(batch=16)
    def embed(batch: Batch) -> None:
        vectors = batch.once("embed", [c.payload for c in batch], lambda xs: [x * 2 for x in xs])
        for ctx, v in zip(batch, vectors, strict=True):
            ctx.finish({"vector": v, "items": len(batch)})

    run = app.run_inline(embed, 21)
    assert (run.status, run.state) == ("succeeded", {"vector": 42, "items": 1})


def test_a_lost_item_of_a_running_batch_is_not_a_stuck_handler(db_path: str) -> None:
    with open_store(db_path) as s:
        s.start_runs([{"task": "embed"}] * 2)
        claim = ClaimRequest("w", 30, limit=2, task="embed")
        leader, rider = s.commit_many([], claim=claim).leases
    holdings = Holdings()
    lead = Execution(leader, lambda b: None, Mode.THREAD, item=True)
    ride = Execution(rider, lambda b: None, Mode.THREAD, item=True, rider=True)
    with holdings.lock:
        holdings.begin(lead)
        holdings.begin(ride)
        assert holdings.users() == 1  # the batch holds one slot
    config = worker(db_path, App())[0].config
    alarms = Alarms(config, holdings, None, lambda e: None)  # type: ignore[arg-type]
    assert alarms.handler_stuck(rider) is None  # the call goes on for its neighbours
    stuck = alarms.handler_stuck(leader)
    assert stuck is not None and stuck.exit == exitcodes.LEASE_STUCK
