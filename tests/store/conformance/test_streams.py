"""Runs' streams (B21): ``append_stream`` is fenced (a zombie's batch is refused and recorded, a
newer attempt's first batch begins with a reset), ``stream`` reads in offset order without gaps,
``emitted`` answers what the step's newest earlier attempt wrote, ``drop_expired_streams``
honours ``stream_ttl``, the bounds are refused, and the async store reads and follows."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest
from store_backends import SQLiteBackend

from workerproc.store import AsyncStore, CasResult, Commit, InvalidPayload, RunNotFound
from workerproc.store import open_async_store as open_async
from workerproc.store.protocol.streams import chunk_text
from workerproc.store.streams import MAX_BATCH, MAX_CHUNK, MAX_READ, MAX_STREAM
from workerproc.store.types import TaskOptions

from .kit import TTL, Driver, verb

OK = CasResult.OK


def texts(*values: object) -> list[str]:
    return [json.dumps(v) for v in values]


@verb("append_stream", "stream")
def test_batches_are_numbered_in_order_and_read_after_an_offset(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    first = s.append_stream(lease, texts("a", "b"))
    assert (first.outcome, first.last, first.reset) == ("written", 2, False)
    # the same batch tried again after a write that landed: found written, never twice
    assert s.append_stream(lease, texts("a", "b")) == first
    assert s.append_stream(lease, texts({"n": 3}), after=2).last == 3
    assert s.append_stream(lease, texts({"n": 3}), after=2).last == 3
    chunks = s.stream(lease.run_id)
    assert [(c.offset, c.attempt, c.step, c.kind, c.data) for c in chunks] == [
        (1, 1, lease.task_id, "data", "a"), (2, 1, lease.task_id, "data", "b"),
        (3, 1, lease.task_id, "data", {"n": 3}),
    ]  # fmt: skip
    assert [c.offset for c in s.stream(lease.run_id, after=1, limit=1)] == [2]
    assert s.stream(lease.run_id, after=3) == [] and s.stream(999) == []
    assert chunks[0].as_json()["data"] == "a"


def batch_rows(driver: Driver, run_id: int) -> list[tuple[int, int]]:
    """The rows that keep a run's stream: (first, last) of each, in order."""
    query = "SELECT first, last FROM stream_batches WHERE run_id = {} ORDER BY first"
    if isinstance(driver.backend, SQLiteBackend):
        with sqlite3.connect(driver.backend.path) as conn:
            return [tuple(r) for r in conn.execute(query.format("?"), (run_id,))]
    with driver.backend.connect() as conn:  # type: ignore[attr-defined]
        return [tuple(r) for r in conn.execute(query.format("%s"), (run_id,))]


@verb("append_stream", "stream", "AsyncStore.stream")
def test_a_batch_is_one_row_read_from_within_and_across_batches(driver: Driver) -> None:
    """A batch is kept as one row, its reset first; a read begins inside a batch and ends
    inside another, ``limit`` chunks at most, far into a long stream as at its start."""
    s = driver.store
    old = driver.lease("t", owner="zombie")
    assert s.append_stream(old, texts(*range(MAX_BATCH))).last == MAX_BATCH
    driver.clock.advance(TTL + 1)
    lease = driver.claim("w2")  # its step taken over
    big = s.append_stream(lease, texts(*range(MAX_BATCH)))  # the takeover: a reset first
    assert (big.last, big.reset) == (2 * MAX_BATCH + 1, True)
    last = big.last
    for n in range(3):
        last = s.append_stream(lease, texts(*(f"c{n}.{i}" for i in range(5))), after=last).last
    assert batch_rows(driver, lease.run_id) == [
        (1, MAX_BATCH), (MAX_BATCH + 1, 2 * MAX_BATCH + 1), (2 * MAX_BATCH + 2, last - 10),
        (last - 9, last - 5), (last - 4, last)]  # fmt: skip
    whole = s.stream(lease.run_id, limit=MAX_READ)
    assert [c.offset for c in whole] == list(range(1, last + 1))
    assert whole[MAX_BATCH].kind == "reset" and whole[MAX_BATCH].data is None
    assert (whole[MAX_BATCH + 1].attempt, whole[MAX_BATCH + 1].data) == (lease.attempt, 0)
    assert whole[-1].data == "c2.4" and whole[-1].step == lease.task_id
    for after, limit in [(0, 1), (3, 2), (MAX_BATCH - 1, 3), (MAX_BATCH + 5, 1500),
                         (last - 12, 4), (last - 7, 100), (last - 1, 5), (last, 5)]:  # fmt: skip
        got = s.stream(lease.run_id, after=after, limit=limit)
        assert got == whole[after : after + limit], (after, limit)
        assert asyncio.run(read_async(driver, lease.run_id, after, limit)) == got


async def read_async(driver: Driver, run_id: int, after: int, limit: int) -> list[object]:
    async with await open_async(driver.backend.url, clock=driver.clock) as store:
        return list(await store.stream(run_id, after, limit))


@verb("append_stream", "emitted")
def test_a_zombie_is_refused_and_the_new_attempt_begins_with_a_reset(driver: Driver) -> None:
    s = driver.store
    old = driver.lease("t", owner="zombie")
    assert s.append_stream(old, texts("x1", "x2")).outcome == "written"
    assert s.emitted(old) == []  # the first attempt: nothing before it
    driver.clock.advance(TTL + 1)
    assert s.append_stream(old, texts("late")).outcome == "lost"  # expired, not yet taken
    new = driver.claim("w2")
    assert s.append_stream(old, texts("zombie")).outcome == "lost"
    assert [r.op for r in driver.refusals("emit")] == ["emit", "emit"]
    assert s.emitted(new) == ["x1", "x2"]
    written = s.append_stream(new, texts("y1"))
    assert (written.outcome, written.last, written.reset) == ("written", 4, True)
    assert s.append_stream(new, texts("y2"), after=4).reset is False  # once per attempt
    kinds = [(c.kind, c.attempt, c.data) for c in s.stream(new.run_id)]
    assert kinds == [("data", 1, "x1"), ("data", 1, "x2"), ("reset", 2, None),
                     ("data", 2, "y1"), ("data", 2, "y2")]  # fmt: skip


