"""What a run's stream is (docs/protocol.md B21), on every backend: its chunks (``Chunk``), what
a write of a batch of them answered (``Appended``), and their bounds; the protocol is
``protocol/streams.py``.

A stream is a run's partial output, written by its steps' handlers as they produce it
(``ctx.emit``), read by anyone while the run goes on (``store.stream``, ``follow_stream``,
``supervisor stream``, the dashboard). Every chunk has an ``offset`` (1, 2, 3, ... per run, no
gap), the ``step`` (task id) and ``attempt`` that wrote it, a ``kind`` and its JSON ``data``:

- ``data``: what the handler emitted;
- ``reset``: a new attempt of the step that wrote last begins to write (its earlier attempt
  lost its lease): what that attempt wrote is void, the new attempt's chunks follow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from .codec import MAX_PAYLOAD
from .records import record
from .types import JSON, Lease

MAX_CHUNK = 64 * 1024  # the bytes of one chunk's JSON at most
MAX_STREAM = 16 * 1024 * 1024  # the bytes of a run's chunks (every step, every attempt) at most
MAX_READ = 10_000  # chunks one read returns at most
MAX_BATCH = 1024  # chunks one write takes at most
assert MAX_CHUNK <= MAX_PAYLOAD

ChunkKind = Literal["data", "reset"]
# one batch of chunks a worker's exchange writes (``commit_many``'s ``streams``): the lease of
# the attempt that emitted them, their JSON texts, and the offset its previous batch ended at
StreamBatch = tuple[Lease, Sequence[str], int | None]
KINDS: tuple[ChunkKind, ...] = ("data", "reset")


@record
class Chunk:
    """One chunk of a run's stream: its ``offset`` (from 1, no gaps), the ``attempt`` and the
    ``step`` (the task id) that wrote it, its ``kind`` (``data`` or ``reset``), its JSON
    ``data`` (None for a reset) and when it was written (``at``, seconds since the epoch)."""

    offset: int
    attempt: int
    step: int
    kind: ChunkKind
    data: JSON
    at: float

    def as_json(self) -> dict[str, JSON]:
        """The chunk as a JSON object (``supervisor stream --json``, the SSE messages)."""
        return {"offset": self.offset, "attempt": self.attempt, "step": self.step,
                "kind": self.kind, "data": self.data, "at": self.at}  # fmt: skip


@record
class Appended:
    """What a write of chunks answered: ``written`` (``last``: the offset of the last one;
    ``reset``: a reset chunk went first), ``lost`` (this attempt no longer holds a live
    lease: nothing written, the refusal recorded), ``over`` (the lease is live but its run is
    over: cancelled) or ``full`` (the run's stream would pass ``MAX_STREAM``: nothing
    written)."""

    outcome: Literal["written", "lost", "over", "full"]
    last: int = 0
    reset: bool = False


def last_attempt(chunks: list[tuple[int, str, JSON]]) -> list[JSON]:
    """Of a step's chunks (attempt, kind, data) in offset order: the data of its newest
    attempt that wrote (what that attempt emitted: everything after the step's last reset)."""
    if not chunks:
        return []
    newest = max(attempt for attempt, _, _ in chunks)
    return [data for attempt, kind, data in chunks if attempt == newest and kind == "data"]


def step_texts(chunks: list[Chunk]) -> dict[int, str]:
    """What a reader shows of ``chunks`` (in offset order): each step's text as it stands, a
    reset clearing what that step showed before it; a chunk that is not text is shown as its
    JSON on a line of its own."""
    texts: dict[int, list[str]] = {}
    for c in chunks:
        if c.kind == "reset":
            texts[c.step] = []
            continue
        part = c.data if isinstance(c.data, str) else json.dumps(c.data, sort_keys=True) + "\n"
        texts.setdefault(c.step, []).append(part)
    return {step: "".join(parts) for step, parts in texts.items()}
