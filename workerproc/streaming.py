"""Runs' streams (docs/protocol.md B21), the worker's side: what a handler emits
(``ctx.emit``) is buffered per execution (``Emitter``) and written by the worker's one stream
thread (``Streamer``), in batches: a batch goes as soon as ``BATCH`` chunks wait or the oldest
has waited ``DELAY`` seconds, whichever comes first, or when the handler flushes
(``ctx.flush``, and always before its commit). Each batch is one small transaction under the
attempt's fence (``Store.append_stream``); a refused one (the lease lost, the run over, the
stream full) is kept on the emitter and raised at the handler's next emit or flush.

A batch that failed (the database did not answer) is tried again, the chunks kept in order,
until it lands or ``WRITE_WAIT`` passes; a retry after a write that landed without its answer
is found written by the store (``after``), never written twice. A handler that emits faster
than the database takes waits at its emit once ``PENDING`` chunks wait (``emit_async``: off
the loop).

While the worker's conductor exchanges (commits and claims: every few milliseconds on a busy
worker), a due batch waits for its next exchange, ``RIDE_WAIT`` at most (a batch full before
its oldest chunk waited ``DELAY``: until then at most), and is written in that
transaction, on the conductor's connection (``lend``, then ``landed``; ``commit_many``'s
``streams``), fenced and numbered the same: on SQLite another connection's commit costs the
conductor its page cache at its next transaction, a batch in its own transaction beside a busy
exchange a cold claim. A flush never waits for an exchange; a batch an exchange could not write
(it failed, or wrote nothing of it) goes back to the thread, tried as it was.

Every ``EXPIRY_EVERY`` seconds the thread also drops the streams of succeeded runs that outlived
their task's ``stream_ttl``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from .logs import attempt_of, event
from .store import InvalidPayload, StoreError
from .store.roles import StreamStore
from .store.streams import MAX_BATCH, Appended
from .store.types import Lease

log = logging.getLogger("workerproc.worker")

DELAY = 0.05  # seconds a chunk waits for its batch at most
BATCH = 64  # chunks that make a batch go at once
PENDING = 4 * MAX_BATCH  # chunks waiting that make an emit wait for the writer
WRITE_WAIT = 60.0  # seconds a batch is tried for, or a flush waits, at most
RIDE_WAIT = 0.02  # seconds a due batch waits for an exchange that ran this recently, at most
LIVELY = 1.0  # seconds after its last batch began an emitter counts as streaming
EXPIRY_EVERY = 60.0  # seconds between two looks for streams past their stream_ttl
RETRY = (0.01, 1.0)  # a failed write's first pause before it is tried again, and the most

Refusal = Literal["lost", "over", "full"]


class Emitter:
    """One execution's stream: the chunks waiting for their batch, and what the writes said.
    Everything here is guarded by the streamer's condition, but for ``add``'s common case: a
    chunk appended to a batch under way (``waiting`` is never replaced, only appended to and
    taken from the front). Every take leaves the writer to look by the new ``since`` +
    ``DELAY`` (a take by the writer: it is awake; by an exchange: ``landed``), so a chunk
    appended meanwhile is never left unannounced; ``taken`` counts the takes, and an append
    that sees one came between its look and its append tells the writer anyway (a hint)."""

    def __init__(self, streamer: Streamer, lease: Lease) -> None:
        self.lease = lease
        self._streamer = streamer
        self.waiting: list[str] = []  # chunks' JSON, in order (the same list for ever)
        self.taken = 0  # batches taken from ``waiting`` so far
        self.since = 0.0  # monotonic: when the oldest waiting chunk was emitted
        self.full_at: float | None = None  # monotonic: when ``BATCH`` chunks waited
        self.busy = 0  # chunks in a write now
        self.last: int | None = None  # the offset this attempt's last batch ended at
        self.refused: Refusal | None = None
        self.failed: StoreError | None = None  # a write that never landed
        self.flushing = False  # a flush is waiting: write what waits now
        self.written = 0  # chunks written so far
        self.attached = False  # the writer looks at it (from its first chunk on)
        self.ended = False  # its execution ended: it goes once nothing of it waits

    def due(self, now: float) -> bool:
        """Whether a batch should go now."""
        if not self.waiting or self.busy or self.refused or self.failed:
            return False
        return self.flushing or len(self.waiting) >= BATCH or now - self.since >= DELAY

    def due_since(self) -> float:
        """(Due.) When the next batch became due."""
        ready = self.since + DELAY
        return ready if self.full_at is None else min(ready, self.full_at)

    def take(self, now: float) -> list[str]:
        """(Due.) The next batch, which is being written from now on. What waits after it, or
        comes before the next take, waits from now (``since``)."""
        self.taken += 1
        waiting = self.waiting
        batch = waiting[:MAX_BATCH]
        del waiting[: len(batch)]  # (an append meanwhile lands after them)
        self.busy = len(batch)
        self.since = now
        self.full_at = now if len(waiting) >= BATCH else None
        return batch

    def unwritten(self) -> bool:
        """Whether chunks wait that will be written (none will once refused or failed)."""
        return bool(self.waiting) and self.refused is None and self.failed is None

    def add(self, text: str) -> None:
        """Keep one chunk for the next batch; the writer is woken when a batch is due, and
        the caller waits while too many wait (bounded)."""
        waiting, taken = self.waiting, self.taken
        if 0 < len(waiting) < BATCH - 1 and self.refused is None and self.failed is None:
            # a batch under way and not full: the writer knows when it is due (``since``),
            # unless a take came between the look and the append, which the count tells
            waiting.append(text)
            if self.taken != taken:
                with self._streamer.cond:
                    self._streamer.rouse(self.since + DELAY)
            return
        s = self._streamer
        if s._thread is None:
            s.start()
        with s.cond:
            self._raise()
            if not self.attached:
                s.attach(self)
            if not self.waiting:  # the writer learns when this batch is due
                self.since = time.monotonic()
                s.rouse(self.since + DELAY)
            self.waiting.append(text)
            if len(self.waiting) >= BATCH and self.full_at is None:
                self.full_at = now = time.monotonic()
                if not s.riding(now):  # (riding, the next exchange takes it, or the thread
                    s.rouse(now)  # at ``since`` + ``DELAY``, as it is to wake by then)
            if len(self.waiting) >= PENDING:
                s.rouse(-math.inf)
                self._wait(lambda: len(self.waiting) < PENDING)

    def flush(self) -> None:
        """Write what waits now and wait until it is written (bounded); raise what a write
        said (``StreamRefused``, ``StoreError``)."""
        s = self._streamer
        s.start()
        with s.cond:
            self.flushing = True
            s.rouse(-math.inf)
            try:
                self._wait(lambda: not self.waiting and not self.busy)
            finally:
                self.flushing = False

    def _wait(self, done: Callable[[], bool]) -> None:
        """(Holding the condition.) Until ``done`` or a refusal, ``WRITE_WAIT`` at most."""
        deadline = time.monotonic() + WRITE_WAIT
        cond = self._streamer.cond
        while not done():
            self._raise()
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreError(f"the stream of run {self.lease.run_id} was not written in "
                                 f"{WRITE_WAIT:g} s")  # fmt: skip
            cond.wait(min(left, 1.0))
        self._raise()

    def _raise(self) -> None:
        if self.refused is not None:
            raise StreamRefused(self.refused, self.lease)
        if self.failed is not None:
            raise self.failed


class StreamRefused(Exception):
    """The store refused this execution's stream: ``lost`` (the lease: the context raises
    ``LeaseLost``), ``over`` (the run: ``RunCancelled``), ``full`` (``StreamFull``)."""

    def __init__(self, why: Refusal, lease: Lease) -> None:
        super().__init__(why)
        self.why = why
        self.lease = lease


class Streamer:
    """The worker's stream writer: one thread (started at the first emit) and one store,
    whose connection is the thread's own. The thread sleeps on ``wake`` and is woken only when
    it would otherwise sleep past the moment something needs it (``rouse``): beside a busy
    stream whose batches ride the exchanges it wakes a few times a second, not at every
    batch, and every wake-up takes the interpreter lock from the worker's other threads. A
    handler waits on ``cond`` (a flush, too many chunks waiting): the same lock."""

    def __init__(self, open_store: Callable[[], StreamStore]) -> None:
        self._open = open_store
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        self.wake = threading.Condition(lock)
        self._asleep_until = -math.inf  # monotonic: when the thread's sleep ends (-inf: awake)
        self._emitters: list[Emitter] = []
        self._thread: threading.Thread | None = None
        self._store: StreamStore | None = None
        self._closed = False
        self._expired_at = 0.0  # monotonic: the last look for streams past their stream_ttl
        self._lent_at = -math.inf  # monotonic: the last exchange that asked for batches
        self._returned: list[tuple[Emitter, list[str]]] = []  # lent, not written: ours again

    def emitter(self, lease: Lease) -> Emitter:
        """A new execution's stream."""
        return Emitter(self, lease)

    def store(self) -> StreamStore:
        with self.cond:
            if self._store is None:
                self._store = self._open()
            return self._store

    def start(self) -> None:
        with self.cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="streams", daemon=True)
                self._thread.start()

    def attach(self, emitter: Emitter) -> None:
        """(Holding the condition.) The writer looks at ``emitter`` from now on."""
        emitter.attached = True
        self._emitters.append(emitter)

    def detach(self, emitter: Emitter) -> None:
        """The execution ended: its emitter goes once nothing of it waits."""
        with self.cond:
            emitter.ended = True
            self.rouse(-math.inf)

    def rouse(self, at: float) -> None:
        """(Holding the condition.) The thread should look again by ``at`` (monotonic;
        ``-inf``: now): woken if it sleeps past that (awake, it looks before it sleeps)."""
        if at < self._asleep_until:
            self.wake.notify()

    def riding(self, now: float) -> bool:
        """(Holding the condition.) Whether exchanges run, which take the batches due."""
        return now - self._lent_at < RIDE_WAIT and not self._closed

    def lend(self) -> list[tuple[Emitter, list[str]]]:
        """An exchange is about to begin: the batches due now, taken (each busy until
        ``landed``), for it to write in its transaction."""
        with self.cond:
            now = time.monotonic()
            self._lent_at = now
            if self._closed:
                return []
            return [(em, em.take(now)) for em in self._emitters if em.due(now)]

    def landed(self, lent: list[tuple[Emitter, list[str]]], answers: tuple[Any, ...]) -> None:
        """What the exchange answered for the batches ``lend`` gave it, in order; a batch with
        no answer (the exchange failed, or was written without them) goes back to the thread,
        to be written as it was."""
        if not lent:
            return
        with self.cond:
            for i, (em, batch) in enumerate(lent):
                if i < len(answers):
                    self._answered(em, batch, answers[i])
                else:
                    self._returned.append((em, batch))
                    self.rouse(-math.inf)
                if em.unwritten():  # what waited behind this batch: due now, or at its time
                    full = len(em.waiting) >= BATCH and not self.riding(time.monotonic())
                    self.rouse(-math.inf if em.flushing or full else em.since + DELAY)
            self.cond.notify_all()  # (a handler's flush, or its emit past ``PENDING``)

    def _next(self) -> tuple[Emitter, list[str]] | None:
        """(Holding the condition.) The next batch due, taken; else sleep until one may be.
        A due batch waits for the next exchange (``RIDE_WAIT`` at most) while exchanges run,
        unless its handler flushes."""
        if self._returned:
            return self._returned.pop(0)
        now = time.monotonic()
        riding = self.riding(now)
        soonest: float | None = None
        for em in self._emitters:
            if em.due(now):
                if not riding or em.flushing or now - em.due_since() >= RIDE_WAIT:
                    return em, em.take(now)
                later = min(em.due_since(), self._lent_at) + RIDE_WAIT
            elif em.unwritten() and not (em.busy and em.since + DELAY <= now):
                later = em.since + DELAY  # (behind a lent batch, overdue: ``landed`` rouses)
            elif not em.ended and now - em.since < LIVELY:
                later = now + DELAY  # its next chunk is due by then: it need not wake us
            else:
                continue
            soonest = later if soonest is None else min(soonest, later)
        sleep = 1.0 if soonest is None else max(0.001, min(1.0, soonest - now))
        self._asleep_until = now + sleep
        try:
            self.wake.wait(sleep)
        finally:
            self._asleep_until = -math.inf
        return None

    def _run(self) -> None:
        while True:
            with self.cond:
                if (
                    self._closed
                    and not self._returned
                    and not any(em.unwritten() for em in self._emitters)
                ):
                    return
                self._emitters = [em for em in self._emitters if em.busy or em.unwritten()
                                  or not (em.ended or em.refused or em.failed)]  # fmt: skip
                found = self._next()
            if found is None:
                self._expire()
                continue
            em, batch = found
            self._write(em, batch)

    def _write(self, em: Emitter, batch: list[str]) -> None:
        """One batch, tried until it lands, is refused, or ``WRITE_WAIT`` passes."""
        deadline = time.monotonic() + WRITE_WAIT
        pause, most = RETRY
        while True:
            try:
                appended = self.store().append_stream(em.lease, batch, after=em.last)
                break
            except Exception as exc:  # the thread goes on for the others, whatever this was
                again = isinstance(exc, StoreError) and not isinstance(exc, InvalidPayload)
                if not again or time.monotonic() + pause > deadline or self._closed:
                    failed = exc if isinstance(exc, StoreError) else StoreError(str(exc))
                    with self.cond:
                        em.failed, em.busy = failed, 0
                        em.waiting.clear()
                        self.cond.notify_all()
                    event(log, "stream_write_failed",
                          f"task {em.lease.task_id} {attempt_of(em.lease)}: its stream could "
                          f"not be written: {exc}", level=logging.ERROR,
                          task_id=em.lease.task_id, run_id=em.lease.run_id)  # fmt: skip
                    return
                time.sleep(pause)
                pause = min(most, pause * 2)
        with self.cond:
            self._answered(em, batch, appended)
            self.cond.notify_all()

    @staticmethod
    def _answered(em: Emitter, batch: list[str], appended: Appended) -> None:
        """(Holding the condition.) What the store answered for ``em``'s ``batch``."""
        em.busy = 0
        if appended.outcome == "written":
            em.last = appended.last
            em.written += len(batch)
        else:
            em.refused = appended.outcome
            em.waiting.clear()

    def _expire(self) -> None:
        """Now and then: drop the streams of succeeded runs past their ``stream_ttl``."""
        if time.monotonic() - self._expired_at < EXPIRY_EVERY:
            return
        self._expired_at = time.monotonic()
        with contextlib.suppress(StoreError):
            self.store().drop_expired_streams()

    def close(self, timeout: float = 10.0) -> None:
        """Write what waits (bounded by ``timeout``), then close the store."""
        with self.cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self.cond.notify_all()
            self.wake.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self.cond:
            store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(StoreError):
                store.close()
