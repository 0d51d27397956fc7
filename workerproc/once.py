"""Paid once (issue 27, docs/protocol.md B13), the handler's side: ``ctx.once(name, request,
fn)`` calls ``fn`` only when no earlier attempt of this step kept an answer for this exact
request, and keeps ``fn``'s answer the moment it returns, in its own small transaction, before
the handler goes on: a worker that then loses its lease, is paused or killed leaves the paid
answer behind for the next attempt.

A worker's calls go through its ``CallBook``: one thread of its own with its own connection,
started at the first call, so handlers on slot threads, the main thread or the event loop never
share a connection across threads (and a keep handed over still finishes when the handler that
asked is interrupted or cancelled).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from .logs import attempt_of, event
from .store import InvalidPayload, StoreError
from .store.calls import MAX_RESULT, CallKey, KeptCall
from .store.codec import MAX_PAYLOAD, check_name, dumps
from .store.roles import CallStore
from .store.types import JSON, Lease

log = logging.getLogger("workerproc.worker")
T = TypeVar("T")

CALL_WAIT = 120.0  # seconds a handler waits for its call's lookup or keep (each is bounded)
MAX_TOKENS = 10**12
LOST_CHECK = 0.05  # how often a handler waiting on its call looks at its lease

Tokens = int | Callable[[Any], int] | None  # a number, or what to read of the answer


@dataclass(frozen=True)
class OnceCall:
    """What the last ``ctx.once`` did: ``reused`` an answer an earlier attempt paid for (then
    ``attempt`` is the attempt that paid), or paid for it now; ``tokens`` the call's."""

    name: str
    reused: bool
    tokens: int | None
    attempt: int


def request_hash(request: JSON) -> str:
    """The sha256 of ``request``'s canonical JSON (sorted keys, no spaces): the same request
    always has the same hash, a changed one another."""
    dumps(request, "once's request", MAX_PAYLOAD)  # JSON only, within the payload limits
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


def call_key(lease: Lease, name: str, request: JSON) -> CallKey:
    return CallKey(lease.run_id, lease.task_id, check_name(name, "once's name"),
                   request_hash(request))  # fmt: skip


def count_tokens(tokens: Tokens, result: Any) -> int | None:
    """``tokens=`` of ``once``: a number, or a function of the answer (its usage, say)."""
    n = tokens(result) if callable(tokens) else tokens
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                          or not 0 <= n <= MAX_TOKENS):  # fmt: skip
        raise InvalidPayload(f"once(tokens=...) must be a whole number from 0 (got {n!r})")
    return n


def check_result(key: CallKey, result: Any) -> None:
    """The answer is kept as JSON within the payload limits: anything else fails the call
    that made it (it was paid for, but it cannot be kept)."""
    dumps(result, f"the result of once({key.name!r})", MAX_RESULT)


def refused(key: CallKey, lease: Lease) -> None:
    event(log, "call_not_kept",
          f"task {lease.task_id} {attempt_of(lease)}: once({key.name!r}) was paid, but its "
          "run ended or its step moved on: the answer is not kept", level=logging.WARNING,
          task_id=lease.task_id, run_id=lease.run_id, attempt=lease.attempt)  # fmt: skip


def unkept(key: CallKey, lease: Lease, exc: BaseException) -> None:
    event(log, "call_keep_failed",
          f"task {lease.task_id} {attempt_of(lease)}: once({key.name!r}) was paid, but its "
          f"answer could not be kept: {exc}", level=logging.WARNING, task_id=lease.task_id,
          run_id=lease.run_id, attempt=lease.attempt)  # fmt: skip


class CallBook:
    """The worker's paid calls: each lookup or keep runs on this book's own thread, with its
    own store (opened there at the first call, closed there by ``close``)."""

    def __init__(self, open_store: Callable[[], CallStore]) -> None:
        self._open = open_store
        self._queue: queue.SimpleQueue[tuple[Callable[[CallStore], Any], Future[Any]] | None]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[[CallStore], T]) -> Future[T]:
        """Run ``fn`` with the book's store on the book's thread."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise StoreError("the worker is stopping: its paid calls are closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="paid-calls",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._queue.put((fn, future))
        return future

    def _serve(self) -> None:
        store: CallStore | None = None
        while (item := self._queue.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if store is None:
                    store = self._open()
                future.set_result(fn(store))
            except BaseException as exc:  # the asker gets it, whatever its kind
                future.set_exception(exc)
        if store is not None:
            with contextlib.suppress(StoreError):
                store.close()

    def close(self, timeout: float = 10.0) -> None:
        """Finish the calls handed over, then close the store (bounded by ``timeout``)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)


def reuse(book: CallBook, key: CallKey) -> Future[KeptCall | None]:
    return book.submit(lambda store: store.reuse_call(key))


def keep(
    book: CallBook, lease: Lease, key: CallKey, result: JSON, tokens: int | None
) -> Future[KeptCall]:
    return book.submit(lambda store: store.keep_call(lease, key, result, tokens))
