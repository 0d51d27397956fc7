"""The async producer API (``open_async_store``): awaitable ``start_run``, ``start_runs``,
``get_run`` and ``wait`` on every backend, with the sync store's checks and answers, and an event
loop that stays free while they run (SQLite on threads of the store's own, one connection per
thread; PostgreSQL on psycopg's ``AsyncConnection``)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from store_backends import Backend

from workerproc import App, TaskContext
from workerproc.store import InvalidPayload, RunNotFound, StoreError, open_async_store, open_store
from workerproc.store.aio import AsyncStore

T = TypeVar("T")


def run(backend: Backend, test: Callable[[AsyncStore], Awaitable[T]]) -> T:
    async def main() -> T:
        async with await open_async_store(backend.url) as store:
            return await test(store)

    return asyncio.run(main())


def finish_later(backend: Backend, run_id: int, after: float) -> threading.Thread:
    """Another process's worker, as a thread with a sync store: it finishes ``run_id``."""

    def work() -> None:
        time.sleep(after)
        with open_store(backend.url) as store:
            for _ in range(100):
                lease = store.claim("w", 60)
                if lease is not None and lease.run_id == run_id:
                    store.ack(lease)
                    return
                if lease is not None:
                    store.release(lease)

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_start_get_and_keys_answer_as_the_sync_store_does(backend: Backend) -> None:
    async def test(store: AsyncStore) -> None:
        first = await store.start_run("prepare", {"doc": "cv.pdf"}, {"n": 1}, key="order-1")
        assert await store.start_run("prepare", {"doc": "other"}, key="order-1") == first
        ids = await store.start_runs(
            [{"task": "prepare", "payload": {"i": i}, "queue": "bulk"} for i in range(3)]
        )
        assert len(ids) == 3 and ids == sorted(ids) and first < ids[0]
        got = await store.get_run(first)
        assert got is not None and (got.status, got.state, got.key) == ("pending", {"n": 1},
                                                                       "order-1")  # fmt: skip
        assert await store.get_run(10**9) is None
        with pytest.raises(InvalidPayload):
            await store.start_run("prepare", {"bad": float("nan")})
        assert await store.start_runs([]) == []

    run(backend, test)
    with open_store(backend.url) as sync:
        assert [r.queue for r in sync.list_runs()] == ["bulk", "bulk", "bulk", "default"]
        assert sync.get_tasks(1)[0].payload == {"doc": "cv.pdf"}


def test_wait_sleeps_until_the_run_ends_and_the_loop_stays_free(backend: Backend) -> None:
    async def test(store: AsyncStore) -> tuple[str, int]:
        run_id = await store.start_run("step")
        worker = finish_later(backend, run_id, after=0.5)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(ticker())
        try:
            ended = await store.wait(run_id, timeout=60)
        finally:
            beat.cancel()
        await asyncio.to_thread(worker.join)
        return ended.status, ticks

    status, ticks = run(backend, test)
    assert status == "succeeded"
    assert ticks >= 5  # the loop ran other coroutines all along (0.5 s of 10 ms sleeps)


def test_many_waits_at_once_each_wake_for_its_own_run(backend: Backend) -> None:
    async def test(store: AsyncStore) -> list[str]:
        ids = await store.start_runs([{"task": "step"} for _ in range(12)])
        worker = threading.Thread(target=drain, args=(backend, len(ids)))
        waits = [asyncio.create_task(store.wait(i, timeout=60)) for i in ids]
        await asyncio.sleep(0.05)
        worker.start()
        ended = await asyncio.gather(*waits)
        await asyncio.to_thread(worker.join)
        return [r.status for r in ended]

    assert run(backend, test) == ["succeeded"] * 12


def drain(backend: Backend, count: int) -> None:
    with open_store(backend.url) as store:
        done = 0
        while done < count:
            lease = store.claim("w", 60)
            if lease is not None:
                store.ack(lease)
                done += 1


def test_wait_times_out_and_names_an_unknown_run(backend: Backend) -> None:
    async def test(store: AsyncStore) -> None:
        run_id = await store.start_run("step")
        begun = time.monotonic()
        with pytest.raises(TimeoutError, match=r"still pending after 0\.2 s"):
            await store.wait(run_id, timeout=0.2)
        assert time.monotonic() - begun < 10
        with pytest.raises(RunNotFound):
            await store.wait(10**9, timeout=1)
        with pytest.raises(ValueError, match="timeout must be"):
            await store.wait(run_id, timeout=-1)

    run(backend, test)


def test_a_task_object_starts_through_the_async_store(backend: Backend) -> None:
    app = App()

    @app.task(queue="llm", priority=4)
    def call(ctx: TaskContext) -> None: ...

    async def test(store: AsyncStore) -> list[Any]:
        one = await call.start({"doc": 1}, store=store)
        many = await call.start_many([{"doc": 2}, {"doc": 3}], store=store)
        runs = [await store.get_run(i) for i in (one, *many)]
        return [(r.task, r.queue, r.priority) for r in runs if r is not None]

    assert run(backend, test) == [("call", "llm", 4)] * 3


def test_a_closed_store_refuses_calls(backend: Backend) -> None:
    async def main() -> None:
        store = await open_async_store(backend.url)
        await store.close()
        with pytest.raises(StoreError, match="closed"):
            await store.start_run("step")

    asyncio.run(main())


def test_sqlite_connections_live_on_the_stores_threads_never_the_loops(tmp_path: Any) -> None:
    async def main() -> set[str]:
        async with await open_async_store(str(tmp_path / "lk.db")) as store:
            await asyncio.gather(*(store.start_run("t") for _ in range(20)))
            await store.get_run(1)
            dialect = store.backend.dialect  # type: ignore[attr-defined]
            assert getattr(dialect._local, "conn", None) is None  # none on the loop's thread
            return {t.name.rsplit("_", 1)[0] for t in threading.enumerate()}

    names = asyncio.run(main())
    assert "leasekeeper-sqlite" in names
    with open_store(str(tmp_path / "lk.db")) as sync:
        assert len(sync.list_runs()) == 20


@pytest.mark.parametrize("finished", [False, True], ids=["following", "just-finished"])
def test_closing_the_store_under_its_followers_leaves_no_failed_task(
    backend: Backend, finished: bool
) -> None:
    """Followers that began together share one change watch; closing the store while they
    follow (or just after they stopped) stops it: no task is left to fail on the closed store
    ("Task exception was never retrieved")."""
    with open_store(backend.url) as sync:
        sync.start_runs([{"task": "t"}] * 8)
        leases = [sync.claim("w", 60) for _ in range(8)]  # (an earlier test's runs, maybe)
        for lease in leases:
            assert lease is not None
            sync.append_stream(lease, ['"a"'])
        ids = [lease.run_id for lease in leases if lease is not None]
    failures: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: failures.append(ctx))
        store = await open_async_store(backend.url)
        seen: set[int] = set()

        async def follow(run_id: int) -> None:
            async for _ in store.follow_stream(run_id, poll=0.05):
                seen.add(run_id)
                if finished:
                    break

        tasks = [asyncio.create_task(follow(r)) for r in ids]  # their watches begin at once
        for _ in range(3000):
            if len(seen) == len(ids):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)  # the followers wait on the change watch (or just left it)
        await store.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(20):  # anything left running meets the closed store now
            await asyncio.sleep(0.01)
        gc.collect()  # an unretrieved exception is reported when its task is collected
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    assert not failures, failures
