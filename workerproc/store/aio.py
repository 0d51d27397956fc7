"""The async producer API, for FastAPI, aiohttp and any other event loop: ``await``able
``start_run``, ``start_runs``, ``wait`` and ``get_run`` that never block the loop.

A thin layer over the protocol: every value is checked and encoded by the same ``NewRun``, a
start runs the same program (``protocol.producers.inserting``: the driver's ``start_runs``), a
wait the same steps (``protocol.reads.waiting``), rows are decoded by the same ``run_of``, and
the statements are the backend's own catalogue. Only the transport differs, per backend
(``AsyncBackend``):

- PostgreSQL (``postgres/aio.py``): psycopg's ``AsyncConnection``, a small pool of them, and
  one listening connection whose notifications wake the waits.
- SQLite (``sqlite/aio.py``): the sync dialect on threads of the store's own, one connection
  per thread (a connection never crosses threads), and one thread that watches the change
  token while something waits.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from .asks import EventRow
from .dialect import Channel, Params, Row
from .errors import RunNotFound, StoreError
from .newrun import NewRun
from .protocol.events import (
    DEFAULT_POLL,
    acking,
    check_consumer,
    check_position,
    event_of,
    reading,
    sequencing,
)
from .protocol.forks import fork_args, forking, ungated
from .protocol.producers import inserting
from .protocol.programs import Operation, Program
from .protocol.reads import run_of, waiting
from .protocol.streams import chunks_of, reading_stream, stream_status
from .protocol.waits import sending, signal_ask
from .settings import SQLiteOptions, StoreOptions, resolve
from .streams import Chunk
from .traceparent import current_traceparent
from .types import DEFAULT_QUEUE, JSON, TERMINAL_STATUSES, Clock, Event, Run

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")


async def sleep_on(changed: asyncio.Condition, moved: Callable[[], bool], timeout: float) -> None:
    """Wait on ``changed`` until ``moved()`` holds or ``timeout`` seconds pass (no error).

    Bounded by ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 a cancellation
    that arrives as the wait completes is swallowed by ``wait_for``, and a follower cancelled
    while the change watch woke it would go on following instead of ending."""
    import asyncio  # noqa: PLC0415 - a worker of plain handlers never imports asyncio

    async with changed:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await changed.wait_for(moved)


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a backend's background task and wait for it to end, whatever it raised."""
    import asyncio  # noqa: PLC0415 - a worker of plain handlers never imports asyncio

    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


