"""The PostgreSQL backend of the lease protocol (DESIGN.md R1-R7; why the claim is race-free:
docs/protocol.md). Plumbing lives in ``postgres_base`` and ``postgres_listen``, every protocol
statement in ``postgres_sql``, producers in ``postgres_producer``, reads in ``postgres_reads``;
this module is the protocol itself and the operators' writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base import Commit, Store
from ..codec import commit_params, dumps, loads
from ..errors import InvalidPayload, RunNotFound
from ..types import JSON, BatchOutcome, CasResult, ClaimRequest, Lease
from . import sql as q
from .dialect import Cursor, Params
from .producer import PostgresProducer
from .reads import PostgresReads

__all__ = ["PostgresStore"]

_CLAIM_TURNS = 1000  # each turn hands out leases, fails runs, or re-reads runs it holds
# the commits that are one fenced statement each (a row back: written; none: refused), by the
# statement's name in postgres_sql (looked up at each call, like every other statement)
_ONE_STATEMENT = {"finish": "FINISH", "advance": "ADVANCE", "release": "RELEASE",
                  "handback": "HANDBACK"}  # fmt: skip


def _exec(cur: Cursor, query: str, params: Params) -> Cursor:
    return cur.execute(query, params, prepare=True)


def _count(cur: Cursor, query: str, params: Params) -> int:
    """Rows changed (the statement RETURNs one row per row changed)."""
    return len(_exec(cur, query, params).fetchall())


def _one(cur: Cursor, query: str, params: Params) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = _exec(cur, query, params).fetchone()
    return row


class PostgresStore(PostgresProducer, PostgresReads, Store):
    # -- claims (R1, R6) -----------------------------------------------------------------------
    def _claim(self, c: Cursor, now: float | None, req: ClaimRequest) -> list[Lease]:
        """Up to ``req.limit`` leases, each of a different run. Each turn hands out leases,
        fails runs (attempts exhausted, payload undecodable) or finds runs whose head its
        snapshot could not see yet (they are ours now: the next turn sees them)."""
        queues = None if req.queues is None else tuple(dict.fromkeys(req.queues))
        if queues == ():
            return []
        query = q.claim_sql(None if queues is None else len(queues))
        params: Params = {"owner": req.owner, "ttl": float(req.ttl), "now": now}
        if queues is not None:
            params["queues"] = list(queues)
        leases: list[Lease] = []
        unseen = 0
        for _ in range(_CLAIM_TURNS):
            if len(leases) >= req.limit:
                break
            ask = req.limit - len(leases)
            rows = _exec(c, query, {**params, "limit": ask}).fetchall()
            if not rows:
                break
            got = [row for row in rows if row[3] is not None]
            unseen = 0 if got else unseen + 1
            if unseen > 1:  # held runs whose head even a fresh snapshot cannot lease
                break
            for row in got:
                lease = self._lease(c, now, req, row)
                if lease is not None:
                    leases.append(lease)
            if len(got) == len(rows) < ask:  # it took every run it could lock and lease
                break
        return leases

    def _lease(
        self, c: Cursor, now: float | None, req: ClaimRequest, row: tuple[Any, ...]
    ) -> Lease | None:
        run_id, state, revision, task_id, name, payload, attempts, base = row[:8]
        expires_at, claimed_at, takeover = row[8:]
        if attempts - base > req.max_attempts:  # R6: attempt max+1 never runs
            self._attempt_ended(c, task_id, now, "exhausted")
            dropped = _one(c, q.DROP_EXHAUSTED_LEASE, {"task_id": task_id})
            # no handler raised: every attempt died, timed out or lost its lease
            error = (dropped[0] if dropped else None) or (
                f"{req.max_attempts} attempts of task {name!r} ended without a commit (the "
                "worker died, timed out or lost its lease each time)"
            )
            self._fail(c, now, run_id, "task_attempts_exhausted", error)
            return None
        try:
            decoded = loads(payload, "its payload"), loads(state, "its run's state")
        except InvalidPayload as exc:  # never kill the claimer: fail that run, claim on
            self._attempt_ended(c, task_id, now, "failed", str(exc))
            _exec(c, q.DROP_EXHAUSTED_LEASE, {"task_id": task_id})
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
            claimed_at=float(claimed_at),
            state=decoded[1],
            revision=revision,
            tries=attempts - base,
            takeover=bool(takeover),
        )

    @staticmethod
    def _fail(c: Cursor, now: float | None, run_id: int, reason: str, error: str) -> None:
        params = {"run_id": run_id, "reason": reason, "error": error, "now": now}
        _exec(c, q.FAIL_RUN, params)

    @staticmethod
    def _attempt_ended(
        c: Cursor, task_id: int, now: float | None, outcome: str, error: str | None = None
    ) -> None:
        """Keep the current attempt of ``task_id`` before its lease is cleared."""
        params = {"task_id": task_id, "now": now, "outcome": outcome, "error": error}
        _exec(c, q.ATTEMPT_ENDED, params)

    # -- renewals (R3) -------------------------------------------------------------------------
    @staticmethod
    def _fence(lease: Lease, now: float | None) -> Params:
        return {
            "task_id": lease.task_id,
            "owner": lease.owner,
            "attempt": lease.attempt,
            "now": now,
            "run_id": lease.run_id,
        }

    @staticmethod
    def _rejected(c: Cursor, fence: Params, op: str) -> None:
        """Keep a refused write as evidence, in the transaction that refused it."""
        _exec(c, q.INSERT_REJECTION, {**fence, "op": op})

    def renew_until(self, lease: Lease, ttl: float) -> float | None:
        return self.renew_many([lease], ttl)[0]

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[float | None]:
        if not leases:
            return []
        if len({lease.owner for lease in leases}) != 1:
            raise ValueError("renew_many renews the leases of one owner")
        params: Params = {
            "run_ids": sorted({lease.run_id for lease in leases}),
            "task_ids": [lease.task_id for lease in leases],
            "attempts": [lease.attempt for lease in leases],
            "runs": [lease.run_id for lease in leases],
            "owner": leases[0].owner,
            "ttl": float(ttl),
        }

        def tx(c: Cursor, now: float | None) -> list[float | None]:
            rows = _exec(c, q.RENEW_MANY, {**params, "now": now}).fetchall()
            renewed = {(task_id, attempt): at for task_id, attempt, at in rows}
            return [
                None if (e := renewed.get((lease.task_id, lease.attempt))) is None else float(e)
                for lease in leases
            ]

        return self._write(tx, runs=params["run_ids"], single=True)

    # -- fenced writes (R2, R5) ----------------------------------------------------------------
    def ack(self, lease: Lease) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            fence = self._fence(lease, now)
            if _count(c, q.TASK_DONE, fence) == 0:
                self._rejected(c, fence, "ack")
                return False
            _exec(c, q.SUCCEED_IF_EMPTY, fence)
            return True

        return self._write(tx, runs=[lease.run_id])

    def compare_and_set(self, lease: Lease, expected_revision: int, new_state: JSON) -> CasResult:
        state = dumps(new_state, "state")

        def tx(c: Cursor, now: float | None) -> CasResult:
            params = {**self._fence(lease, now), "state": state, "revision": expected_revision}
            if _count(c, q.CAS_STATE, params) == 0:
                return self._refused(c, params, "compare_and_set")
            return CasResult.OK

        return self._write(tx, runs=[lease.run_id])

    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        encoded = [commit_params(commit) for commit in commits]  # a bad value writes nothing

        def tx(c: Cursor, now: float | None) -> BatchOutcome:
            results = tuple(self._apply_all(c, now, commits, encoded))
            leases: list[Lease] = []
            if claim is not None and claim.limit > 0:
                # the claim's own "now": the injected one, or the database's in the statement
                leases = self._claim(c, self._now_param(), claim)
            return BatchOutcome(results, tuple(leases))

        out = self._write(tx, runs=[commit.lease.run_id for commit in commits])
        if out.leases:
            self._listener.idle_over()
        return out

    def _apply_all(
        self, c: Cursor, now: float | None, commits: Sequence[Commit], encoded: list[Params]
    ) -> list[CasResult]:
        """Every commit, each judged on its own. Commits of different runs, each one statement
        (finish, advance, release, hand-back), touch disjoint rows: they are sent together,
        one pipelined ``executemany`` per kind, and read back in one round trip; anything
        else (a run twice, a drop or a fail) goes one by one, in order."""
        runs = [commit.lease.run_id for commit in commits]
        if (
            len(commits) < 2
            or len(set(runs)) < len(runs)
            or any(commit.kind not in _ONE_STATEMENT for commit in commits)
        ):
            return [self._apply(c, now, m, p) for m, p in zip(commits, encoded, strict=True)]
        by_kind: dict[str, list[int]] = {}
        for i, commit in enumerate(commits):
            by_kind.setdefault(commit.kind, []).append(i)
        changed = [0] * len(commits)
        for kind, members in by_kind.items():
            each = [{**encoded[i], **self._fence(commits[i].lease, now)} for i in members]
            c.executemany(getattr(q, _ONE_STATEMENT[kind]), each, returning=True)
            for n, i in enumerate(members):
                if n:
                    c.nextset()
                changed[i] = len(c.fetchall())
        results = []
        for i, commit in enumerate(commits):
            if changed[i]:
                results.append(CasResult.OK)
                continue
            params = {**encoded[i], **self._fence(commit.lease, now)}
            if commit.kind in ("finish", "advance"):
                results.append(self._refused(c, params, commit.kind))
            else:
                self._rejected(c, params, commit.kind)
                results.append(CasResult.LEASE_LOST)
        return results

    def _apply(self, c: Cursor, now: float | None, commit: Commit, p: Params) -> CasResult:
        params = {**p, **self._fence(commit.lease, now)}
        kind = commit.kind
        if kind in ("finish", "advance"):  # the hot path: one statement, the fence in the CAS
            if _count(c, q.FINISH if kind == "finish" else q.ADVANCE, params) == 0:
                return self._refused(c, params, kind)
            return CasResult.OK
        if kind in ("handback", "release"):  # one statement each, fenced by itself
            if _count(c, q.HANDBACK if kind == "handback" else q.RELEASE, params) == 0:
                self._rejected(c, params, kind)
                return CasResult.LEASE_LOST
            return CasResult.OK
        if _one(c, q.CHECK_FENCE, params) is None:
            self._rejected(c, params, kind)
            return CasResult.LEASE_LOST
        if kind == "drop":
            _exec(c, q.TASK_DONE, params)
            return CasResult.OK
        if kind == "fail":
            if _count(c, q.FAIL_RUN, params) == 0:
                return CasResult.CONFLICT
            self._attempt_ended(c, commit.lease.task_id, now, "failed", commit.error)
            _exec(c, q.TASK_FAILED, params)
            return CasResult.OK
        raise ValueError(f"unknown commit kind {kind!r}")

    def _refused(self, c: Cursor, params: Params, op: str) -> CasResult:
        """A fenced CAS changed nothing: a lost lease (recorded) or a moved run."""
        if _one(c, q.CHECK_FENCE, params) is None:
            self._rejected(c, params, op)
            return CasResult.LEASE_LOST
        return CasResult.CONFLICT

    # -- operators -----------------------------------------------------------------------------
    @staticmethod
    def _lock_run(c: Cursor, run_id: int) -> str:
        row = _one(c, q.LOCK_RUN, {"run_id": run_id})
        if row is None:
            raise RunNotFound(run_id)
        return str(row[0])

    def fail_run(self, run_id: int, reason: str, error: str | None = None) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            self._lock_run(c, run_id)
            params = {"run_id": run_id, "reason": reason, "error": error, "now": now}
            return _count(c, q.FAIL_RUN, params) == 1

        return self._write(tx, runs=[run_id])

    def cancel_run(self, run_id: int) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            self._lock_run(c, run_id)
            return _count(c, q.CANCEL_RUN, {"run_id": run_id, "now": now}) == 1

        return self._write(tx, runs=[run_id])

    def retry_run(self, run_id: int) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            if self._lock_run(c, run_id) not in ("failed", "cancelled"):
                return False
            params = {"run_id": run_id, "now": now}
            row = _one(c, q.PENDING_TASKS, params)
            if row is None or row[0] == 0:
                return False
            _exec(c, q.RETRY_RUN, params)
            _exec(c, q.ATTEMPTS_DROPPED_BY_RETRY, params)
            _exec(c, q.RETRY_TASKS, params)
            return True

        return self._write(tx, runs=[run_id])

    def release_owner(self, owner: str) -> int:
        def tx(c: Cursor, now: float | None) -> int:
            _exec(c, q.LOCK_OWNER_RUNS, {"owner": owner})
            return int(_count(c, q.RELEASE_OWNER, {"owner": owner, "now": now}))

        return self._write(tx)

    def prune(self, older_than: float, *, batch: int = 1000) -> int:
        """Delete finished runs (with their tasks) that finished more than ``older_than``
        seconds ago, ``batch`` runs per transaction; returns how many runs went."""
        params = {"age": float(older_than), "limit": int(batch), "now": self._now_param()}

        def delete(query: str) -> int:
            return self._write(lambda c, _now: int(_count(c, query, params)))

        total = 0
        while (n := delete(q.PRUNE_RUNS)) > 0:
            total += n
        while delete(q.PRUNE_REJECTIONS) > 0:
            pass
        return total
