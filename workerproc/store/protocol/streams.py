"""Runs' streams (docs/protocol.md B21), written once: a step's handler emits chunks of its
output as it produces them (``ctx.emit``); the worker writes them in batches, each batch in its
own small transaction, under the attempt's fence; anyone reads them while the run goes on.

- ``append_stream``: one batch of ``lease``'s attempt. The run's stream head is taken first
  (locked, on PostgreSQL), then the fence (R2) asked: a batch is written only while this
  attempt holds the live lease of its step on a live run, and never after a newer attempt of
  the same step wrote. A refused batch is recorded as evidence (``INSERT_REJECTION``, op
  ``emit``) like a refused commit; the handler learns ``LeaseLost`` at its next emit. The first
  batch of a new attempt of the step that wrote last begins with a ``reset`` chunk: readers
  see the takeover, never a silent splice.
- ``stream``: a run's chunks after an offset, in order (offsets from 1, no gaps: a batch's
  offsets are given out under the head, and a reader sees a batch only once it committed,
  after every batch before it).
- ``emitted``: what the step's earlier attempts wrote (its newest one's data), for a handler
  that resumes instead of starting over (``ctx.emitted``).
- ``drop_expired_streams``: the streams of succeeded runs that outlived their task's
  ``stream_ttl``. Every stream also goes with its run (``prune``).
"""

from __future__ import annotations

from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _ascii

from ..codec import dumps, loads
from ..dialect import Dialect, Params, Row, Tx
from ..errors import InvalidPayload
from ..streams import MAX_BATCH, MAX_CHUNK, MAX_READ, MAX_STREAM, Appended, Chunk, ChunkKind
from ..streams import last_attempt as _last_attempt
from ..types import JSON, Lease
from .commits import fence, rejected

ALIVE = ("pending", "running")


def chunk_text(data: JSON) -> str:
    """One chunk's JSON, within ``MAX_CHUNK`` bytes, or ``InvalidPayload`` naming the limit."""
    if type(data) is str:  # a model's token, the common chunk: the encoder's own text for a str,
        text = _ascii(data)  # ASCII (characters are bytes), without the encoder's checks around it
        if len(text) > MAX_CHUNK:
            raise InvalidPayload(f"a stream chunk is {len(text):,} bytes of JSON, over the limit "
                                 f"of {MAX_CHUNK:,}")  # fmt: skip
        return text
    text = dumps(data, "a stream chunk", MAX_CHUNK)
    # characters were counted; bytes are what is kept (the same for ASCII: no encoding)
    if not text.isascii() and len(text.encode()) > MAX_CHUNK:
        raise InvalidPayload(f"a stream chunk is over the limit of {MAX_CHUNK:,} bytes of JSON")
    return text


def check_batch(texts: Sequence[str]) -> None:
    """A batch's size, checked before its transaction begins."""
    if not 1 <= len(texts) <= MAX_BATCH:
        raise InvalidPayload(f"a stream write takes 1 to {MAX_BATCH} chunks")


def batch_text(texts: Sequence[str], reset: bool) -> str:
    """A batch's row: its chunks as one JSON array of [kind, data], a reset first if it has
    one (``texts``: each chunk's JSON, checked by ``chunk_text``)."""
    head = '[["reset",null],["data",' if reset else '[["data",'
    return head + '],["data",'.join(texts) + "]]"


def text_bytes(texts: Sequence[str]) -> int:
    """The bytes of ``texts`` (chunks' JSON) in UTF-8: one join, no encoding if ASCII."""
    joined = "".join(texts)
    return len(joined) if joined.isascii() else len(joined.encode())


def append_in(
    tx: Tx, lease: Lease, texts: Sequence[str], after: int | None, *, lazy: bool
) -> Appended:
    """One batch of ``lease``'s attempt, written in ``tx`` (``append_stream``'s own small
    transaction, or a worker's exchange: ``commit_many``'s ``streams``): see the module's
    docstring. ``lazy``: the transaction is the batch's own, whose commit need not wait for
    the disk (PostgreSQL); an exchange's commit waits, as it always does."""
    size = text_bytes(texts)
    params = fence(lease, tx.now)
    # the head locked, then the fence asked after the lock (one round trip on PostgreSQL)
    heads, fenced = tx.rows_each([("STREAM_HEAD", params), ("STREAM_FENCE", params)])
    head = heads[0] if heads else None
    status = fenced[0] if fenced else None
    if status is None or head is None:  # (no head: no run, so no lease either)
        rejected(tx, lease, "emit")
        return Appended("lost")
    last, task_id, attempt, used = (int(v) for v in head)
    if task_id == lease.task_id and attempt > lease.attempt:
        rejected(tx, lease, "emit")  # a newer attempt wrote already
        return Appended("lost")
    if str(status[0]) not in ALIVE:
        return Appended("over")
    mine = task_id == lease.task_id and attempt == lease.attempt
    if mine and last > 0 and last != after:  # this batch landed already: a retry
        return Appended("written", last)
    if used + size > MAX_STREAM:
        return Appended("full")
    reset = last > 0 and task_id == lease.task_id and attempt != lease.attempt
    end = last + len(texts) + reset
    # the batch and the head moved past it: one statement on PostgreSQL, two on SQLite, sent
    # with the COMMIT (the head is locked until then; nothing of the transaction reads them)
    moved = {**params, "first": last + 1, "last": end, "bytes": size,
             "chunks": batch_text(texts, reset)}  # fmt: skip
    tx.deferred.append(("STREAM_MOVE" if lazy else "STREAM_MOVED", [moved]))
    return Appended("written", end, reset)


