"""The handler's paid calls (B13): ``ctx.once``, ``ctx.once_async``,
``ctx.once_key`` and ``ctx.usage``, a part of ``TaskContext`` (``context.py``) on their own.

One call, in order: its lookup and intent (one small transaction: a kept answer is reused, or
an intent is written under this attempt's live lease), then ``fn``, then its keep (another small
transaction, retried until the database answers), and only then does the handler see the
answer. ``once.py`` has the pieces and says on which thread each runs.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NoReturn, TypeVar

from . import once as paid
from .once import CallBook, CallParked, Cost, OnceCall, Tokens
from .store import InvalidPayload, Lease, StoreError
from .store.calls import CallKey, CallStart, KeptCall, Unknown
from .store.types import JSON, Usage

T = TypeVar("T")


class PaidCalls:
    """``ctx.once`` and its kin; ``TaskContext`` provides the lease and its checks."""

    _lease: Lease
    _calls: CallBook | None
    reused: int  # how many ``once`` calls of this execution reused a kept answer
    last_once: OnceCall | None  # what the last ``once`` did
    used_tokens: int | None  # tokens this execution used, settled with its limits at the commit
    reported: Usage | None  # what ``usage`` reported, kept with the commit for ``spend``

    def _readable(self) -> None: ...
    def raise_if_lost(self) -> None: ...
    def _lost_now(self, over: bool) -> NoReturn:
        raise NotImplementedError

    def usage(self, *, tokens: int | None = None, cost: float | None = None) -> None:
        """Report what this execution used: ``tokens`` of its limits' token budgets (a
        model's usage, say; the commit settles it against the task's reservation in the same
        fenced transaction, so a zombie's report never counts) and a ``cost`` in your own unit
        (kept with the commit for ``supervisor spend``). Reports add up. A call made with
        ``once(tokens=..., cost=...)`` is counted already: do not report it again."""
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                                   or not 0 <= tokens <= paid.MAX_TOKENS):  # fmt: skip
            raise InvalidPayload(f"usage(tokens=...) takes a whole number from 0 (got {tokens!r})")
        spent = paid.check_cost(cost, "usage(cost=...)")
        if tokens is None and spent is None:
            raise InvalidPayload("usage takes tokens=, cost= or both")
        self.raise_if_lost()
        if tokens is not None:
            self.used_tokens = (self.used_tokens or 0) + tokens
        was = self.reported or Usage()
        self.reported = Usage(
            None if tokens is None and was.tokens is None else (was.tokens or 0) + (tokens or 0),
            None if spent is None and was.cost is None else (was.cost or 0.0) + (spent or 0.0),
        )

    def once_key(self, name: str, request: JSON) -> str:
        """The idempotency key of call ``name`` with ``request``: the same string in every
        attempt of this step (and another for another request, step, run or database). Send
        it as your provider's idempotency key, so paying again costs nothing where it is
        honoured."""
        book, key = self._once_begin(name, request)
        return paid.idempotency_key(book.identity(), key)

    def once(
        self, name: str, request: JSON, fn: Callable[[], Any], *, tokens: Tokens = None,
        cost: Cost = None, unknown: Unknown = "pay",
    ) -> Any:  # fmt: skip
        """``fn()``'s answer, paid at most once per step where the worker lives to keep it:
        if an earlier attempt of this step kept an answer for ``name`` and this exact
        ``request`` (a hash of its canonical JSON), return it without calling ``fn``; else
        record the call (an intent), call ``fn`` and keep its JSON answer before returning it
        (a worker that then loses its lease, pauses or dies leaves it behind). An earlier
        call without an answer (its worker died in the call) may have been paid:
        ``unknown="pay"`` calls again (counted as paid again), ``unknown="park"`` does not
        call and parks the run until ``supervisor resolve``. ``tokens`` and ``cost`` (numbers,
        or functions of the answer) are what the call used: added to ``usage`` when paid now,
        never for a reused answer. A lease lost while the answer is being kept raises
        ``LeaseLost``; the answer is kept all the same."""
        mode = paid.check_unknown(unknown)
        book, key = self._once_begin(name, request)
        asked = time.monotonic()
        start = self._wait(book.call(lambda s: s.begin_call(self._lease, key, mode)), key)
        if start.outcome != "call":
            return self._once_found(key, start, tokens)
        self._within_lease(start, asked)
        result = fn()
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if callable(close):
                close()
            raise TypeError(f"once({name!r}): fn returned an awaitable: use await ctx.once_async")
        n, c = self._once_checked(key, result, tokens, cost)
        keep = book.call(lambda s: paid.keep_answer(s, self._lease, key, result, n, c,
                                                    start.intent))  # fmt: skip
        return self._once_end(key, self._wait(keep, key), n, start.again)

    async def once_async(
        self, name: str, request: JSON, fn: Callable[[], Awaitable[Any] | Any], *,
        tokens: Tokens = None, cost: Cost = None, unknown: Unknown = "pay",
    ) -> Any:  # fmt: skip
        """``once`` for ``async def`` handlers: ``fn()`` may return an awaitable (it is
        awaited); the lookup and the keep run off the event loop, on the book's threads."""
        import asyncio  # noqa: PLC0415 - a worker of plain handlers never loads it

        mode = paid.check_unknown(unknown)
        book, key = self._once_begin(name, request)
        asked = time.monotonic()
        start: CallStart = await self._await(
            book.submit(lambda s: s.begin_call(self._lease, key, mode)), key
        )
        if start.outcome != "call":
            return self._once_found(key, start, tokens)
        self._within_lease(start, asked)
        result = fn()
        if inspect.isawaitable(result):
            result = await result
        n, c = self._once_checked(key, result, tokens, cost)
        keep = book.submit(lambda s: paid.keep_answer(s, self._lease, key, result, n, c,
                                                      start.intent))  # fmt: skip
        # shielded: a handler cancelled meanwhile still leaves its paid answer behind (the
        # book's thread goes on with the keep whatever happens to this task)
        kept = await asyncio.shield(self._await(keep, key))
        return self._once_end(key, kept, n, start.again)

    def _once_begin(self, name: str, request: JSON) -> tuple[CallBook, CallKey]:
        if self._calls is None:
            raise RuntimeError("ctx.once needs a worker's store (this context has none)")
        self._readable()  # no call is paid on a lease already lost, or too late to begin
        return self._calls, paid.call_key(self._lease, name, request)

    def _within_lease(self, start: CallStart, asked: float) -> None:
        """``fn`` begins only within the lease its intent was written under: the database said
        how long it had left, counted here from before the intent was asked for (a worker
        paused between its intent and its call must not wake into a paid call another attempt
        may have made since). Else ``LeaseLost``; the intent stays, counted as unknown."""
        self.raise_if_lost()
        if start.left is not None and time.monotonic() - asked >= start.left:
            self._lost_now(over=False)

    def _once_found(self, key: CallKey, start: CallStart, tokens: Tokens) -> Any:
        """A call that is not made now: reused, parked, or its lease gone."""
        if start.outcome == "reused":
            assert start.kept is not None
            if tokens is not None:  # counted through once: nothing paid, nothing charged
                self.used_tokens = self.used_tokens or 0
            return self._once_end(key, start.kept)
        if start.outcome == "park":
            raise CallParked(key.name)
        self._lost_now(over=start.outcome == "over")

    def _once_checked(
        self, key: CallKey, result: Any, tokens: Tokens, cost: Cost
    ) -> tuple[int | None, float | None]:
        """``fn`` returned: its tokens and cost, and the answer checked (JSON, within the
        limits) before it is kept; a bad one raises ``InvalidPayload`` (retried: the next
        answer may fit)."""
        n = paid.count_tokens(tokens, result)
        c = paid.count_cost(cost, result)
        paid.check_result(key, result)
        return n, c

    def _wait(self, future: Future[T], key: CallKey) -> T:
        """The call's answer, bounded; ``LeaseLost`` as soon as the lease is (a keep handed
        over is still written: the book's thread does it)."""
        deadline = time.monotonic() + paid.CALL_WAIT
        while (left := deadline - time.monotonic()) > 0:
            self.raise_if_lost()
            try:
                return future.result(timeout=min(paid.LOST_CHECK, left))
            except FutureTimeout:
                continue
        raise StoreError(f"once({key.name!r}): the store did not answer in {paid.CALL_WAIT:g} s")

    async def _await(self, future: Future[T], key: CallKey) -> T:
        import asyncio  # noqa: PLC0415 - as in once_async

        try:
            async with asyncio.timeout(paid.CALL_WAIT):  # (wait_for may swallow a cancel on 3.11)
                return await asyncio.wrap_future(future)
        except TimeoutError:
            raise StoreError(f"once({key.name!r}): the store did not answer in "
                             f"{paid.CALL_WAIT:g} s") from None  # fmt: skip

    def _once_end(
        self, key: CallKey, kept: KeptCall, paid_tokens: int | None = None, again: bool = False
    ) -> Any:
        if kept.outcome in ("refused", "ended"):  # never its own answer: there is no kept one
            paid.refused(key, self._lease)
            self._lost_now(over=kept.outcome == "ended")
        if again:
            paid.paid_again(key, self._lease)
        reused = kept.outcome == "reused"  # fn was not called
        if reused:
            self.reused += 1
        elif paid_tokens:  # paid now (kept, lost the race, or refused): what it used counts,
            # and twice when paid again: the same request's earlier call, whose answer never
            # came, used about as much, and no commit ever charged it to the limits
            self.used_tokens = (self.used_tokens or 0) + paid_tokens * (2 if again else 1)
        self.last_once = OnceCall(key.name, reused, kept.tokens, kept.attempt, again)
        return kept.result
