"""What a batch handler gets (``@app.task(batch=64)``): a ``Batch``, a sequence of the items'
``TaskContext`` (``ItemContext``: each its own lease, payload, state and last word), and the
batch's own calls: ``once`` (one paid call for every item, kept for each), ``usage`` and
``emit``.

An item fails alone. Its calls never raise ``LeaseLost`` or ``RunCancelled`` into the handler
(that would end the call for every item): an item whose lease was lost, or whose run was
cancelled, has its last word discarded (a cancelled one is released, as any cancelled step)
and its neighbours go on; ``ctx.lease_lost`` and ``ctx.cancelled`` say so early. ``ctx.fail``
and ``ctx.retry_after`` end one item as a raised error or a ``RetryAfter`` would end a whole
step. What the handler leaves unconcluded is retried alone (an error of that item).

``batch.once(name, request, fn)`` (docs/protocol.md, B23): ``request`` holds one JSON value per
item, in the batch's order; each item's call is keyed by its own step and its own value, so an
item that was in a batch whose answer was kept reuses its answer wherever it is claimed next
(a takeover in another batch, with other neighbours). ``fn`` is called once, with the values of
the items that have no kept answer (in order), and returns one answer per value; every answer
is kept under its item's step before the handler sees any. A different set of items is a
different request to ``fn``, never a second payment for an item whose answer was kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, overload

from . import once as paid
from .context import TaskContext
from .limits import RetryAfter
from .once import CallBook, OnceCall
from .store import InvalidPayload, StoreError
from .store.calls import CallKey, CallStart, KeepItem, KeptCall, Unknown
from .store.roles import CallStore
from .store.types import JSON

T = TypeVar("T")


class ItemFailed(Exception):
    """An item of a batch ended by ``ctx.fail(error)``: retried like a raised error."""


class NotConcluded(Exception):
    """The batch handler returned without a last word for this item: it is retried alone."""


class ItemContext(TaskContext):
    """One item of a batch: a ``TaskContext`` whose calls never raise ``LeaseLost`` or
    ``RunCancelled`` into the batch's handler (its last word is discarded instead), plus
    ``fail`` and ``retry_after``, its own ends."""

    failed: str | None = None  # ``fail``'s error
    retry: RetryAfter | None = None  # ``retry_after``'s
    parked: str | None = None  # the paid call whose outcome is unknown (``batch.once``)

    def raise_if_lost(self) -> None:
        """Quiet in a batch: an item whose lease is lost or whose run was cancelled is dropped
        alone, its neighbours go on (``lease_lost`` and ``cancelled`` tell it)."""

    @property
    def live(self) -> bool:
        """Neither lost nor cancelled (as far as this worker has heard)."""
        return not (self._lost.is_set() or self._cancelled.is_set())

    @property
    def concluded(self) -> bool:
        """The handler has given this item its last word."""
        return self.commit is not None or self.failed is not None or self.retry is not None

    def _end(self) -> None:
        if self.concluded:
            raise RuntimeError("advance/finish/wait_for/spawn/fail/retry_after may be called "
                               "once per item")  # fmt: skip

    def fail(self, error: str) -> None:
        """End this item as an error: retried with backoff within its ``max_attempts``, then
        its run fails (as if its own handler had raised ``error``)."""
        self._end()
        self.failed = str(error)[:2000] or "failed"

    def retry_after(self, seconds: float) -> None:
        """Give this item back without spending an attempt, due again in ``seconds`` (as if
        its own handler had raised ``RetryAfter(seconds)``)."""
        self._end()
        self.retry = RetryAfter(seconds)

    def _gone(self, over: bool) -> None:
        """The database said this item's lease is no longer live (``over``: it is, but its run
        is over): its last word is discarded (released, for a cancelled run)."""
        (self._cancelled if over else self._lost).set()

    def ended_by(self, raised: BaseException | None) -> BaseException | None:
        """What ends this item when the batch's handler ended with ``raised``: its own last
        word first, else the handler's error, else ``NotConcluded``."""
        if self.failed is not None:
            return ItemFailed(self.failed)
        if self.retry is not None:
            return self.retry
        if self.commit is not None:
            return None
        if self.parked is not None:
            return paid.CallParked(self.parked)
        if raised is not None:
            return raised
        return NotConcluded("the batch handler returned without a last word for this item")