class Streams:
    dialect: Dialect

    def append_stream(
        self, lease: Lease, texts: Sequence[str], *, after: int | None = None
    ) -> Appended:
        """Write ``texts`` (chunks' JSON, each checked by ``chunk_text``) to the run's stream as
        ``lease``'s attempt, in one transaction: see the module's docstring. ``after``: the
        offset this attempt's previous batch ended at (None: this is its first), so a batch
        tried again after a write that landed without its answer is found written (its answer
        again), never written twice."""
        check_batch(texts)
        return self.dialect.write(lambda tx: append_in(tx, lease, texts, after, lazy=True))

    def stream(self, run_id: int, after: int = 0, limit: int = 1000) -> list[Chunk]:
        """Up to ``limit`` (at most ``MAX_READ``) of run ``run_id``'s chunks after offset
        ``after``, in offset order (empty: none yet, or no such run)."""
        name, params = reading_stream(run_id, after, limit)
        rows = self.dialect.read(lambda tx: tx.rows(name, {**params, "now": tx.now}))
        return chunks_of(rows, params)

    def emitted(self, lease: Lease) -> list[JSON]:
        """The data that ``lease``'s step's newest earlier attempt wrote, in order (empty: no
        earlier attempt wrote)."""
        params = {"run_id": lease.run_id, "task_id": lease.task_id, "attempt": lease.attempt}
        rows = self.dialect.read(lambda tx: tx.rows("STREAM_STEP", {**params, "now": tx.now}))
        chunks = [(int(a), str(k), d) for a, text in rows for k, d in batch_of(text)]
        return _last_attempt(chunks)

    def drop_expired_streams(self, limit: int = 100) -> int:
        """Drop the streams of up to ``limit`` succeeded runs that outlived the ``stream_ttl``
        of the task that wrote them last; how many went."""

        def drop(tx: Tx) -> int:
            found = tx.rows("STREAM_EXPIRED", {"limit": max(1, int(limit)), "now": tx.now})
            tx.many("STREAM_DROP", [{"run_id": row[0]} for row in found])
            return len(found)

        return self.dialect.write(drop)


def reading_stream(run_id: int, after: int, limit: int) -> tuple[str, Params]:
    """The statement that reads the batches holding a run's chunks after ``after``, and its
    parameters (``since``: a batch holds at most ``MAX_BATCH`` + 1 chunks, a reset and its
    data, so the one holding ``after`` + 1 begins after ``since``)."""
    after = max(0, int(after))
    return "STREAM_READ", {"run_id": int(run_id), "after": after, "since": after - MAX_BATCH - 1,
                           "limit": max(1, min(int(limit), MAX_READ))}  # fmt: skip


def stream_status(run_id: int) -> tuple[str, Params]:
    """The statement a follower reads the run's status with (never locked), and its
    parameters: read before the chunks, a status that says the run is over means every chunk
    was written already (a batch is refused once its run is over)."""
    return "STREAM_STATUS", {"run_id": int(run_id)}


def batch_of(text: str) -> list[tuple[str, JSON]]:
    """A batch's row as its chunks' (kind, data), in order."""
    items = loads(text, "a stream batch")
    if not isinstance(items, list):
        raise InvalidPayload("a stream batch cannot be decoded: not an array")
    return [(str(item[0]), item[1]) for item in items if isinstance(item, list)]


def chunks_of(rows: Sequence[Row], params: Params) -> list[Chunk]:
    """``STREAM_READ``'s rows (batches, in order) as the chunks ``params`` asked for: those after
    its ``after``, ``limit`` of them at most."""
    after, limit = int(params["after"]), int(params["limit"])
    out: list[Chunk] = []
    for first, attempt, step, text, at in rows:
        for index, (kind, data) in enumerate(batch_of(text)):
            offset = int(first) + index
            if offset <= after:
                continue
            if len(out) >= limit:
                return out
            shown: ChunkKind = "reset" if kind == "reset" else "data"
            out.append(Chunk(offset, int(attempt), int(step), shown, data, float(at)))
    return out
