"""The SQLite backend of the lease protocol (docs/protocol.md, R1-R7). Connection plumbing lives
in ``sqlite_base``, every SQL statement in ``sqlite_sql``, producers in ``sqlite_producer``,
reads in ``sqlite_reads``; this module is the protocol itself and the operators' writes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..base import Commit, Store
from ..codec import commit_params, dumps, loads
from ..errors import InvalidPayload, RunNotFound
from ..types import JSON, BatchOutcome, CasResult, ClaimRequest, Lease
from . import sql as q
from .dialect import Params
from .producer import SQLiteProducer
from .reads import SQLiteReads
from .views import SQLiteViews

__all__ = ["SQLiteStore"]


class SQLiteStore(SQLiteProducer, SQLiteReads, SQLiteViews, Store):
    # -- claims (R1, R6) -----------------------------------------------------------------------
    def _claim(self, c: sqlite3.Connection, now: float, req: ClaimRequest) -> list[Lease]:
        """Up to ``req.limit`` leases, each of a different run. Each turn either hands out
        leases or fails runs (attempts exhausted, payload undecodable): it terminates."""
        leases: list[Lease] = []
        sql = q.CLAIM if req.queues is None else q.CLAIM_QUEUES
        params: Params = {"owner": req.owner, "ttl": float(req.ttl), "now": now}
        if req.queues is not None:
            params["queues"] = json.dumps(list(req.queues))
        while len(leases) < req.limit:
            ask = req.limit - len(leases)
            rows = c.execute(sql, {**params, "limit": ask}).fetchall()
            for row in sorted(rows):
                lease = self._lease(c, now, req, row)
                if lease is not None:
                    leases.append(lease)
            if len(rows) < ask:  # it took every claimable run there was
                break
        return leases

    def _lease(
        self, c: sqlite3.Connection, now: float, req: ClaimRequest, row: tuple[Any, ...]
    ) -> Lease | None:
        task_id, run_id, name, payload, attempts, base, expires_at, takeover = row
        if attempts - base > req.max_attempts:  # R6: attempt max+1 never runs
            self._attempt_ended(c, {"task_id": task_id, "now": now}, "exhausted")
            (error,) = c.execute(q.DROP_EXHAUSTED_LEASE, {"task_id": task_id}).fetchone()
            # no handler raised: every attempt died, timed out or lost its lease
            error = error or (
                f"{req.max_attempts} attempts of task {name!r} ended without a commit (the "
                "worker died, timed out or lost its lease each time)"
            )
            self._fail(c, now, run_id, "task_attempts_exhausted", error)
            return None
        state, revision = c.execute(q.RUN_STATE, {"run_id": run_id}).fetchone()
        try:
            decoded = loads(payload, "its payload"), loads(state, "its run's state")
        except InvalidPayload as exc:  # never kill the claimer: fail that run, claim on
            self._attempt_ended(c, {"task_id": task_id, "now": now}, "failed", str(exc))
            c.execute(q.DROP_EXHAUSTED_LEASE, {"task_id": task_id})
            self._fail(c, now, run_id, "undecodable_payload", f"task {task_id}: {exc}")
            return None
        return Lease(
            task_id=task_id,
            run_id=run_id,
            task=name,
            payload=decoded[0],
            attempt=attempts,
            owner=req.owner,
            expires_at=float(expires_at),
            claimed_at=now,
            state=decoded[1],
            revision=revision,
            tries=attempts - base,
            takeover=bool(takeover),
        )

    @staticmethod
    def _fail(c: sqlite3.Connection, now: float, run_id: int, reason: str, error: str) -> None:
        params = {"run_id": run_id, "reason": reason, "error": error, "now": now}
        c.execute(q.FAIL_RUN, params)

    # -- renewals (R3) -------------------------------------------------------------------------
    @staticmethod
    def _fence(lease: Lease, now: float) -> Params:
        return {
            "task_id": lease.task_id,
            "owner": lease.owner,
            "attempt": lease.attempt,
            "now": now,
            "run_id": lease.run_id,
        }

    @staticmethod
    def _rejected(c: sqlite3.Connection, fence: Params, op: str) -> None:
        """Keep a refused write as evidence, in the transaction that refused it."""
        c.execute(q.INSERT_REJECTION, {**fence, "op": op})

    def renew_until(self, lease: Lease, ttl: float) -> float | None:
        return self.renew_many([lease], ttl)[0]

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[float | None]:
        if not leases:
            return []
        owners = {lease.owner for lease in leases}
        if len(owners) != 1:
            raise ValueError("renew_many renews the leases of one owner")
        pairs = json.dumps([[lease.task_id, lease.attempt] for lease in leases])

        def tx(c: sqlite3.Connection, now: float) -> list[float | None]:
            params = {"pairs": pairs, "owner": leases[0].owner, "ttl": float(ttl), "now": now}
            rows = c.execute(q.RENEW_MANY, params).fetchall()
            renewed = {(task_id, attempt): at for task_id, attempt, at in rows}
            answers = [renewed.get((lease.task_id, lease.attempt)) for lease in leases]
            for lease, at in zip(leases, answers, strict=True):
                if at is None:
                    self._rejected(c, self._fence(lease, now), "renew")
            return [None if at is None else float(at) for at in answers]

        return self._write(tx)

    # -- fenced writes (R2, R5) ----------------------------------------------------------------
    def ack(self, lease: Lease) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            fence = self._fence(lease, now)
            if c.execute(q.TASK_DONE, fence).rowcount == 0:
                self._rejected(c, fence, "ack")
                return False
            c.execute(q.SUCCEED_IF_EMPTY, fence)
            return True

        return self._write(tx)

    def compare_and_set(self, lease: Lease, expected_revision: int, new_state: JSON) -> CasResult:
        state = dumps(new_state, "state")

        def tx(c: sqlite3.Connection, now: float) -> CasResult:
            params = {**self._fence(lease, now), "state": state, "revision": expected_revision}
            if c.execute(q.CAS_STATE, params).rowcount == 0:
                return self._refused(c, params, "compare_and_set")
            return CasResult.OK

        return self._write(tx)

    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        encoded = [commit_params(commit) for commit in commits]  # a bad value writes nothing

        def tx(c: sqlite3.Connection, now: float) -> BatchOutcome:
            results = tuple(
                self._apply(c, now, commit, params)
                for commit, params in zip(commits, encoded, strict=True)
            )
            leases = self._claim(c, now, claim) if claim is not None and claim.limit > 0 else []
            return BatchOutcome(results, tuple(leases))

        return self._write(tx, role="worker")

    def _apply(self, c: sqlite3.Connection, now: float, commit: Commit, p: Params) -> CasResult:
        params = {**p, **self._fence(commit.lease, now)}
        kind = commit.kind
        if kind in ("finish", "advance"):  # the hot path: the fence rides in the CAS
            cas = q.CAS_FINISH if kind == "finish" else q.CAS_STATE
            if c.execute(cas, params).rowcount == 0:
                return self._refused(c, params, kind)
            c.execute(q.TASK_DONE, params)
            if kind == "advance":
                if params["queue"] is not None:
                    c.execute(q.MOVE_RUN, params)
                c.execute(q.CAS_NEXT_TASK, params)
            return CasResult.OK
        if kind == "handback":  # fenced by the statement itself
            if c.execute(q.HANDBACK, params).rowcount == 0:
                self._rejected(c, params, kind)
                return CasResult.LEASE_LOST
            return CasResult.OK
        if c.execute(q.CHECK_FENCE, params).fetchone() is None:
            self._rejected(c, params, commit.kind)
            return CasResult.LEASE_LOST
        if kind == "release":
            self._attempt_ended(c, params, "released", commit.error)
            c.execute(q.RELEASE, params)
            if commit.error is not None:
                c.execute(q.RUN_ERROR, params)
            return CasResult.OK
        if kind == "drop":
            c.execute(q.TASK_DONE, params)
            return CasResult.OK
        if kind == "fail":
            if c.execute(q.FAIL_RUN, params).rowcount == 0:
                return CasResult.CONFLICT
            self._attempt_ended(c, params, "failed", commit.error)
            c.execute(q.TASK_FAILED, params)
            return CasResult.OK
        raise ValueError(f"unknown commit kind {kind!r}")

    def _refused(self, c: sqlite3.Connection, params: Params, op: str) -> CasResult:
        """A fenced CAS changed nothing: a lost lease (recorded) or a moved run."""
        if c.execute(q.CHECK_FENCE, params).fetchone() is None:
            self._rejected(c, params, op)
            return CasResult.LEASE_LOST
        return CasResult.CONFLICT

    # -- operators -----------------------------------------------------------------------------
    def _run_status(self, c: sqlite3.Connection, run_id: int) -> str:
        row = c.execute(q.RUN_STATUS, {"run_id": run_id}).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return str(row[0])

    def fail_run(self, run_id: int, reason: str, error: str | None = None) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            self._run_status(c, run_id)
            params = {"run_id": run_id, "reason": reason, "error": error, "now": now}
            return c.execute(q.FAIL_RUN, params).rowcount == 1

        return self._write(tx)

    def cancel_run(self, run_id: int) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            self._run_status(c, run_id)
            return c.execute(q.CANCEL_RUN, {"run_id": run_id, "now": now}).rowcount == 1

        return self._write(tx)

    def retry_run(self, run_id: int) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            if self._run_status(c, run_id) not in ("failed", "cancelled"):
                return False
            params = {"run_id": run_id, "now": now}
            if c.execute(q.PENDING_TASKS, params).fetchone()[0] == 0:
                return False
            c.execute(q.RETRY_RUN, params)
            self._attempts_dropped_by_retry(c, params)
            c.execute(q.RETRY_TASKS, params)
            return True

        return self._write(tx)

    def release_owner(self, owner: str) -> int:
        return self._write(
            lambda c, now: c.execute(q.RELEASE_OWNER, {"owner": owner, "now": now}).rowcount
        )

    def prune(self, older_than: float, *, batch: int = 1000) -> int:
        def delete(query: str) -> int:
            params = {"age": float(older_than), "limit": int(batch)}
            return self._write(lambda c, now: c.execute(query, {**params, "now": now}).rowcount)

        total = 0
        while (n := delete(q.PRUNE_RUNS)) > 0:
            total += n
        while delete(q.PRUNE_REJECTIONS) > 0:
            pass
        return total
