"""Paid calls (docs/protocol.md B13), written once: a step's expensive call
(``ctx.once``) is recorded before it is made and kept the moment it returns, each in its own
small transaction, so the next attempt of the same step reuses the answer instead of paying
again, and knows when a payment may have happened without an answer.

- ``begin_call``: the kept answer of this step's call with this request hash, if any (and the
  reuse counted); else an intent (run, step, name, request hash, attempt, time), written only
  under this attempt's live lease on a live run: a paid call begins only on a lease the
  database holds. An earlier intent without an answer (its attempt killed or paused in the
  call) makes this one a payment again, or, for a caller that parks, writes nothing.
- ``keep_call``: keep a paid answer and mark its intent answered. Any attempt of the step may
  (a lease lost meanwhile too: the call was paid for, it is an observation, not a state
  change), but only while the run is alive and the step not done; the run's state stays fenced
  as always. The first kept answer wins: a later one is counted as paid, unused, and the caller
  gets the winner's. A keep retried after an ambiguous failure finds its intent answered and
  answers what the first try did.
- ``resolve``: an operator's word on a call whose outcome is unknown: its answer (kept as if
  fn had returned it) or "pay again"; a run parked on it goes on.
- ``paid_calls`` (``show``), ``call_timeline`` (the dashboard), ``paid_call_totals``
  (metrics, the chaos report), ``spend`` (tokens and cost kept), ``forget_call`` (an operator's
  fresh start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..calls import (
    MAX_RESULT,
    CallIntent,
    CallKey,
    CallStart,
    CallTotals,
    KeepItem,
    KeptCall,
    PaidCall,
    Resolved,
    Spend,
    Unknown,
    parked_on,
    usage_row,
)
from ..codec import MAX_NAME, check_name, dumps, loads
from ..dialect import Dialect, Row, Tx
from ..driver import Keep
from ..errors import RunNotFound, RunOver, StoreError
from ..types import JSON, TERMINAL_STATUSES, Lease, Usage
from .commits import fence, live

_NO_ANSWER = object()  # ``resolve`` without an answer (None is a JSON answer)
RESOLVER = "resolve"  # the owner of an answer an operator gave


def _kept(row: Row, outcome: Literal["reused", "kept", "lost_race"]) -> KeptCall:
    return KeptCall(loads(row[0], "a kept call"), int(row[1]),
                    None if row[2] is None else int(row[2]), outcome)  # fmt: skip


class Calls:
    dialect: Dialect

    def begin_call(self, lease: Lease, key: CallKey, unknown: Unknown = "pay") -> CallStart:
        """Before ``lease``'s attempt calls ``key``: its kept answer (reused), or an intent
        written (call), or nothing (park: an earlier intent has no answer; lost: the lease
        is no longer live, or the run is over)."""
        return self.dialect.write(lambda tx: _begin(tx, lease, key, unknown), intent="call")

    def begin_calls(
        self, items: Sequence[tuple[Lease, CallKey]], unknown: Unknown = "pay"
    ) -> list[CallStart]:
        """``begin_call`` for each (lease, key) of a batch, in one transaction (``batch.once``):
        each item found, written or refused on its own, as ``begin_call`` would (in step
        order: two batches that share items lock their calls in the same order)."""
        order = sorted(range(len(items)), key=lambda i: (items[i][1].run_id, items[i][1].task_id))

        def begin(tx: Tx) -> list[CallStart]:
            found = {i: _begin(tx, items[i][0], items[i][1], unknown) for i in order}
            return [found[i] for i in range(len(items))]

        return self.dialect.write(begin, intent="call")

    def store_identity(self) -> str:
        """This database's own random identity (made by its migration): what makes a call's
        idempotency key (``once_key``) differ between two databases with the same run ids."""
        row = self.dialect.read(lambda tx: tx.one("STORE_IDENTITY", {}))
        if row is None:
            raise StoreError("the database has no identity row: run 'supervisor migrate'")
        return str(row[0])

    def keep_call(
        self, lease: Lease, key: CallKey, result: JSON, tokens: int | None = None, *,
        cost: float | None = None, intent: int | None = None,
    ) -> KeptCall:  # fmt: skip
        """Keep ``result``, paid by ``lease``'s attempt (lost or not), while the run is alive
        and ``lease``'s step not done, and mark ``intent`` answered (its tokens and cost kept
        for ``spend``). Returns what the step's call now answers."""
        text = dumps(result, f"the result of once({key.name!r})", MAX_RESULT)
        return self.dialect.write(lambda tx: _keep(tx, lease, key, result, text, tokens, cost,
                                                   intent), intent="call")  # fmt: skip

    def keep_calls(self, items: Sequence[KeepItem]) -> list[KeptCall]:
        """``keep_call`` for each item of a batch (lease, key, result, intent), in one
        transaction (``batch.once``): each kept, lost to an earlier answer or refused on its
        own, as ``keep_call`` would."""
        texts = [dumps(i.result, f"the result of once({i.key.name!r})", MAX_RESULT)
                 for i in items]  # fmt: skip
        order = sorted(range(len(items)), key=lambda i: (items[i].key.run_id, items[i].key.task_id))

        def keep(tx: Tx) -> list[KeptCall]:
            kept = {i: _keep(tx, items[i].lease, items[i].key, items[i].result, texts[i], None,
                             None, items[i].intent) for i in order}  # fmt: skip
            return [kept[i] for i in range(len(items))]

        return self.dialect.write(keep, intent="call")

    def resolve(
        self, run_id: int, name: str, answer: JSON | object = _NO_ANSWER, *,
        pay_again: bool = False,
    ) -> Resolved:  # fmt: skip
        """An operator's word on call ``name`` of run ``run_id`` (its newest), whose outcome
        is unknown: ``answer`` is kept as if fn had returned it (unless an answer is kept
        already: the first one wins), or ``pay_again``: the next attempt calls fn once more.
        A run parked on the call goes on at once. ``RunNotFound``, ``RunOver``, or
        ``StoreError`` when the run made no call of that name."""
        check_name(name, "a call's name")
        if (answer is _NO_ANSWER) == (not pay_again):
            raise StoreError("resolve takes an answer or pay_again=True, not both or neither")
        text = None if answer is _NO_ANSWER else dumps(answer, "the answer", MAX_RESULT)

        def resolving(tx: Tx) -> Resolved:
            found = tx.one("RUN_STATUS", {"run_id": run_id})
            if found is None:
                raise RunNotFound(run_id)
            status = str(found[0])
            if status in TERMINAL_STATUSES:
                raise RunOver(run_id, status)
            call = tx.one("CALL_TO_RESOLVE", {"run_id": run_id, "name": name, "now": tx.now})
            if call is None:
                raise StoreError(f"run {run_id} has made no call named {name!r}")
            key = CallKey(run_id, int(call[0]), name, str(call[1])).params()
            wait_for = parked_on(name)
            due = tx.rows("UNPARK", {"run_id": run_id, "wait_for": wait_for, "now": tx.now})
            kept = False
            if text is not None and tx.one("KEPT_ANSWER", key) is None:
                given = {**key, "result": text, "attempt": int(call[2]), "owner": RESOLVER,
                         "now": tx.now}  # fmt: skip
                kept = tx.count("RESOLVE_CALL", given) == 1
            word = "pay_again" if pay_again else "answer"
            settled = tx.count("SETTLE_INTENTS", {**key, "settled": word})
            if due:  # its step is due now: its line (if gated) may admit it now
                tx.reopen_runs([run_id])
            return Resolved(kept, settled, bool(due))

        return self.dialect.write(resolving, runs=[run_id])

    def paid_calls(self, run_id: int, limit: int = 1000) -> list[PaidCall]:
        """The run's calls, each with its kept answer (if any) and its counts, in the order
        they were first made."""
        params = {"run_id": run_id, "limit": limit}

        def read(tx: Tx) -> tuple[list[Row], list[Row]]:
            now = {**params, "now": tx.now}
            return tx.rows("RUN_CALLS", now), tx.rows("RUN_INTENT_COUNTS", now)

        kept_rows, counted = self.dialect.read(read, snapshot=True)
        calls: dict[tuple[int, str, str], PaidCall] = {}
        for t, n, h, a, o, k, at, r, u, ut in kept_rows:
            calls[(int(t), n, h)] = PaidCall(int(t), n, h, int(a), o,
                                             None if k is None else int(k), float(at), int(r),
                                             int(u), int(ut))  # fmt: skip
        for t, n, h, made, again, unknown, first in counted:
            found = calls.get((int(t), n, h))
            base = found or PaidCall(int(t), n, h, 0, "", None, float(first), 0, 0, 0)
            calls[(int(t), n, h)] = PaidCall(
                base.task_id, n, h, base.attempt, base.owner, base.tokens,
                min(base.at, float(first)), base.reused, base.unused, base.unused_tokens,
                int(made), int(again), int(unknown),
            )  # fmt: skip
        return sorted(calls.values(), key=lambda c: (c.at, c.task_id, c.name))[:limit]

    def call_timeline(self, run_id: int, limit: int = 1000) -> list[CallIntent]:
        """Every call the run made, in order: who made it, whether it was a payment again,
        when its answer came (or that it never did)."""
        params = {"run_id": run_id, "limit": max(1, int(limit))}
        rows = self.dialect.read(lambda tx: tx.rows("RUN_INTENTS", {**params, "now": tx.now}))
        return [CallIntent(int(t), n, h, int(a), o, bool(g), float(at),
                           None if ans is None else float(ans), s, bool(u))
                for t, n, h, a, o, g, at, ans, s, u in rows]  # fmt: skip

    def paid_call_totals(self) -> CallTotals:
        """Every call's numbers (the store's, whatever was pruned is gone from them)."""

        def read(tx: Tx) -> tuple[Row | None, Row | None]:
            return tx.one("CALL_TOTALS", {}), tx.one("INTENT_TOTALS", {"now": tx.now})

        kept, made = self.dialect.read(read, snapshot=True)
        calls, reused, unused, tokens, saved, unused_tokens = (
            int(v or 0) for v in (kept or (0,) * 6)
        )
        started, again, unknown = (int(v or 0) for v in (made or (0,) * 3))
        return CallTotals(calls, reused, unused, tokens, saved, unused_tokens, started, again,
                          unknown)  # fmt: skip

    def spend(self, by: str = "task", *, since: float = 0.0, limit: int = 100) -> list[Spend]:
        """Tokens and cost kept since ``since`` (a time, seconds since the epoch), per task
        (``by="task"``) or per value of a payload field (``by="tenant"``), most spent first:
        each paid call's (paid again included) and each committed ``ctx.usage``."""
        params: dict[str, object] = {"since": float(since), "limit": max(1, int(limit))}
        if by == "task":
            name = "SPEND_BY_TASK"
        else:
            field = check_name(by, "spend's --by")
            if any(c in field for c in '"\\') or len(field) > MAX_NAME:
                raise StoreError(f"spend's --by {by!r}: a payload field name has no quotes")
            params.update(field=field, path=f'$."{field}"')
            name = "SPEND_BY_FIELD"
        rows = self.dialect.read(lambda tx: tx.rows(name, params))
        return [Spend(None if k is None else str(k), int(e), int(c), int(t or 0),
                      None if cost is None else float(cost))
                for k, e, c, t, cost in rows]  # fmt: skip

    def forget_call(self, run_id: int, name: str) -> int:
        """Drop the run's kept calls named ``name`` (every step's): the next attempt pays
        afresh. Returns how many went; RunNotFound, or StoreError when there was none."""
        check_name(name, "a call's name")

        def forget(tx: Tx) -> int:
            if tx.one("RUN_STATUS", {"run_id": run_id}) is None:
                raise RunNotFound(run_id)
            params = {"run_id": run_id, "name": name}
            tx.count("FORGET_INTENTS", params)  # their outcomes no longer stop a new call
            return len(tx.rows("FORGET_CALL", params))

        gone = self.dialect.write(forget)
        if gone == 0:
            raise StoreError(f"run {run_id} has no paid call named {name!r}")
        return gone


