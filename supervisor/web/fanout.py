"""One follower of the outbox for every event stream of the dashboard (``stream.py``).

Each stream following the table on its own would read it once per commit per open stream (on
PostgreSQL each read also numbers the committed events first: a transaction of its own, B18),
so 32 open tabs meant 32 readers woken by every commit. Instead one ``Fanout`` follows it
(``AsyncStore.follow``) while any stream is open and keeps the newest events in memory; a stream
takes what follows its own position from there, and only a stream whose position is older
than what is kept (a reconnect after a long absence) reads the table itself until it catches up.

Why no event is lost or given twice: ``follow`` yields the committed events in id order, each
read a prefix of what is committed (B18), so at every moment the fanout holds every event with
an id in ``(base, cursor]``. A stream at position ``c >= base`` takes the kept ones above ``c``
and moves to ``cursor``; one below reads ``events(c)`` itself, and after a short read (it saw
the end of the table) it stands at least at the ``cursor`` it noted before the read: every
event up to that one was committed and visible to it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
from collections.abc import AsyncIterator

from workerproc.store import AsyncStore, Event
from workerproc.store.types import SYSTEM_RUNS

KEEP = 10_000  # events kept in memory for the streams (trimmed when twice as many)
READ = 500  # events a stream that catches up reads at a time


class Fanout:
    def __init__(self, store: AsyncStore, start: int, keep: int = KEEP) -> None:
        self.store = store
        self.keep = keep
        self.base = start  # every event with an id in (base, cursor] is in ``kept``
        self.cursor = start
        self.kept: list[Event] = []
        self.failed: BaseException | None = None
        self.users = 0  # streams that follow it (the last to leave stops it)
        self._moved = asyncio.Condition()
        self._task = asyncio.create_task(self._follow())

    @classmethod
    async def start(cls, store: AsyncStore, keep: int = KEEP) -> Fanout:
        """A fanout from the newest event on, keeping ``keep`` of them (to twice as many)."""
        return cls(store, await store.last_event_id(), keep)

    @property
    def running(self) -> bool:
        return not self._task.done()

    async def _follow(self) -> None:
        try:
            async for event in self.store.follow(after=self.cursor, system=True):
                self.kept.append(event)
                if len(self.kept) > 2 * self.keep:
                    self.base = self.kept[-self.keep - 1].id
                    del self.kept[: len(self.kept) - self.keep]
                self.cursor = event.id
                async with self._moved:
                    self._moved.notify_all()
        except Exception as exc:  # the database went away: every stream ends, one line each
            self.failed = exc
            async with self._moved:
                self._moved.notify_all()

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    def _moved_from(self, seen: int) -> bool:
        return self.cursor != seen or self.failed is not None

    async def follow(
        self, after: int, run: int | None, system: bool = False
    ) -> AsyncIterator[Event]:
        """Every event after ``after`` (of run ``run``; the users' runs' only unless
        ``system``, B20), then each new one, for ever."""
        at = after
        while True:
            if self.failed is not None:
                raise self.failed
            if at >= self.base:
                first = bisect.bisect_right(self.kept, at, key=lambda e: e.id)
                batch = [e for e in self.kept[first:] if _shown(e, run, system)]
                seen = self.cursor
                at = max(at, seen)
                for event in batch:
                    yield event
                if not batch:
                    async with self._moved:
                        await self._moved.wait_for(functools.partial(self._moved_from, seen))
                continue
            noted = self.cursor
            read = await self.store.events(at, READ, run=run, system=system)
            for event in read:
                yield event
            if read:
                at = read[-1].id
            if len(read) < READ:
                at = max(at, noted)


def _shown(event: Event, run: int | None, system: bool) -> bool:
    """Whether a stream of run ``run`` (None: every run's; the users' only unless ``system``,
    not the webhooks' deliveries', B20) takes ``event``."""
    if run is not None:
        return event.run_id == run
    return system or (event.run_id or 0) < SYSTEM_RUNS