class Batch(Sequence[TaskContext]):
    """The items of one batch call, in claim order: each a ``TaskContext`` with its own lease,
    payload, state and last word (``finish``, ``advance``, ``wait_for``, ``fail``,
    ``retry_after``), committed on its own; ``id``: the batch's call id."""

    def __init__(self, items: Sequence[ItemContext], calls: CallBook | None, id: str) -> None:
        self._items = list(items)
        self._calls = calls
        self._id = id

    @property
    def id(self) -> str:
        """The batch's call id: its first item's task id and attempt (``"812.1"``), the same
        in the outbox's ``step.batched`` event of every item and in ``supervisor show RUN``."""
        return self._id

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> TaskContext: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TaskContext]: ...
    def __getitem__(self, index: int | slice) -> TaskContext | Sequence[TaskContext]:
        return self._items[index]

    def __iter__(self) -> Iterator[TaskContext]:
        return iter(self._items)

    def __repr__(self) -> str:
        return f"<Batch {self._id} of {len(self)}>"

    # -- the batch's own calls -------------------------------------------------------------
    def usage(self, *, tokens: int | None = None, cost: float | None = None) -> None:
        """Report what the batch's call used, shared evenly by its live items (each settles
        its share at its own commit, as ``ctx.usage`` does)."""
        live = [c for c in self._items if c.live] or self._items
        n = len(live)
        for i, ctx in enumerate(live):
            share = None if tokens is None else tokens // n + (i < tokens % n)
            ctx.usage(tokens=share, cost=None if cost is None else cost / n)

    def emit(self, chunk: JSON) -> None:
        """Append ``chunk`` to the stream of every live item (``ctx.emit``)."""
        for ctx in self._items:
            if ctx.live:
                ctx.emit(chunk)

    def once(
        self, name: str, request: Sequence[JSON], fn: Callable[[list[JSON]], Sequence[Any]], *,
        unknown: Unknown = "pay",
    ) -> list[Any]:  # fmt: skip
        """One paid call for the batch, its answer kept for each item: ``request`` holds one
        JSON value per item (in order); ``fn`` gets the values of the items without a kept
        answer and returns one answer each (JSON). Returns one answer per item, in order:
        the kept one where an earlier call of that item's step has one (reused), else
        ``fn``'s; None for an item dropped meanwhile (lost, cancelled, parked). An earlier
        call of an item's step without an answer: ``unknown="pay"`` pays again,
        ``"park"`` parks that item until ``supervisor resolve``."""
        mode = paid.check_unknown(unknown)
        items = self._items
        if not isinstance(request, (list, tuple)) or len(request) != len(items):
            raise InvalidPayload(f"batch.once({name!r}): request must hold one value per item "
                                 f"({len(items)})")  # fmt: skip
        if self._calls is None:
            raise RuntimeError("batch.once needs a worker's store (this batch has none)")
        book = self._calls
        keys = [paid.call_key(ctx._lease, name, value)
                for ctx, value in zip(items, request, strict=True)]  # fmt: skip
        answers: list[Any] = [None] * len(items)
        live = [i for i, ctx in enumerate(items) if ctx.live and not ctx.concluded]
        if not live:
            return answers
        pairs = [(items[i]._lease, keys[i]) for i in live]
        asked = time.monotonic()
        starts = _answer(book.call(lambda s: s.begin_calls(pairs, mode)), name)
        pay: list[tuple[int, CallStart]] = []
        for i, start in zip(live, starts, strict=True):
            ctx = items[i]
            if start.outcome == "reused" and start.kept is not None:
                answers[i] = start.kept.result
                ctx.reused += 1
                ctx.last_once = OnceCall(name, True, start.kept.tokens, start.kept.attempt)
            elif start.outcome == "call":
                if start.left is not None and time.monotonic() - asked >= start.left:
                    ctx._gone(over=False)  # its lease ran out before fn could begin
                else:
                    pay.append((i, start))
            elif start.outcome == "park":
                ctx.parked = name
            else:
                ctx._gone(over=start.outcome == "over")
        if pay:
            self._pay(name, request, fn, keys, pay, answers)
        return answers

    def _pay(
        self, name: str, request: Sequence[JSON], fn: Callable[[list[JSON]], Sequence[Any]],
        keys: list[CallKey], pay: list[tuple[int, CallStart]], answers: list[Any],
    ) -> None:  # fmt: skip
        items = self._items
        got = fn([request[i] for i, _ in pay])
        if not isinstance(got, (list, tuple)) or len(got) != len(pay):
            raise InvalidPayload(f"batch.once({name!r}): fn must return one answer per value "
                                 f"it was given ({len(pay)})")  # fmt: skip
        for (i, _), answer in zip(pay, got, strict=True):
            paid.check_result(keys[i], answer)
        keeps = [KeepItem(items[i]._lease, keys[i], answer, start.intent)
                 for (i, start), answer in zip(pay, got, strict=True)]  # fmt: skip
        assert self._calls is not None
        kept = _answer(self._calls.call(lambda s: keep_all(s, keeps)), name)
        for (i, start), k in zip(pay, kept, strict=True):
            ctx = items[i]
            if k.outcome in ("refused", "ended"):  # the step moved on, or the run is over
                paid.refused(keys[i], ctx._lease)
                ctx._gone(over=k.outcome == "ended")
                continue
            if start.again:
                paid.paid_again(keys[i], ctx._lease)
            answers[i] = k.result
            ctx.last_once = OnceCall(name, False, k.tokens, k.attempt, start.again)


def keep_all(store: CallStore, items: list[KeepItem]) -> list[KeptCall]:
    """``keep_calls``, tried again after a failure until the database answers, for at most
    ``CALL_WAIT`` (as ``once.keep_answer`` does for one answer): paid answers are never
    dropped, and a retry after a commit that landed answers what it did."""
    deadline = time.monotonic() + paid.CALL_WAIT
    pause, most = paid.KEEP_BACKOFF
    while True:
        try:
            return store.keep_calls(items)
        except InvalidPayload:
            raise
        except StoreError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(most, pause * 2)


def _answer(future: Future[T], name: str) -> T:
    """A store call's answer, bounded by ``CALL_WAIT``."""
    try:
        return future.result(timeout=paid.CALL_WAIT)
    except TimeoutError:
        raise StoreError(f"batch.once({name!r}): the store did not answer in "
                         f"{paid.CALL_WAIT:g} s") from None  # fmt: skip
