"""Paid calls (issue 27, docs/protocol.md B13), written once: a step's expensive call
(``ctx.once``) is kept the moment it returns, in its own small transaction, so the next attempt
of the same step reuses it instead of paying again.

- ``reuse_call``: the kept answer of this step's call with this request hash, if any (and the
  reuse counted); a different request never finds another's answer.
- ``keep_call``: keep a paid answer. Any attempt of the step may (a lease lost meanwhile too:
  the call was paid for, it is an observation, not a state change), but only while the run is
  alive and the step not done; the run's state stays fenced as always. The first kept answer
  wins: a later one is counted as paid, unused, and the caller gets the winner's.
- ``paid_calls`` (``show``, the dashboard), ``paid_call_totals`` (metrics, the chaos report),
  ``forget_call`` (an operator's fresh start).
"""

from __future__ import annotations

from typing import Literal

from ..calls import MAX_RESULT, CallKey, CallTotals, KeptCall, PaidCall
from ..codec import check_name, dumps, loads
from ..dialect import Dialect, Row, Tx
from ..errors import RunNotFound, StoreError
from ..types import JSON, Lease


def _kept(row: Row, outcome: Literal["reused", "kept", "lost_race"]) -> KeptCall:
    return KeptCall(loads(row[0], "a kept call"), int(row[1]),
                    None if row[2] is None else int(row[2]), outcome)  # fmt: skip


class Calls:
    dialect: Dialect

    def reuse_call(self, key: CallKey) -> KeptCall | None:
        """The kept answer of ``key``, its reuse counted; None when there is none."""
        params = key.params()
        row = self.dialect.read(lambda tx: tx.one("FIND_CALL", params))
        if row is None:
            return None
        self.dialect.write(lambda tx: tx.count("COUNT_REUSE", params))
        return _kept(row, "reused")

    def keep_call(
        self, lease: Lease, key: CallKey, result: JSON, tokens: int | None = None
    ) -> KeptCall:
        """Keep ``result``, paid by ``lease``'s attempt (lost or not), while the run is alive
        and ``lease``'s step not done. Returns what the step's call now answers."""
        text = dumps(result, f"the result of once({key.name!r})", MAX_RESULT)
        params = {**key.params(), "result": text, "attempt": lease.attempt,
                  "owner": lease.owner, "tokens": tokens}  # fmt: skip

        def keep(tx: Tx) -> KeptCall:
            if tx.count("KEEP_CALL", {**params, "now": tx.now}) == 1:
                return KeptCall(result, lease.attempt, tokens, "kept")
            row = tx.one("CALL_LOSER", params)
            if row is None:
                return KeptCall(result, lease.attempt, tokens, "refused")
            return _kept(row, "lost_race")

        return self.dialect.write(keep)

    def paid_calls(self, run_id: int, limit: int = 1000) -> list[PaidCall]:
        """The run's kept calls, in the order they were paid."""
        rows = self.dialect.read(
            lambda tx: tx.rows("RUN_CALLS", {"run_id": run_id, "limit": limit})
        )
        return [
            PaidCall(int(t), n, h, int(a), o, None if k is None else int(k), float(at), int(r),
                     int(u), int(ut))
            for t, n, h, a, o, k, at, r, u, ut in rows
        ]  # fmt: skip

    def paid_call_totals(self) -> CallTotals:
        """Every kept call's numbers (the store's, whatever was pruned is gone from them)."""
        row = self.dialect.read(lambda tx: tx.one("CALL_TOTALS", {}))
        return CallTotals(*(int(v or 0) for v in row)) if row else CallTotals()

    def forget_call(self, run_id: int, name: str) -> int:
        """Drop the run's kept calls named ``name`` (every step's): the next attempt pays
        afresh. Returns how many went; RunNotFound, or StoreError when there was none."""
        check_name(name, "a call's name")

        def forget(tx: Tx) -> int:
            if tx.one("RUN_STATUS", {"run_id": run_id}) is None:
                raise RunNotFound(run_id)
            return len(tx.rows("FORGET_CALL", {"run_id": run_id, "name": name}))

        gone = self.dialect.write(forget)
        if gone == 0:
            raise StoreError(f"run {run_id} has no paid call named {name!r}")
        return gone
