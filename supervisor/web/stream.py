"""``GET /events/stream``: the outbox (docs/protocol.md B18) as Server-Sent Events, what the
pages' live parts update from (``static/dashboard.js``) instead of polling on a timer.

Each event is one message: ``id:`` its id, ``event:`` its kind, ``data:`` its JSON (``id``,
``at``, ``run_id``, ``kind``, ``task``, ``attempt``, ``data``). A stream starts after
``Last-Event-ID`` (what a browser sends when it reconnects), else after ``?after=ID``, else at
the newest event (its first message names that id, so a reconnect resumes from there);
``?run=ID``: that run's events only. It follows the table with the async store's ``follow``
(LISTEN on PostgreSQL, the change token on SQLite) — one follower for every open stream
(``fanout.py``) —, sends a comment every ``KEEPALIVE``
seconds (a proxy or a browser must not take a quiet stream for a dead one), and ends when the
client goes or the server stops (``Streams.stop``: uvicorn waits for every open response
before it exits, so a stream that never ended would hold ``supervisor web`` up on TERM).

A stream holds its connection for as long as it is open, and the connection guard
(``connections.py``) counts it as a busy connection that is never closed to make room. So
streams are bounded apart (``--max-streams`` in all, ``PER_CLIENT_STREAMS`` per client
address), well under the guard's bounds, and one more gets 503: its page polls instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from workerproc.store import AsyncStore, Event, StoreError, open_async_store, redact

from ..loop.storegate import db_file
from .connections import PER_CLIENT
from .fanout import Fanout
from .views import MAX_ID

log = logging.getLogger("supervisor.web")
KEEPALIVE = 15.0  # seconds between two comments on a quiet stream
CHECK = 1.0  # a quiet stream looks this often whether its database file is still there
RETRY_MS = 5000  # what a browser waits before it reconnects a stream that ended
PER_CLIENT_STREAMS = PER_CLIENT // 2  # a client keeps half its connections for requests
BACKLOG = 1000  # events read ahead of a slow client (then the reads wait for it)

Opener = Callable[[], Awaitable[AsyncStore]]


def opener_for(db: str) -> Opener:
    """Open the async store of ``--db`` without creating anything: the command checked that
    the database exists (a PostgreSQL schema is never created by a reader)."""

    async def open_() -> AsyncStore:
        if db_file(db) is not None:
            return await open_async_store(db)
        return await open_async_store(db, migrate=False)

    return open_


class Streams:
    """The open streams of one dashboard: the async store they share (opened by the first),
    how many each client holds, and the stop that ends them all."""

    def __init__(self, opener: Opener, limit: int, per_client: int = PER_CLIENT_STREAMS) -> None:
        self.opener = opener
        self.limit = limit
        self.per_client = min(per_client, limit)
        self.by_client: dict[str, int] = {}
        self._store: AsyncStore | None = None
        self._fanout: Fanout | None = None
        self._stops: set[asyncio.Task[None]] = set()
        self._opening: asyncio.Lock | None = None
        self._stopping = asyncio.Event()
        # why the database can no longer be read (its file deleted or replaced), or None: an
        # open stream ends then, as every page answers 503 (``app.DatabaseWatch``)
        self.gone: Callable[[], str | None] = lambda: None

    @property
    def open(self) -> int:
        return sum(self.by_client.values())

    def stop(self) -> None:
        """End every open stream, and answer no new one (the server is stopping)."""
        self._stopping.set()

    async def close(self) -> None:
        if self._fanout is not None:
            fanout, self._fanout = self._fanout, None
            await fanout.stop()
        for stopping in list(self._stops):  # the followers the last streams left
            with contextlib.suppress(Exception):
                await stopping
        if self._store is not None:
            store, self._store = self._store, None
            with contextlib.suppress(StoreError):
                await store.close()

    async def fanout(self) -> Fanout:
        """The one follower of the table, started (with the store, the first time) if none
        runs: the last stream to leave stops it, a failed one is started again."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        store = await self.store()
        async with self._opening:
            if self._fanout is None or not self._fanout.running:
                self._fanout = await Fanout.start(store)
            self._fanout.users += 1
            return self._fanout

    async def store(self) -> AsyncStore:
        """The async store the streams share (opened by the first one that needs it)."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._store is None:
                self._store = await self.opener()
            return self._store

    @property
    def stopping(self) -> asyncio.Event:
        """Set when the server stops: every open stream ends."""
        return self._stopping

    def refusal(self, client: str) -> Response | None:
        """Why one more stream of ``client`` is refused now (a 503), or None: it may open."""
        return self._refusal(client)

    def left(self, client: str) -> None:
        """A stream of ``client`` that ``fanout`` does not serve (a run's) ended."""
        held = self.by_client.get(client, 0) - 1
        if held > 0:
            self.by_client[client] = held
        else:
            self.by_client.pop(client, None)

    def _unsubscribe(self, fanout: Fanout) -> None:
        fanout.users -= 1
        if fanout.users == 0:  # no stream left: nobody follows the table
            if self._fanout is fanout:
                self._fanout = None
            stopping = asyncio.get_running_loop().create_task(fanout.stop())
            self._stops.add(stopping)  # (the loop keeps only a weak reference to a task)
            stopping.add_done_callback(self._stops.discard)

    def _refusal(self, client: str) -> Response | None:
        if self._stopping.is_set():
            why = "the dashboard is stopping"
        elif self.open >= self.limit:
            why = f"{self.limit} event streams are open (--max-streams)"
        elif self.by_client.get(client, 0) >= self.per_client:
            why = f"this client holds {self.per_client} event streams already"
        else:
            return None
        return PlainTextResponse(f"503: {why}: poll the pages instead\n", status_code=503,
                                 headers={"Retry-After": "30"})  # fmt: skip

    async def endpoint(self, request: Request) -> Response:
        after = position(request.headers.get("last-event-id"), "Last-Event-ID")
        if after is None:
            after = position(request.query_params.get("after"), "after")
        run = position(request.query_params.get("run"), "run")
        system = request.query_params.get("all") == "1"  # the system's runs' events too (B20)
        client = request.client.host if request.client else "?"
        refused = self._refusal(client)
        if refused is not None:
            return refused
        fanout = await self.fanout()
        start = after if after is not None else fanout.cursor
        refused = self._refusal(client)  # (the reads above let others in meanwhile)
        if refused is not None:
            self._unsubscribe(fanout)
            return refused
        self.by_client[client] = self.by_client.get(client, 0) + 1
        return EventStream(self._messages(fanout, start, run, system),
                           lambda: self._left(client, fanout))  # fmt: skip

    def _left(self, client: str, fanout: Fanout) -> None:
        self._unsubscribe(fanout)
        self.left(client)

    async def _messages(
        self, fanout: Fanout, after: int, run: int | None, system: bool = False
    ) -> AsyncGenerator[str]:
        queue: asyncio.Queue[Event] = asyncio.Queue(BACKLOG)

        async def pump() -> None:
            async for event in fanout.follow(after, run, system):
                await queue.put(event)

        reading = asyncio.create_task(pump())
        stopping = asyncio.create_task(self._stopping.wait())
        taking: asyncio.Task[Event] | None = None
        quiet = 0.0  # seconds since the last message
        try:
            yield f"retry: {RETRY_MS}\nid: {after}\n\n"  # a reconnect resumes from here
            while True:
                if taking is None:
                    taking = asyncio.create_task(queue.get())
                done, _ = await asyncio.wait(
                    {taking, reading, stopping}, timeout=CHECK,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                gone = self.gone()
                if gone is not None:
                    log.warning("an event stream ended: %s", gone)
                    return
                if taking in done:
                    chunk = [message(taking.result())]
                    while not queue.empty():
                        chunk.append(message(queue.get_nowait()))
                    taking = None
                    quiet = 0.0
                    yield "".join(chunk)
                elif stopping in done:
                    return
                elif reading in done:
                    problem = reading.exception()
                    log.warning("an event stream ended: %s", redact(str(problem)))
                    return
                elif (quiet := quiet + CHECK) >= KEEPALIVE:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
        finally:
            for task in (reading, stopping, taking):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response that gives its slot back however it ends (sent, the
    client gone, cancelled before its first message)."""

    def __init__(self, messages: AsyncGenerator[str], release: Callable[[], None]) -> None:
        super().__init__(messages, media_type="text/event-stream",
                         headers={"X-Accel-Buffering": "no"})  # fmt: skip
        self.messages = messages
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
            # a client gone while a message was being sent leaves the generator at its yield:
            # close it now (its follow with it), not whenever it is collected
            with contextlib.suppress(Exception):
                await self.messages.aclose()


def message(event: Event) -> str:
    doc = {"id": event.id, "at": event.at, "run_id": event.run_id, "kind": event.kind,
           "task": event.task, "attempt": event.attempt, "data": event.data}  # fmt: skip
    return f"id: {event.id}\nevent: {event.kind}\ndata: {json.dumps(doc, sort_keys=True)}\n\n"


def position(text: str | None, what: str) -> int | None:
    """An event or run id given by the client (ASCII digits, at most ``MAX_ID``), or None."""
    if text is None or text == "":
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or int(text) > MAX_ID:
        raise HTTPException(400, f"{what} must be an id: digits (got {text[:40]!r})")
    return int(text)
