"""``GET /runs/{id}/stream``: a run's stream (docs/protocol.md B21) as Server-Sent Events, what
the run page shows live (``static/runstream.js``), behind the dashboard's guard like every page.

Each chunk is one message: ``id:`` its offset, ``event:`` its kind (``data`` or ``reset``),
``data:`` the chunk as JSON (``offset``, ``attempt``, ``step``, ``kind``, ``data``, ``at``).
A stream starts after ``Last-Event-ID`` (what a browser sends when it reconnects), else after
``?after=N``, else at the first chunk; it follows the run with the async store's
``follow_stream`` (LISTEN on PostgreSQL, the change token on SQLite) and ends with one ``end``
message (``data:`` the run's status) once the run is over and every chunk was sent: the page
closes its ``EventSource`` then (else it would reconnect, and get the ``end`` again at once).

It is bounded like the event streams (``stream.py``: the same ``--max-streams`` in all and per
client, the same 503 beyond), sends a comment every ``KEEPALIVE`` seconds, and ends when the
client goes, the database file goes, or the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from workerproc.store import AsyncStore, RunNotFound, StoreError, redact
from workerproc.store.streams import Chunk

from .stream import CHECK, KEEPALIVE, RETRY_MS, EventStream, Streams, position
from .views import MAX_ID

log = logging.getLogger("supervisor.web")
BACKLOG = 1000  # chunks read ahead of a slow client (then the reads wait for it)
_END = object()  # the follow ended: the run is over


class RunStreams:
    """The run pages' streams, counted with the dashboard's other streams (``Streams``)."""

    def __init__(self, streams: Streams) -> None:
        self.streams = streams

    async def endpoint(self, request: Request) -> Response:
        run_id = int(request.path_params["run_id"])
        if run_id > MAX_ID:
            raise HTTPException(404, f"no run {run_id}")
        after = position(request.headers.get("last-event-id"), "Last-Event-ID")
        if after is None:
            after = position(request.query_params.get("after"), "after")
        s = self.streams
        client = request.client.host if request.client else "?"
        if (refused := s.refusal(client)) is not None:
            return refused
        store = await s.store()
        if await store.get_run(run_id) is None:
            raise HTTPException(404, f"no run {run_id}")
        if (refused := s.refusal(client)) is not None:  # (the reads let others in meanwhile)
            return refused
        s.by_client[client] = s.by_client.get(client, 0) + 1
        return EventStream(self._messages(store, run_id, after or 0),
                           lambda: s.left(client))  # fmt: skip

    async def _messages(
        self, store: AsyncStore, run_id: int, after: int
    ) -> AsyncGenerator[str]:  # fmt: skip
        queue: asyncio.Queue[Chunk | object] = asyncio.Queue(BACKLOG)

        async def pump() -> None:
            async for chunk in store.follow_stream(run_id, after):
                await queue.put(chunk)
            await queue.put(_END)

        reading = asyncio.create_task(pump())
        stopping = asyncio.create_task(self.streams.stopping.wait())
        taking: asyncio.Task[Chunk | object] | None = None
        quiet = 0.0  # seconds since the last message
        try:
            yield f"retry: {RETRY_MS}\n\n"
            while True:
                if taking is None:
                    taking = asyncio.create_task(queue.get())
                done, _ = await asyncio.wait(
                    {taking, reading, stopping}, timeout=CHECK,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                gone = self.streams.gone()
                if gone is not None:
                    log.warning("a run's stream ended: %s", gone)
                    return
                if taking in done:
                    batch = [taking.result()]
                    while not queue.empty():
                        batch.append(queue.get_nowait())
                    taking, quiet = None, 0.0
                    text = "".join(message(c) for c in batch if isinstance(c, Chunk))
                    if batch[-1] is _END:
                        run = await store.get_run(run_id)
                        status = run.status if run is not None else "pruned"
                        yield f"{text}event: end\ndata: {json.dumps(status)}\n\n"
                        return
                    yield text
                elif stopping in done:
                    return
                elif reading in done:
                    problem = reading.exception()
                    if not isinstance(problem, RunNotFound):
                        log.warning("a run's stream ended: %s", redact(str(problem)))
                    return
                elif (quiet := quiet + CHECK) >= KEEPALIVE:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
        finally:
            for task in (reading, stopping, taking):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StoreError, Exception):
                        await task


def message(chunk: Chunk) -> str:
    doc = json.dumps(chunk.as_json(), sort_keys=True)
    return f"id: {chunk.offset}\nevent: {chunk.kind}\ndata: {doc}\n\n"
