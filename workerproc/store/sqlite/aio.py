"""The async store on SQLite (``store/aio.py``): SQLite has no async driver, so the sync dialect
runs on threads of the store's own, and the event loop only awaits them.

- Statements run on a small thread pool (``WORKERS``); the dialect keeps one connection per
  thread, so a connection never crosses threads, and every write is its ``BEGIN IMMEDIATE``
  transaction, as in the sync store.
- Waits share one watcher: while any wait runs, one thread of its own (one connection, so its
  ``PRAGMA data_version`` readings compare) reads the change token every ``CHANGE_CHECK`` and
  wakes the waits when it moves; no wait holds a thread while it sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..aio import AsyncBackend, sleep_on, stop
from ..dialect import CHANGE_CHECK, Channel, Params, Row
from ..errors import StoreError
from ..protocol.programs import Program, drive
from ..settings import SQLiteOptions
from ..types import Clock
from .dialect import SQLiteDialect

T = TypeVar("T")
WORKERS = 4  # threads (and connections) for statements: SQLite has one writer at a time


class SQLiteAsync(AsyncBackend):
    def __init__(self, dialect: SQLiteDialect) -> None:
        self.dialect = dialect
        self.url = dialect.url
        self._work = ThreadPoolExecutor(WORKERS, thread_name_prefix="leasekeeper-sqlite")
        self._watch = ThreadPoolExecutor(1, thread_name_prefix="leasekeeper-sqlite-watch")
        self._waits = 0  # waits running: the watcher runs while there is one
        self._token = 0  # moves each time the watcher sees the database change
        self._changed: asyncio.Condition | None = None
        self._starting: asyncio.Lock | None = None  # (made with ``_changed``, on the loop)
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(cls, path: str, options: SQLiteOptions, clock: Clock | None) -> SQLiteAsync:
        backend = cls(SQLiteDialect(path, options, clock=clock))
        await backend._call(backend.dialect.migrate)  # creates the file: off the loop
        return backend

    async def _call(self, fn: Callable[[], T], pool: ThreadPoolExecutor | None = None) -> T:
        if self._closed:
            raise StoreError("the store is closed")
        return await asyncio.get_running_loop().run_in_executor(pool or self._work, fn)

    async def write(self, program: Callable[[float | None], Program[T]]) -> T:
        run = functools.partial(self.dialect.write, intent="start")
        return await self._call(lambda: run(lambda tx: drive(program(tx.now), tx)))

    async def rows(self, name: str, params: Params) -> list[Row]:
        # every read is given "now", as the sync store's (a run's status reads its leases)
        read = {**params}
        return await self._call(
            lambda: self.dialect.read(lambda tx: tx.rows(name, {**read, "now": tx.now}))
        )

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        if self._changed is None:
            self._changed = asyncio.Condition()
        if self._starting is None:
            self._starting = asyncio.Lock()
        starting = self._starting
        self._waits += 1
        try:
            async with starting:  # waits that begin together start one watcher, not one each
                if self._watcher is None or self._watcher.done():
                    seen = await self._call(self.dialect.change_token, self._watch)  # first look
                    self._watcher = asyncio.create_task(self._watch_changes(seen))
            yield
        finally:
            self._waits -= 1

    async def _watch_changes(self, seen: int) -> None:
        """While a wait runs: read the change token, wake the waits when it moved. Ends
        quietly once no wait runs or the store is closed (``close`` also cancels it)."""
        assert self._changed is not None
        while True:
            await asyncio.sleep(CHANGE_CHECK)
            if self._waits <= 0 or self._closed:
                return
            try:
                now = await self._call(self.dialect.change_token, self._watch)
            except StoreError:
                if self._closed:  # closed during the read
                    return
                raise
            if now != seen:
                seen = now
                async with self._changed:
                    self._token += 1
                    self._changed.notify_all()

    async def watch(self, run_id: int) -> None:
        """Any commit moves SQLite's token: nothing to mark."""

    def token(self, channel: Channel | None = "end") -> int:
        return self._token  # any commit moves it: every channel

    async def wait_change(self, token: int, timeout: float, channel: Channel | None = "end") -> int:
        assert self._changed is not None
        await sleep_on(self._changed, lambda: self._token != token, timeout)
        return self._token

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await stop(self._watcher)
        # each thread's connection goes with its thread (never closed from another one)
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        for pool in (self._work, self._watch):
            pool.shutdown(wait=True)
        self.dialect.close()  # this thread's own connection, if any; the store is closed
