"""The async store (``AsyncStore``): the same answers and errors as ``Store``'s verbs of the
same names, on the same database."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from workerproc.store import AsyncStore, CasResult, InvalidPayload, RunNotFound, RunOver
from workerproc.store import open_async_store as open_async
from workerproc.store.errors import InvalidOption

from .kit import Driver, last_word, verb

T = TypeVar("T")


def run(driver: Driver, body: Callable[[AsyncStore], Awaitable[T]]) -> T:
    async def main() -> T:
        async with await open_async(driver.backend.url, clock=driver.clock) as a:
            return await body(a)

    return asyncio.run(main())


@verb("AsyncStore.start_run", "AsyncStore.start_runs", "AsyncStore.get_run", "AsyncStore.close")
def test_async_starts_are_the_stores(driver: Driver) -> None:
    async def body(a: AsyncStore) -> tuple[int, list[int]]:
        one = await a.start_run("t", {"p": 1}, {"n": 0}, key="k", queue="q", priority=2)
        assert await a.start_run("t", key="k") == one
        many = await a.start_runs([{"task": "a"}, {"task": "b", "key": "k"}])
        assert many[1] == one and await a.start_runs([]) == []
        run_ = await a.get_run(one)
        assert run_ is not None and (run_.state, run_.queue, run_.priority) == ({"n": 0}, "q", 2)
        assert await a.get_run(999) is None
        with pytest.raises(InvalidPayload):
            await a.start_run("", None)
        with pytest.raises(InvalidPayload):
            await a.start_runs([{"task": "ok"}, {"task": "t", "colour": 1}])
        return one, many

    one, many = run(driver, body)
    s = driver.store
    assert s.get_run(one) == s.get_run(many[1]) and len(s.list_runs()) == 2
    assert s.get_tasks(one)[0].payload == {"p": 1}


@verb("AsyncStore.signal")
def test_async_signal_resumes_a_wait_and_refuses_as_the_store_does(driver: Driver) -> None:
    lease = driver.lease("t")
    assert driver.commit(last_word(lease, "wait")) is CasResult.OK
    done = driver.lease("u")
    assert driver.finish(done) is CasResult.OK

    async def body(a: AsyncStore) -> int:
        with pytest.raises(RunNotFound):
            await a.signal(999, "go")
        with pytest.raises(RunOver):
            await a.signal(done.run_id, "go")
        return await a.signal(lease.run_id, "go", {"x": 1})

    sid = run(driver, body)
    resumed = driver.claim("w2")
    assert resumed.signal is not None and resumed.signal.payload == {"x": 1}
    assert driver.store.run_signals(lease.run_id)[0].id == sid


@verb("AsyncStore.wait")
def test_async_wait_returns_the_ended_run_or_times_out(driver: Driver) -> None:
    lease = driver.lease("t")

    async def body(a: AsyncStore) -> str:
        with pytest.raises(TimeoutError):
            await a.wait(lease.run_id, 0.05)
        with pytest.raises(RunNotFound):
            await a.wait(999, 1)
        with pytest.raises(ValueError):
            await a.wait(lease.run_id, -1)
        waiting = asyncio.ensure_future(a.wait(lease.run_id, 30))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(driver.finish, lease, {"r": 1})
        ended = await waiting
        return f"{ended.status} {ended.result}"

    assert run(driver, body) == "succeeded {'r': 1}"


@verb("AsyncStore.events", "AsyncStore.last_event_id", "AsyncStore.consumer_position",
      "AsyncStore.ack_events")  # fmt: skip
def test_async_outbox_reads_and_acknowledgements(driver: Driver) -> None:
    s = driver.store
    for task in ("a", "b"):
        s.start_run(task)
    expected = s.events()

    async def body(a: AsyncStore) -> None:
        assert await a.events() == expected
        assert await a.last_event_id() == expected[-1].id
        assert await a.consumer_position("c") == 0
        assert await a.ack_events("c", expected[0].id) == expected[0].id
        assert await a.events(consumer="c") == expected[1:]
        with pytest.raises(InvalidOption):
            await a.ack_events("c", expected[-1].id + 5)
        with pytest.raises(InvalidOption):
            await a.events(limit=0)

    run(driver, body)
    assert s.consumer_position("c") == expected[0].id


@verb("AsyncStore.follow")
def test_async_follow_yields_what_is_there_then_what_commits(driver: Driver) -> None:
    s = driver.store
    s.start_run("a")

    async def body(a: AsyncStore) -> list[str]:
        got: list[str] = []
        async for event in a.follow(poll=0.05):
            got.append(f"{event.kind}:{event.run_id}")
            if len(got) == 1:
                await asyncio.to_thread(s.start_run, "b")
            if len(got) == 2:
                break
        return got

    assert run(driver, body) == ["run.enqueued:1", "run.enqueued:2"]
