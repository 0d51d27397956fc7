"""Paid once (docs/protocol.md B13), the handler's side: ``ctx.once(name,
request, fn)`` records the call (an intent) before ``fn`` runs, calls ``fn`` only when no
earlier attempt of this step kept an answer for this exact request, and keeps ``fn``'s answer
the moment it returns, before the handler sees it: a worker that then loses its lease, is
paused or killed leaves the paid answer behind for the next attempt. A later attempt that finds
an intent without an answer knows a payment may have happened: ``unknown="pay"`` calls again
(counted as paid again), ``unknown="park"`` parks the run until an operator's ``resolve``.

Where each lookup or keep runs: on the calling thread, with that thread's own connection (the
store keeps one per thread), in its own small transaction, so nothing is queued ahead of it.
Two callers hand it to a thread of the book's own instead, one per call at a time (never
queued behind another call): the main thread (an inline handler there can be interrupted by a
signal, which must never cut a keep short) and an event loop (which must not block on it).
A keep that fails (a connection closed under it, a lock held too long) is retried on a fresh
connection until it lands or the database refuses it for good (the run over, its step done):
an answer is never dropped once ``fn`` returned, within ``CALL_WAIT``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .logs import attempt_of, event
from .store import InvalidPayload, StoreError
from .store.calls import MAX_COST, MAX_RESULT, UNKNOWN_MODES, CallKey, KeptCall, Unknown
from .store.codec import MAX_PAYLOAD, check_name, dumps
from .store.roles import CallStore
from .store.types import JSON, Lease

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("workerproc.worker")
T = TypeVar("T")

CALL_WAIT = 120.0  # seconds a call's lookup, or its keep with every retry, may take at most
MAX_TOKENS = 10**12
LOST_CHECK = 0.05  # how often a handler waiting on its call looks at its lease
CALL_SEATS = 4  # slot threads that run their own calls, on connections of their own
KEEP_BACKOFF = (0.005, 1.0)  # a failed keep's first wait before it tries again, and the most

Tokens = int | Callable[[Any], int] | None  # a number, or what to read of the answer
Cost = float | Callable[[Any], float] | None  # the same, for a cost in the user's own unit


class CallParked(BaseException):
    """``once(..., unknown="park")`` found an earlier call of this step without an answer: a
    payment may have happened, so the step does not call again. The run waits (``waiting``,
    for ``outcome_unknown:NAME``) until ``supervisor resolve``. Derives from BaseException so a
    handler's ``except Exception`` cannot swallow it."""

    def __init__(self, name: str) -> None:
        super().__init__(f"once({name!r}): an earlier attempt's call has no answer")
        self.name = name


@dataclass(frozen=True)
class OnceCall:
    """What the last ``ctx.once`` did: ``reused`` an answer an earlier attempt paid for (then
    ``attempt`` is the attempt that paid), or paid for it now (``again``: after an earlier
    call of the same step that may have been paid too); ``tokens`` the call's."""

    name: str
    reused: bool
    tokens: int | None
    attempt: int
    again: bool = False


def request_hash(request: JSON) -> str:
    """The sha256 of ``request``'s canonical JSON (sorted keys, no spaces): the same request
    always has the same hash, a changed one another."""
    dumps(request, "once's request", MAX_PAYLOAD)  # JSON only, within the payload limits
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)  # fmt: skip
    return _sha256(text)


def _sha256(text: str) -> str:
    import hashlib  # noqa: PLC0415 - loaded by the first paid call, not by every worker

    return hashlib.sha256(text.encode()).hexdigest()


def call_key(lease: Lease, name: str, request: JSON) -> CallKey:
    return CallKey(lease.run_id, lease.task_id, check_name(name, "once's name"),
                   request_hash(request))  # fmt: skip


def idempotency_key(identity: str, key: CallKey) -> str:
    """The provider's idempotency key of ``key``: the same string for every attempt of this
    step's call with this request, another for another request, step, run or database (its
    ``identity``); 43 characters of ``[a-z0-9-]``, within every provider's limits."""
    text = f"{identity}:{key.run_id}:{key.task_id}:{key.name}:{key.request_hash}"
    return "lk-" + _sha256(text)[:40]


def check_unknown(unknown: object) -> Unknown:
    if unknown not in UNKNOWN_MODES:
        raise ValueError(f"once(unknown=...) takes one of {', '.join(UNKNOWN_MODES)} "
                         f"(got {unknown!r})")  # fmt: skip
    return unknown


def count_tokens(tokens: Tokens, result: Any) -> int | None:
    """``tokens=`` of ``once``: a number, or a function of the answer (its usage, say)."""
    n = tokens(result) if callable(tokens) else tokens
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                          or not 0 <= n <= MAX_TOKENS):  # fmt: skip
        raise InvalidPayload(f"once(tokens=...) must be a whole number from 0 (got {n!r})")
    return n


def check_cost(cost: object, what: str) -> float | None:
    """A cost: a number from 0 to ``MAX_COST`` in the user's own unit (None: none)."""
    if cost is None:
        return None
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise InvalidPayload(f"{what} must be a number from 0 (got {cost!r})")
    value = float(cost)
    if not (math.isfinite(value) and 0 <= value <= MAX_COST):
        raise InvalidPayload(f"{what} must be a number from 0 to {MAX_COST:g} (got {cost!r})")
    return value


def count_cost(cost: Cost, result: Any) -> float | None:
    """``cost=`` of ``once``: a number, or a function of the answer."""
    return check_cost(cost(result) if callable(cost) else cost, "once(cost=...)")


