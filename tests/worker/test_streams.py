"""The handler's stream (B21): ``ctx.emit`` / ``emit_async`` write in batches and the whole
stream is written before the step's commit; a zombie gets ``LeaseLost`` at its next emit and
its successor reads what it emitted (``ctx.emitted``); a chunk too big and a full stream are
refused with the limit named; ``stream_ttl`` is checked at import and kept."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import FakeClock, wait_for
from store_backends import Backend

from workerproc import App, LeaseLost, RunCancelled, TaskContext
from workerproc.emitting import StreamFull
from workerproc.store import ClaimRequest, InvalidPayload, Lease, Store
from workerproc.store.streams import MAX_CHUNK, step_texts
from workerproc.streaming import BATCH, DELAY, Streamer
from workerproc.testing import run_inline, temporary_store

TTL = 60.0


def test_a_plain_and_an_async_handler_stream_their_answer() -> None:
    app = App()

    @app.task
    def plain(ctx: TaskContext) -> None:
        for i in range(3 * BATCH + 5):  # batches by count, then the rest before the commit
            ctx.emit(f"{i} ")
        ctx.finish({"answer": ctx.emitted_text()})

    @app.task
    async def answer(ctx: TaskContext) -> None:
        for word in ctx.payload["prompt"].split():
            await ctx.emit_async(word.upper())
        await ctx.emit_async({"done": True})  # any JSON; not text: not in emitted_text
        await ctx.flush_async()
        ctx.finish({"answer": ctx.emitted_text()})

    with temporary_store() as store:
        run = run_inline(app, "plain", store=store)
        chunks = store.stream(run.id, 0, 1000)
        assert [c.offset for c in chunks] == list(range(1, 3 * BATCH + 6))
        assert run.state == {"answer": "".join(f"{i} " for i in range(3 * BATCH + 5))}
        run = run_inline(app, "answer", {"prompt": "a b"}, store=store)
        assert [c.data for c in store.stream(run.id)] == ["A", "B", {"done": True}]
        assert run.state == {"answer": "AB"}
        assert step_texts(store.stream(run.id)) == {chunks[0].step + 1: 'AB{"done": true}\n'}


def context(store: Store, lease: Lease, streams: Streamer) -> TaskContext:
    return TaskContext(lease, threading.Event(), streams=streams)


def test_a_zombie_learns_lease_lost_at_its_next_emit_and_its_successor_goes_on(
    backend: Backend, clock: FakeClock, s: Store
) -> None:
    streams = Streamer(lambda: backend.open(clock))
    try:
        s.start_run("answer")
        old = s.commit_many([], claim=ClaimRequest("zombie", TTL)).leases[0]
        ctx = context(s, old, streams)
        ctx.emit("draft one ")
        ctx.emit("draft two")
        ctx.flush()  # written, and readable at once
        assert [c.data for c in s.stream(old.run_id)] == ["draft one ", "draft two"]
        assert ctx.emitted == []  # a first attempt: nothing before it
        clock.advance(TTL + 1)
        new = s.commit_many([], claim=ClaimRequest("w2", TTL)).leases[0]
        ctx.emit("late")  # buffered: the refusal comes with its batch's write

        def refused() -> bool:
            try:
                ctx.emit("later")
            except LeaseLost:
                return True
            time.sleep(DELAY)
            return False

        wait_for(refused, timeout=30, what="LeaseLost at an emit")
        assert [r.op for r in s.fence_rejections()] == ["emit"]
        successor = context(s, new, streams)
        assert successor.emitted == ["draft one ", "draft two"]
        for chunk in successor.emitted:  # it goes on from there
            successor.emit(chunk)
        successor.emit(" and the end")
        successor.flush()
        chunks = s.stream(new.run_id)
        assert [(c.kind, c.attempt) for c in chunks[2:]] == [("reset", 2)] + [("data", 2)] * 3
        assert step_texts(chunks) == {new.task_id: "draft one draft two and the end"}
    finally:
        streams.close()


def test_the_bounds_are_refused_with_the_limit_named(
    backend: Backend, clock: FakeClock, s: Store
) -> None:
    streams = Streamer(lambda: backend.open(clock))
    s.start_run("answer")
    lease = s.commit_many([], claim=ClaimRequest("w1", TTL)).leases[0]
    ctx = context(s, lease, streams)
    with pytest.raises(InvalidPayload, match="over the limit of 65,536"):
        ctx.emit("x" * MAX_CHUNK)
    with pytest.raises(InvalidPayload, match="JSON"):
        ctx.emit(object())  # type: ignore[arg-type]
    big = "y" * (MAX_CHUNK - 100)
    with pytest.raises(StreamFull, match="full"):
        for _ in range(10_000):
            ctx.emit(big)
    streams.close()


def test_stream_ttl_is_checked_at_import_and_kept() -> None:
    app = App()
    with pytest.raises(ValueError, match="stream_ttl"):
        app.task(stream_ttl=-1)(lambda ctx: None)
    with pytest.raises(ValueError, match="stream_ttl"):
        app.task(stream_ttl="1h")(lambda ctx: None)  # type: ignore[arg-type]
    task = app.task("kept", stream_ttl=3600)(lambda ctx: None)
    assert task.options.stream_ttl == 3600.0
    assert app.task_options()["kept"].stream_ttl == 3600.0


def test_a_cancelled_run_stops_its_handler_at_an_emit(
    backend: Backend, clock: FakeClock, s: Store
) -> None:
    streams = Streamer(lambda: backend.open(clock))
    try:
        s.start_run("answer")
        lease = s.commit_many([], claim=ClaimRequest("w1", TTL)).leases[0]
        ctx = context(s, lease, streams)
        ctx.emit("before")
        ctx.flush()
        assert s.cancel_run(lease.run_id)
        with pytest.raises(RunCancelled):
            ctx.emit("after")
            ctx.flush()  # the batch is refused: the run is over
        assert ctx.cancelled and [c.data for c in s.stream(lease.run_id)] == ["before"]
        assert s.fence_rejections() == []  # a live lease on an ended run: no zombie
    finally:
        streams.close()
