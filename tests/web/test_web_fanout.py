"""The dashboard's one follower of the outbox for all its streams (supervisor/web/fanout.py),
on both backends: streams from any position — older than what it keeps, inside it, at its
newest — started while runs commit, each get every event after their position exactly once,
in order, as the table has them; a run's stream only that run's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from supervisor.web.fanout import Fanout
from workerproc.store import Event, Store, open_async_store

KEEP = 5  # small: the kept events are trimmed many times over


def test_streams_from_any_position_get_every_event_once(s: Store) -> None:
    early = s.start_runs([{"task": f"early{i}"} for i in range(40)])

    async def main() -> None:
        async with await open_async_store(s.url) as store:
            fanout = await Fanout.start(store, keep=KEEP)
            newest = fanout.cursor

            async def take(
                after: int, run: int | None, last: Callable[[Event], bool]
            ) -> list[Event]:
                got = []
                async for event in fanout.follow(after, run):
                    got.append(event)
                    if last(event):
                        return got
                raise AssertionError("the follow ended")

            async def write(rounds: int) -> None:
                for i in range(rounds):
                    await store.start_runs([{"task": f"late{i}.{j}"} for j in range(3)])
                    await asyncio.sleep(0.01)

            def final(e: Event) -> bool:
                return e.task == "final"

            await write(5)
            positions = [0, 7, newest - 3, newest]
            streams = [asyncio.create_task(take(p, None, final)) for p in positions]
            mine = asyncio.create_task(take(0, early[3], lambda e: e.kind == "run.cancelled"))
            await write(15)  # while the streams catch up and follow
            late = [asyncio.create_task(take(p, None, final)) for p in (3, fanout.cursor)]
            await write(5)
            s.cancel_run(early[3])
            await store.start_run("final")
            results = await asyncio.gather(*streams, *late)
            for after, got in zip([*positions, 3], results, strict=False):
                assert got == await store.events(after=after, limit=10_000)
            assert results[-1] and final(results[-1][-1])
            assert await mine == await store.events(run=early[3])
            assert fanout.base > newest  # the kept events were trimmed: both paths ran
            await fanout.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
