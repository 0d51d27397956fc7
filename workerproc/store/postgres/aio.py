"""The async store on PostgreSQL (``store/aio.py``): psycopg's ``AsyncConnection``.

- A small pool of connections (``POOL``), each opened as the sync store opens its own
  (``PostgresDialect.session``: our schema first on the search path, the same lock and idle
  bounds), one transaction at a time on each. The statements are the backend's catalogue;
  a step that is one statement of another shape (``Shaped``) is sent as that statement.
- A write is ``BEGIN``, the program's statements, ``COMMIT``; a deadlock or serialization
  failure is retried, a connection that failed is never used again.
- Waits share one listening connection: ``LISTEN`` on the schema's end, work and stream
  channels, counters bumped by each notification (and when the connection is lost:
  notifications may have been missed), and a condition the waits sleep on.
- The schema is created or migrated by the sync dialect, once, on a thread (``open``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.pq import TransactionStatus

from ..aio import AsyncBackend, sleep_on, stop
from ..dialect import Channel, Params, Row, Shaped
from ..errors import InvalidPayload, StoreError, StoreUnavailable
from ..protocol.programs import Program
from ..settings import PostgresOptions
from ..starts import in_statements
from ..types import Clock
from .dialect import PostgresDialect
from .ops_sql import SNAPSHOT, WATCH_RUN
from .pooling import POLL
from .sql import END_CHANNEL, NOTIFY_CHANNEL
from .steps import CATALOGUE
from .streams_sql import STREAM_CHANNEL

T = TypeVar("T")
Connection = psycopg.AsyncConnection[Any]
IDLE = TransactionStatus.IDLE
POOL = 8  # connections at most: each runs one transaction at a time
_RETRIES = 5  # deadlocks and serialization failures


class PostgresAsync(AsyncBackend):
    ordered_events = False  # B18: committed events are numbered before a read

    def __init__(self, dialect: PostgresDialect, clock: Clock | None = None) -> None:
        self.dialect = dialect
        self.url = dialect.url
        self._clock = clock
        self._idle: list[Connection] = []
        self._slots = asyncio.Semaphore(POOL)
        self._closed = False
        self._ended = 0  # notifications of watched runs' ends (and lost listeners)
        self._any = 0  # notifications on either channel: work written, a run ended (B18)
        self._streamed = 0  # notifications of streams written (B21): their followers only
        self._changed = asyncio.Condition()
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    @classmethod
    async def open(
        cls, conninfo: str, options: PostgresOptions, clock: Clock | None
    ) -> PostgresAsync:
        dialect = PostgresDialect(conninfo, options, clock=clock)
        try:
            await asyncio.to_thread(_migrate, dialect)  # the sync dialect's, off the loop
        except BaseException:
            dialect.close()
            raise
        return cls(dialect, clock)

    # -- connections -----------------------------------------------------------------------------
    async def _connect(self, conninfo: str | None = None) -> Connection:
        """A connection of the pool (or, given ``conninfo``, the listening one)."""
        try:
            return await psycopg.AsyncConnection.connect(conninfo or self.dialect.conninfo,
                                                         **self.dialect.session())  # fmt: skip
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"{self.dialect.where}: cannot connect: {self.dialect.said(exc)}"
            ) from None
        except psycopg.Error as exc:
            raise StoreError(f"{self.dialect.where}: {self.dialect.said(exc)}") from None

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        if self._closed:
            raise StoreError("the store is closed")
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            healthy = False
            try:
                yield conn
                healthy = not conn.broken and conn.info.transaction_status == IDLE
            finally:
                if healthy and not self._closed:
                    self._idle.append(conn)
                else:
                    await conn.close()

    # -- statements ------------------------------------------------------------------------------
    def _now(self) -> float | None:
        return None if self._clock is None else self._clock()

    @staticmethod
    async def _run(cur: psycopg.AsyncCursor[Any], name: str, params: Params) -> list[Row]:
        entry = CATALOGUE[name]
        if isinstance(entry, Shaped):
            statement, params = entry.statement(""), entry.shape(params)
        elif isinstance(entry, str):
            statement = entry
        else:  # a step of several statements: not one the producers run
            raise StoreError(f"the async store cannot run the step {name}")
        await cur.execute(statement, params, prepare=None)  # (prepared unless pooled: session)
        return [] if cur.description is None else await cur.fetchall()

    async def write(self, program: Callable[[float | None], Program[T]]) -> T:
        for attempt in range(1, _RETRIES + 1):
            try:
                async with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
                    if self.dialect.local:  # behind a pooler: our settings, for this one
                        await cur.execute(self.dialect.local)
                    now = self._now()
                    steps = in_statements(program(now), now)  # (its asks as statements)
                    try:
                        name, params = next(steps)
                        while True:
                            name, params = steps.send(await self._run(cur, name, params))
                    except StopIteration as done:
                        result: T = done.value
                return result
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt >= _RETRIES:
                    raise StoreUnavailable(
                        f"{self.dialect.where}: {self.dialect.said(exc)}"
                    ) from None
                await asyncio.sleep(random.uniform(0.001, 0.01) * attempt)
            except psycopg.Error as exc:
                raise _translated(exc, self.dialect) from None
            except (UnicodeEncodeError, OverflowError) as exc:
                raise InvalidPayload(f"a value cannot be written: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def rows(self, name: str, params: Params) -> list[Row]:
        try:
            async with self._connection() as conn, conn.cursor() as cur:
                # every read is given "now", as the sync store's (a run's status reads its lease)
                given = {**params, "now": self.dialect._now_param()}
                if not self.dialect.local:
                    return await self._run(cur, name, given)
                async with conn.transaction():  # behind a pooler: with our settings
                    await cur.execute(self.dialect.local)
                    return await self._run(cur, name, given)
        except psycopg.Error as exc:
            raise _translated(exc, self.dialect) from None

    # -- waiting ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Listening before the body's first read: a commit between that read and the LISTEN
        would otherwise wait for the poll (a follower's first event came a second late)."""
        if self._listener is None or self._listener.done():
            self._listening.clear()
            self._listener = asyncio.create_task(self._listen())
        await self._listening.wait()  # set once listening, or once that failed (bounded)
        yield

    async def _listen(self) -> None:
        """LISTEN on the end and work channels; each notification bumps the counters (a work
        one only ``_any``, what followers of the events wake on) and wakes the waits. A lost
        connection bumps them too, and the next wait listens anew."""
        channel = END_CHANNEL.format(schema=self.dialect.schema)
        work = NOTIFY_CHANNEL.format(schema=self.dialect.schema)
        streamed = STREAM_CHANNEL.format(schema=self.dialect.schema)
        if self.dialect.listen_at is None:  # behind a pooler, told to poll
            await self._poll()
            return
        try:
            conn = await self._connect(self.dialect.listen_at)
        except StoreError:
            await self._bump(lost=True)
            self._listening.set()  # the waits fall back to their timeouts: they look again
            return
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(work)))
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(streamed)))
            self._listening.set()
            async for note in conn.notifies():
                if note.channel == streamed:
                    await self._bump_stream()
                else:
                    await self._bump(note.channel == channel)
        except psycopg.Error:
            await self._bump(lost=True)
        finally:
            self._listening.set()
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    async def _poll(self) -> None:
        """Without LISTEN: the server's snapshot every ``POLL`` seconds; each change bumps every
        counter (it may be anyone's: a waiter looks and sleeps again), as does a failed look."""
        self._listening.set()
        seen: str | None = None
        while not self._closed:
            try:
                async with self._connection() as conn:
                    row = await (await conn.execute(SNAPSHOT, prepare=False)).fetchone()
                now = None if row is None else str(row[0])
            except (psycopg.Error, StoreError):
                now = None
            if now is None or now != seen:
                await self._bump(lost=True)
            seen = now
            await asyncio.sleep(POLL)

    async def _bump(self, ended: bool = True, *, lost: bool = False) -> None:
        async with self._changed:
            self._ended += ended or lost
            self._any += 1
            self._streamed += lost  # a lost listener: a stream's write may have been missed
            self._changed.notify_all()

    async def _bump_stream(self) -> None:
        async with self._changed:
            self._streamed += 1
            self._changed.notify_all()

    async def watch(self, run_id: int) -> None:
        """Listening first, then the run marked watched, so no end slips between."""
        await self._listening.wait()
        try:
            async with self._connection() as conn, conn.cursor() as cur:
                if not self.dialect.local:
                    await cur.execute(WATCH_RUN, {"run_id": run_id}, prepare=None)
                    return
                async with conn.transaction():
                    await cur.execute(self.dialect.local)
                    await cur.execute(WATCH_RUN, {"run_id": run_id})
        except psycopg.Error as exc:
            raise _translated(exc, self.dialect) from None

    def token(self, channel: Channel | None = "end") -> int:
        if channel == "stream":
            return self._streamed
        return self._ended if channel == "end" else self._any

    async def wait_change(self, token: int, timeout: float, channel: Channel | None = "end") -> int:
        await sleep_on(self._changed, lambda: self.token(channel) != token, min(timeout, 60.0))
        return self.token(channel)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await stop(self._listener)
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(psycopg.Error):
                await conn.close()
        self.dialect.close()


def _migrate(dialect: PostgresDialect) -> None:
    try:
        dialect.migrate()
    finally:
        dialect.close()  # its connection was this thread's: closed here, by this thread


def _translated(exc: psycopg.Error, dialect: PostgresDialect) -> StoreError:
    said, where = dialect.said(exc), dialect.where  # the driver's first line, no secret in it
    if isinstance(exc, psycopg.DataError):  # a value PostgreSQL cannot take (NUL in text)
        return InvalidPayload(f"a value cannot be written: {said}")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreUnavailable(f"{where}: {said}")
    return StoreError(f"{where}: {said}")