def _begin(tx: Tx, lease: Lease, key: CallKey, unknown: Unknown) -> CallStart:
    """``begin_call``'s transaction for one call (one item of a batch's)."""
    params = key.params()
    tx.one("LOCK_CALL", params)  # racing attempts see each other's intents
    row = tx.one("FIND_CALL", params)
    if row is not None:
        tx.count("COUNT_REUSE", params)
        return CallStart("reused", _kept(row, "reused"))
    earlier = tx.one("EARLIER_INTENTS", params)
    made, open_ = (int(earlier[0]), int(earlier[1])) if earlier else (0, 0)
    if unknown == "park" and open_:
        return CallStart("park" if live(tx, lease) else "lost")
    again = made > 0
    row = tx.one("INSERT_INTENT", {**params, **fence(lease, tx.now), "again": again})
    if row is None:  # the lease is live but the run is over (cancelled), or lost
        return CallStart("over" if live(tx, lease) else "lost")
    left = None if row[1] is None else float(row[1])
    return CallStart("call", intent=int(row[0]), again=again, left=left)


def _keep(
    tx: Tx, lease: Lease, key: CallKey, result: JSON, text: str, tokens: int | None,
    cost: float | None, intent: int | None,
) -> KeptCall:  # fmt: skip
    """``keep_call``'s transaction for one answer (one item of a batch's)."""
    got = tx.keep_call(Keep(key.run_id, key.task_id, key.name, key.request_hash, text,
                            lease.attempt, lease.owner, tokens, intent))  # fmt: skip
    if got.outcome == "answered":
        return _kept_before(tx, lease, key, result, tokens)  # a retried keep
    if intent is not None and (tokens is not None or cost is not None):
        tx.count("INSERT_USAGE", usage_row(lease, key.name, Usage(tokens, cost), tx.now))
    if got.outcome == "kept":
        return KeptCall(result, lease.attempt, tokens, "kept")
    if got.outcome == "none":  # nothing kept, ever: the run is over, or the step done
        return _refused(tx, lease, result, tokens)
    return _kept((got.result, got.attempt, got.tokens), "lost_race")


def _kept_before(tx: Tx, lease: Lease, key: CallKey, result: JSON, tokens: int | None) -> KeptCall:
    """A keep retried after its first try landed (the commit's answer was lost): what that
    try did, read back (never counted twice)."""
    row = tx.one("KEPT_ANSWER", key.params())
    if row is None:
        return _refused(tx, lease, result, tokens)
    own = int(row[1]) == lease.attempt and str(row[3]) == lease.owner
    return _kept(row, "kept" if own else "lost_race")


def _refused(tx: Tx, lease: Lease, result: JSON, tokens: int | None) -> KeptCall:
    """No answer can be kept: ``ended`` when ``lease`` is still live (its run is over:
    cancelled), else ``refused`` (the step moved on without it)."""
    return KeptCall(result, lease.attempt, tokens, "ended" if live(tx, lease) else "refused")
