"""Async waits end when cancelled: a cancellation is never swallowed by the wake-up it meets."""

from __future__ import annotations

import asyncio

import pytest

from workerproc.store.aio import sleep_on


@pytest.mark.parametrize("steps", range(8))
def test_a_cancelled_sleeper_ends_even_as_the_change_wakes_it(steps: int) -> None:
    """A cancellation that arrives while the change watch wakes a sleeper (at every step of
    that wake-up) ends it: none is swallowed, so a cancelled follower stops following."""

    async def main() -> None:
        changed = asyncio.Condition()
        moved = False
        sleeper = asyncio.create_task(sleep_on(changed, lambda: moved, 30.0))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the sleeper waits on the condition
        async with changed:
            moved = True
            changed.notify_all()
        for _ in range(steps):
            await asyncio.sleep(0)
        if not sleeper.cancel():
            return  # it had ended already: nothing to cancel
        with pytest.raises(asyncio.CancelledError):
            await sleeper

    asyncio.run(main())