@verb("append_stream")
def test_a_cancelled_run_and_the_next_step_get_no_reset(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    s.append_stream(lease, texts("a"))
    assert driver.commit(Commit(lease, "advance", next_task="u", new_state={"n": 1})) == OK
    nxt = driver.claim("w1")
    appended = s.append_stream(nxt, texts("b"))
    assert (appended.last, appended.reset) == (2, False)  # another step: it goes on
    assert s.cancel_run(nxt.run_id)
    assert s.append_stream(nxt, texts("c"), after=2).outcome == "over"
    assert driver.refusals("emit") == []


@verb("commit_many", "append_stream")
def test_an_exchange_writes_stream_batches_fenced_like_append_stream(driver: Driver) -> None:
    s = driver.store
    old = driver.lease("t", owner="zombie")
    assert s.append_stream(old, texts("x1")).last == 1
    driver.clock.advance(TTL + 1)
    new = driver.claim("w2")  # the zombie's run, taken over
    assert new.run_id == old.run_id
    mine = driver.lease("t")  # another run, streaming beside it
    out = s.commit_many(
        [Commit(mine, "finish", new_state={"done": 1})],
        streams=[(old, texts("late"), 1), (new, texts("y1", "y2"), None),
                 (mine, texts("a"), None)],
    )  # fmt: skip
    assert out.results == (OK,)  # the exchange's own commit lands whatever its batches say
    assert [(a.outcome, a.last, a.reset) for a in out.appended] == [
        ("lost", 0, False), ("written", 4, True), ("written", 1, False)]  # fmt: skip
    assert [r.op for r in driver.refusals("emit")] == ["emit"]
    assert [(c.offset, c.kind, c.attempt, c.data) for c in s.stream(new.run_id)] == [
        (1, "data", 1, "x1"),
        (2, "reset", 2, None),
        (3, "data", 2, "y1"),
        (4, "data", 2, "y2"),
    ]
    assert [c.data for c in s.stream(mine.run_id)] == ["a"]
    # each answer in the order asked, whatever the order the runs' heads are locked in
    more = driver.lease("t")  # a run after the taken-over one
    assert s.append_stream(more, texts("m1")).last == 1
    later = s.commit_many([], streams=[(more, texts("m2"), 1), (new, texts("y3"), 4)]).appended
    assert [(a.outcome, a.last) for a in later] == [("written", 2), ("written", 5)]
    # the same batch again (an exchange that landed without its answer): found written
    again = s.commit_many([], streams=[(new, texts("y1", "y2"), None)]).appended
    assert [(a.outcome, a.last) for a in again] == [("written", 5)]
    assert s.append_stream(new, texts("y4"), after=5).last == 6  # the thread goes on after it
    with pytest.raises(InvalidPayload, match="1 to"):
        s.commit_many([], streams=[(new, [], 6)])


@verb("append_stream")
def test_the_bounds_are_refused_with_the_limit_named(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    with pytest.raises(InvalidPayload, match="stream chunk"):
        chunk_text("x" * MAX_CHUNK)
    with pytest.raises(InvalidPayload, match="1 to"):
        s.append_stream(lease, [])
    big = chunk_text("y" * (MAX_CHUNK - 10))
    batch = [big] * (MAX_STREAM // len(big) // 4)
    last = None
    for _ in range(4):
        last = s.append_stream(lease, batch, after=last).last
    full = s.append_stream(lease, [big, big], after=last)
    assert full.outcome == "full"


@verb("drop_expired_streams", "prune")
def test_stream_ttl_drops_a_succeeded_runs_chunks_after_its_time(driver: Driver) -> None:
    s = driver.store
    s.register_tasks({"t": TaskOptions(stream_ttl=10.0)})
    assert s.task_options()["t"].stream_ttl == 10.0
    lease = driver.lease("t")
    s.append_stream(lease, texts("a"))
    other = driver.lease("u")
    s.append_stream(other, texts("b"))
    assert driver.finish(lease) == OK and driver.finish(other) == OK
    assert s.drop_expired_streams() == 0
    driver.clock.advance(11)
    assert s.drop_expired_streams() == 1
    assert s.stream(lease.run_id) == [] and len(s.stream(other.run_id)) == 1
    assert s.prune(5.0) == 2  # a stream goes with its run
    assert s.stream(other.run_id) == []


@verb("AsyncStore.stream", "AsyncStore.follow_stream")
def test_async_follow_yields_what_is_there_then_what_is_written(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    s.append_stream(lease, texts("a"))

    async def body(a: AsyncStore) -> list[object]:
        assert [c.data for c in await a.stream(lease.run_id)] == ["a"]
        got: list[object] = []
        async for chunk in a.follow_stream(lease.run_id, poll=0.05):
            got.append(chunk.data)
            if len(got) == 1:
                await asyncio.to_thread(s.append_stream, lease, texts("b"), after=1)
            if len(got) == 2:
                await asyncio.to_thread(driver.finish, lease)
        with pytest.raises(RunNotFound):
            async for _ in a.follow_stream(999):
                pass
        return got

    async def main() -> list[object]:
        async with await open_async(driver.backend.url, clock=driver.clock) as a:
            return await body(a)

    assert asyncio.run(main()) == ["a", "b"]  # and it ended with its run