def check_result(key: CallKey, result: Any) -> None:
    """The answer is kept as JSON within the payload limits: anything else fails the call
    that made it (it was paid for, but it cannot be kept)."""
    dumps(result, f"the result of once({key.name!r})", MAX_RESULT)


def refused(key: CallKey, lease: Lease) -> None:
    event(log, "call_not_kept",
          f"task {lease.task_id} {attempt_of(lease)}: once({key.name!r}) was paid, but its "
          "run ended or its step moved on: the answer is not kept", level=logging.WARNING,
          task_id=lease.task_id, run_id=lease.run_id, attempt=lease.attempt)  # fmt: skip


def paid_again(key: CallKey, lease: Lease) -> None:
    event(log, "call_paid_again",
          f"task {lease.task_id} {attempt_of(lease)}: once({key.name!r}): an earlier attempt's "
          "call has no answer (killed or paused in the call?): paying again",
          level=logging.WARNING, task_id=lease.task_id, run_id=lease.run_id,
          attempt=lease.attempt, call=key.name)  # fmt: skip


def keep_answer(
    store: CallStore, lease: Lease, key: CallKey, result: JSON, tokens: int | None,
    cost: float | None, intent: int | None,
) -> KeptCall:  # fmt: skip
    """Keep ``result`` under ``intent``, trying again after a failure (each try on a fresh
    connection where the last one broke: the store discards a failed connection) until the
    database answers, for at most ``CALL_WAIT``: a retry after a commit that landed finds its
    intent answered and answers what it did, so nothing is counted twice."""
    deadline = time.monotonic() + CALL_WAIT
    pause, most = KEEP_BACKOFF
    tries = 0
    while True:
        tries += 1
        try:
            return store.keep_call(lease, key, result, tokens, cost=cost, intent=intent)
        except InvalidPayload:
            raise  # the answer cannot be kept, whoever tries (checked before: not reached)
        except StoreError as exc:
            if time.monotonic() + pause > deadline:
                event(log, "call_keep_failed",
                      f"task {lease.task_id} {attempt_of(lease)}: once({key.name!r}) was paid, "
                      f"but its answer could not be kept in {tries} tries: {exc}",
                      level=logging.ERROR, task_id=lease.task_id, run_id=lease.run_id,
                      attempt=lease.attempt)  # fmt: skip
                raise
            if tries == 1:
                event(log, "call_keep_retry",
                      f"task {lease.task_id} {attempt_of(lease)}: once({key.name!r}): keeping "
                      f"its answer failed ({exc}): trying again", level=logging.WARNING,
                      task_id=lease.task_id, run_id=lease.run_id,
                      attempt=lease.attempt)  # fmt: skip
            time.sleep(pause)
            pause = min(most, pause * 2)


class CallBook:
    """The worker's paid calls: one store, whose connections are each thread's own (opened at
    a thread's first call). Up to ``seats`` slot threads run their calls themselves, each on
    its own connection; the main thread, an event loop and slot threads past ``seats`` hand
    theirs to the book's ``threads`` threads (each with its own connection too), so a worker
    of 250 slots does not open 250 connections."""

    def __init__(
        self, open_store: Callable[[], CallStore], threads: int = CALL_SEATS,
        seats: int = CALL_SEATS,
    ) -> None:  # fmt: skip
        self._open = open_store
        self._threads = max(1, threads)
        self._seats = max(0, seats)
        self._seated: set[int] = set()
        self._lock = threading.Lock()
        self._store: CallStore | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._identity: str | None = None
        self._closed = False

    def store(self) -> CallStore:
        with self._lock:
            if self._closed:
                raise StoreError("the worker is stopping: its paid calls are closed")
            if self._store is None:
                self._store = self._open()
            return self._store

    def identity(self) -> str:
        """This database's identity, read once (``once_key``)."""
        if self._identity is None:
            self._identity = self.store().store_identity()
        return self._identity

    def _seat(self) -> bool:
        """Whether this thread runs its calls itself: a slot thread with a seat (taken at its
        first call while one is free). The main thread never does: a signal may interrupt an
        inline handler, and must never cut a keep short."""
        thread = threading.current_thread()
        if thread is threading.main_thread():
            return False
        with self._lock:
            if thread.ident in self._seated:
                return True
            if len(self._seated) < self._seats and thread.ident is not None:
                self._seated.add(thread.ident)
                return True
            return False

    def call(self, fn: Callable[[CallStore], T]) -> Future[T]:
        """Run ``fn`` with the store: on this thread when it has a seat (the future is done
        when this returns), else on one of the book's threads."""
        if not self._seat():
            return self.submit(fn)
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn(self.store()))
        except BaseException as exc:  # the asker gets it, whatever its kind
            future.set_exception(exc)
        return future

    def submit(self, fn: Callable[[CallStore], T]) -> Future[T]:
        """Run ``fn`` with the store on one of the book's threads (an event loop's calls)."""
        store = self.store()
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - at first use

                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="paid-calls")
            return self._pool.submit(fn, store)

    def close(self, timeout: float = 10.0) -> None:
        """Finish the calls handed over (bounded by ``timeout``), then close the store."""
        with self._lock:
            self._closed = True
            pool, store = self._pool, self._store
        if pool is not None:
            done = threading.Thread(target=pool.shutdown, name="paid-calls-close", daemon=True)
            done.start()
            done.join(timeout)
        if store is not None:
            with contextlib.suppress(StoreError):
                store.close()
