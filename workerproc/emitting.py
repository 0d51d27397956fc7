"""The handler's stream (B21): ``ctx.emit``, ``ctx.emit_async``, ``ctx.flush``,
``ctx.flush_async``, ``ctx.emitted`` and ``ctx.emitted_text``, a part of ``TaskContext``
(``context.py``) on their own. ``streaming.py`` has the buffer and the writer."""

from __future__ import annotations

from typing import NoReturn

from .store import InvalidPayload, Lease
from .store.protocol.streams import chunk_text
from .store.streams import MAX_STREAM
from .store.types import JSON
from .streaming import PENDING, Emitter, Streamer, StreamRefused


class StreamFull(InvalidPayload):
    """The run's stream holds ``MAX_STREAM`` bytes already (every step's, every attempt's): the
    chunk was not written. A retry of the step cannot fix it: stop emitting, or emit less."""


class Streaming:
    """``ctx.emit`` and its kin; ``TaskContext`` provides the lease and its checks."""

    _lease: Lease
    _streams: Streamer | None
    _emitter: Emitter | None
    _mine: list[str]  # what this execution emitted as text, for ``emitted_text``
    _before: list[JSON] | None  # ``emitted``, read once

    def raise_if_lost(self) -> None: ...
    def _lost_now(self, over: bool) -> NoReturn:
        raise NotImplementedError

    def emit(self, chunk: JSON) -> None:
        """Add ``chunk`` (JSON: a model's token, say) to the run's stream, where readers see it
        within about 50 ms (``store.stream``, ``follow_stream``, ``supervisor stream``, the
        dashboard). Written under this attempt's lease: once the lease is lost, this raises
        ``LeaseLost`` (the store refused a batch, or the worker learned it); a chunk over
        64 KiB of JSON raises ``InvalidPayload``, a run's stream past 16 MiB ``StreamFull``."""
        self.raise_if_lost()
        text = chunk_text(chunk)  # InvalidPayload: not JSON, or over MAX_CHUNK
        try:
            (self._emitter or self._stream()).add(text)
        except StreamRefused as refused:
            self._refused(refused)
        if isinstance(chunk, str):  # (``_kept``, inline: a token a few microseconds apart)
            self._mine.append(chunk)

    async def emit_async(self, chunk: JSON) -> None:
        """``emit`` for ``async def`` handlers: never blocks the event loop (a handler that
        emits faster than the database takes waits here, off the loop)."""
        import asyncio  # noqa: PLC0415 - a worker of plain handlers never loads it

        text = self._checked(chunk)
        emitter = self._stream()
        try:
            if len(emitter.waiting) + 1 >= PENDING:
                await asyncio.to_thread(emitter.add, text)
            else:
                emitter.add(text)  # (never waits below the bound: only appends)
        except StreamRefused as refused:
            self._refused(refused)
        self._kept(chunk)

    def flush(self) -> None:
        """Write what was emitted now, and wait until it is written: readers can see it."""
        self.raise_if_lost()
        if self._emitter is None:
            return
        try:
            self._emitter.flush()
        except StreamRefused as refused:
            self._refused(refused)

    async def flush_async(self) -> None:
        """``flush`` for ``async def`` handlers, off the loop."""
        import asyncio  # noqa: PLC0415 - as in emit_async

        self.raise_if_lost()
        if self._emitter is None:
            return
        try:
            await asyncio.to_thread(self._emitter.flush)
        except StreamRefused as refused:
            self._refused(refused)

    @property
    def emitted(self) -> list[JSON]:
        """What this step's earlier attempt emitted before it lost its lease (its newest
        attempt that emitted; empty on a first attempt), so this one can go on from there
        instead of producing it again: its chunks are not part of the final stream (a
        ``reset`` went before this attempt's), so emit again what you keep. Read once, from
        the database (a short read: in an async handler, read it once at the start)."""
        self.raise_if_lost()
        if self._before is None:
            if self._streams is None:
                raise RuntimeError("ctx.emitted needs a worker's store (this context has none)")
            self._before = self._streams.store().emitted(self._lease)
        return list(self._before)

    def emitted_text(self) -> str:
        """What this execution emitted, its text chunks joined (other chunks left out): the
        answer a streamed model produced, say, for the step's commit."""
        return "".join(self._mine)

    def _checked(self, chunk: JSON) -> str:
        self.raise_if_lost()
        return chunk_text(chunk)  # InvalidPayload: not JSON, or over MAX_CHUNK

    def _stream(self) -> Emitter:
        if self._emitter is None:
            if self._streams is None:
                raise RuntimeError("ctx.emit needs a worker's store (this context has none)")
            self._emitter = self._streams.emitter(self._lease)
        return self._emitter

    def _kept(self, chunk: JSON) -> None:
        if isinstance(chunk, str):
            self._mine.append(chunk)

    def _refused(self, refused: StreamRefused) -> NoReturn:
        if refused.why == "full":
            raise StreamFull(f"run {self._lease.run_id}'s stream is full: {MAX_STREAM:,} bytes "
                             "of chunks at most") from None  # fmt: skip
        self._lost_now(over=refused.why == "over")

    def _stream_done(self) -> None:
        """The handler returned: write what it emitted and wait (bounded), before its commit
        is written, so the run's stream is whole when the run ends; ``LeaseLost``,
        ``RunCancelled``, ``StreamFull`` or ``StoreError`` when it could not be."""
        if self._emitter is None:
            return
        try:
            self._emitter.flush()
        except StreamRefused as refused:
            self._refused(refused)

    def _stream_closed(self) -> None:
        """The execution ended, however: its emitter goes once what waits is written."""
        if self._emitter is not None and self._streams is not None:
            self._streams.detach(self._emitter)