class AsyncBackend(abc.ABC):
    """One engine under the async store: transactions that run a program, reads, the change
    token of run ends and sleeping on it."""

    url: str
    ordered_events: bool = True  # ``Dialect.ordered_events``: False, events are numbered first

    @abc.abstractmethod
    async def write(self, program: Callable[[float | None], Program[T]]) -> T:
        """Run the program ``program(now)`` makes in one write transaction; its answer."""

    @abc.abstractmethod
    async def rows(self, name: str, params: Params) -> list[Row]:
        """One catalogue statement's rows, outside a transaction (a read)."""

    @abc.abstractmethod
    def watching(self) -> contextlib.AbstractAsyncContextManager[None]:
        """While a wait runs: what moves the token (a listener, a poller) is kept up."""

    @abc.abstractmethod
    async def watch(self, run_id: int) -> None:
        """From now on, the run's end moves the token."""

    @abc.abstractmethod
    def token(self, channel: Channel | None = "end") -> int:
        """A number that changes when a watched run ends (or anything else commits); with
        ``channel`` None, also when work is written (what a follower of the events wakes on)."""

    @abc.abstractmethod
    async def wait_change(self, token: int, timeout: float, channel: Channel | None = "end") -> int:
        """Sleep until the token differs from ``token`` or ``timeout`` passes; the token."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class AsyncStore:
    """The producer side of the store, awaitable (``open_async_store``): start runs, read one,
    wait for one to end. The same checks, keys and answers as ``Store``'s methods of the same
    names; ``async with`` closes it."""

    def __init__(self, backend: AsyncBackend) -> None:
        self.backend = backend
        self.url = backend.url

    async def start_run(
        self,
        task: str,
        payload: JSON = None,
        state: JSON = None,
        delay: float = 0,
        *,
        key: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        traceparent: str | None = None,
        debounce: float | None = None,
        version: int | None = None,
    ) -> int:
        """Start a run whose first task is ``task`` (``Store.start_run``): its id. ``key``
        makes it idempotent: while a run with that key exists, its id is the answer;
        ``debounce``: a burst of starts with one key makes one run, as ``Store.start_run``."""
        new = NewRun.make(task, payload, state, delay, key, queue, priority, traceparent,
                          debounce=debounce, version=version)  # fmt: skip
        (run_id,) = await self._start([new])
        return run_id

    async def start_runs(self, items: Iterable[Mapping[str, Any]]) -> list[int]:
        """Start many runs in one transaction (``Store.start_runs``): their ids, in order."""
        return await self._start([NewRun.from_item(item) for item in items])

    async def _start(self, runs: list[NewRun]) -> list[int]:
        if not runs:
            return []
        return await self.backend.write(lambda now: inserting(runs))

    async def fork(self, run_id: int, from_step: int, state: JSON = None) -> int:
        """Start a new run from step ``from_step`` of run ``run_id`` (``Store.fork``): its id.
        The source is left as it is; its state at that step (or ``state``) is the new run's."""
        run, step, text = fork_args(run_id, from_step, state)
        traceparent = current_traceparent()
        return await self.backend.write(
            lambda now: forking(run, step, text, traceparent, ungated, now)
        )

    async def signal(self, run_id: int, name: str, payload: JSON = None) -> int:
        """Send signal ``name`` to run ``run_id`` (``Store.signal``): its id. ``RunNotFound``
        for an unknown run, ``RunOver`` for a finished one."""
        ask = signal_ask(run_id, name, payload)
        return await self.backend.write(lambda now: sending(ask, now))

    async def get_run(self, run_id: int) -> Run | None:
        """The run, or None."""
        rows = await self.backend.rows("GET_RUN", {"run_id": run_id})
        return run_of(rows[0]) if rows else None

    async def wait(self, run_id: int, timeout: float | None = None) -> Run:
        """Until the run is succeeded, failed or cancelled: the run (``Store.wait``);
        TimeoutError after ``timeout`` seconds, RunNotFound for a run that does not exist.
        Sleeps on notifications (PostgreSQL) or the change token (SQLite), never spins."""
        steps = waiting(run_id, timeout)
        async with self.backend.watching():
            answer: Any = None
            try:
                while True:
                    answer = await self._do(steps.send(answer))
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    async def _do(self, op: Operation) -> Any:
        kind = op[0]
        if kind == "run":
            run = await self.get_run(op[1])
            if run is None:
                raise RunNotFound(op[1])
            return run
        if kind == "watch":
            return await self.backend.watch(op[1])
        if kind == "token":
            return self.backend.token()
        return await self.backend.wait_change(op[1], op[2])

    # -- the outbox (B18): ``Store.events`` and its kin, awaitable ------------------------------
    async def events(
        self, after: int | None = None, limit: int = 500, *, consumer: str | None = None,
        run: int | None = None, system: bool = False,
    ) -> list[Event]:  # fmt: skip
        """``Store.events``: up to ``limit`` events after ``after`` (or ``consumer``'s
        acknowledged position), in commit order; the system's runs' only with ``system``."""
        if consumer is not None and after is None:
            after = await self.consumer_position(consumer)
        ask = reading(0 if after is None else after, limit, run, system)
        if not self.backend.ordered_events:
            await self.backend.write(lambda now: sequencing())
        rows = await self.backend.rows(*ask.statement())  # (``read_events``, outside a write)
        return [event_of(EventRow._make(row[:7])) for row in rows]

    async def last_event_id(self) -> int:
        """``Store.last_event_id``: the newest committed event's id (0: none yet)."""
        if not self.backend.ordered_events:
            await self.backend.write(lambda now: sequencing())
        rows = await self.backend.rows("LAST_EVENT", {})
        return int(rows[0][0]) if rows else 0

    async def consumer_position(self, consumer: str) -> int:
        """``Store.consumer_position``: the last event id ``consumer`` acknowledged."""
        rows = await self.backend.rows("CONSUMER_AT", {"name": check_consumer(consumer)})
        return int(rows[0][0]) if rows else await self.ack_events(consumer, 0)

    async def ack_events(self, consumer: str, upto: int) -> int:
        """``Store.ack_events``: ``consumer`` handled every event up to ``upto``."""
        check_consumer(consumer), check_position(upto, "upto")  # (before any round trip)
        ordered = self.backend.ordered_events
        return await self.backend.write(lambda now: acking(consumer, upto, ordered, now))

    async def follow(
        self, after: int | None = None, *, consumer: str | None = None, run: int | None = None,
        limit: int = 500, poll: float = DEFAULT_POLL, system: bool = False,
    ) -> AsyncIterator[Event]:  # fmt: skip
        """``Store.follow``: every event after ``after`` (or ``consumer``'s position), then
        each new one as it commits, for ever. Sleeps on notifications (PostgreSQL: LISTEN)
        or the change token (SQLite) between reads, ``poll`` seconds at most; never spins."""
        if after is None and consumer is not None:
            cursor = await self.consumer_position(consumer)
        else:
            cursor = after or 0
        async with self.backend.watching():
            while True:
                token = self.backend.token(None)
                batch = await self.events(cursor, limit, run=run, system=system)
                for event in batch:
                    yield event
                if batch:
                    cursor = batch[-1].id
                if len(batch) < limit:
                    await self.backend.wait_change(token, poll, None)

    # -- runs' streams (B21): ``Store.stream``, and following one -------------------------------
    async def stream(self, run_id: int, after: int = 0, limit: int = 1000) -> list[Chunk]:
        """``Store.stream``: up to ``limit`` of the run's chunks after offset ``after``."""
        name, params = reading_stream(run_id, after, limit)
        return chunks_of(await self.backend.rows(name, params), params)

    async def follow_stream(
        self, run_id: int, after: int = 0, *, limit: int = 1000, poll: float = DEFAULT_POLL
    ) -> AsyncIterator[Chunk]:
        """Every chunk of the run's stream after offset ``after``, then each new one as it is
        written, until the run is over and every chunk was given (``RunNotFound``: no such
        run). Sleeps on notifications (PostgreSQL: LISTEN on the stream channel) or the change
        token (SQLite) between reads, ``poll`` seconds at most; never spins."""
        cursor = max(0, int(after))
        async with self.backend.watching():
            while True:
                token = self.backend.token("stream")
                status = await self.backend.rows(*stream_status(run_id))
                if not status:
                    raise RunNotFound(run_id)
                batch = await self.stream(run_id, cursor, limit)
                for chunk in batch:
                    yield chunk
                if batch:
                    cursor = batch[-1].offset
                if len(batch) < limit:
                    if status[0][0] in TERMINAL_STATUSES:  # read before the chunks: all given
                        return
                    await self.backend.wait_change(token, poll, "stream")

    async def close(self) -> None:
        """Close this store's connections; ``async with`` does it on leaving."""
        await self.backend.close()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_async_store(
    url_or_path: str, *, clock: Clock | None = None, **options: Unpack[StoreOptions]
) -> AsyncStore:
    """Open the async store of ``url_or_path`` (what ``open_store`` takes: a file path,
    ``sqlite:///…`` or ``postgresql://…``, the same options), creating or migrating the schema
    first, without blocking the loop."""
    target = resolve(url_or_path, **options)
    backend: AsyncBackend
    if isinstance(target.options, SQLiteOptions):
        from .sqlite.aio import SQLiteAsync  # noqa: PLC0415 - one backend per store

        backend = await SQLiteAsync.open(target.where, target.options, clock)
    else:
        try:
            from .postgres.aio import PostgresAsync  # noqa: PLC0415 - an optional extra
        except ImportError as exc:
            raise StoreError(
                f"PostgreSQL needs psycopg 3: pip install 'leasekeeper[postgres]' ({exc})"
            ) from None
        backend = await PostgresAsync.open(target.where, target.options, clock)
    return AsyncStore(backend)
