"""The PostgreSQL backend of the lease protocol (DESIGN.md R1-R7; why the claim is race-free:
docs/protocol.md). Plumbing lives in ``postgres_base``; every SQL statement in ``postgres_sql``."""

from __future__ import annotations

from typing import Any

from . import postgres_sql as q
from .base import Commit, Store
from .codec import dumps
from .errors import InvalidPayload, RunNotFound
from .postgres_base import Cursor, Params, PostgresBase
from .types import (
    JSON,
    CasResult,
    ClaimRequest,
    CommitOutcome,
    Lease,
    OwnerLease,
    Rejection,
    Run,
    Stats,
    TaskInfo,
)

__all__ = ["PostgresStore"]

_CLAIM_TURNS = 1000  # each turn hands out a lease, fails one exhausted run, or re-reads one run


def _exec(cur: Cursor, query: str, params: Params) -> Cursor:
    return cur.execute(query, params, prepare=True)


def _count(cur: Cursor, query: str, params: Params) -> int:
    """Rows changed (the statement RETURNs one row per row changed)."""
    return len(_exec(cur, query, params).fetchall())


def _one(cur: Cursor, query: str, params: Params) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = _exec(cur, query, params).fetchone()
    return row


class PostgresStore(PostgresBase, Store):
    # -- producers -----------------------------------------------------------------------------
    def start_run(
        self, task: str, payload: JSON = None, state: JSON = None, delay: float = 0
    ) -> int:
        if not task:
            raise InvalidPayload("task name must not be empty")
        params = {
            "state": dumps(state, "state"),
            "payload": dumps(payload, "payload"),
            "name": task,
            "delay": max(0.0, float(delay)),
        }

        def tx(c: Cursor, now: float | None) -> int:
            row = _one(c, q.START_RUN, {**params, "now": now})
            assert row is not None
            return int(row[0])

        return self._write(tx)

    # -- the lease protocol --------------------------------------------------------------------
    def claim(self, owner: str, ttl: float, *, max_attempts: int = 3) -> Lease | None:
        request = ClaimRequest(owner, ttl, max_attempts)
        lease = self._write(lambda c, now: self._claim(c, now, request))
        if lease is not None:
            self._listener.idle_over()
        return lease

    def _claim(self, c: Cursor, now: float | None, req: ClaimRequest) -> Lease | None:
        params = {"owner": req.owner, "ttl": float(req.ttl), "now": now}
        for _ in range(_CLAIM_TURNS):
            row = _one(c, q.CLAIM, params)
            if row is None:
                return None  # no run is claimable
            run_id, state, revision, task_id = row[:4]
            if task_id is None:
                # We locked the run, but its head was written after this statement's snapshot:
                # claim again; the next statement's snapshot sees it (we hold the run).
                continue
            name, payload, attempts, base, expires_at, claimed_at, takeover = row[4:]
            if attempts - base > req.max_attempts:  # R6: attempt max+1 never runs
                dropped = _one(c, q.DROP_EXHAUSTED_LEASE, {"task_id": task_id})
                error = dropped[0] if dropped else None
                _exec(
                    c,
                    q.FAIL_RUN,
                    {
                        "run_id": run_id,
                        "reason": "task_attempts_exhausted",
                        # no handler raised: every attempt died, timed out or lost its lease
                        "error": error
                        or f"{req.max_attempts} attempts of task {name!r} ended without a "
                        "commit (the worker died, timed out or lost its lease each time)",
                        "now": now,
                    },
                )
                continue
            return Lease(
                task_id=task_id,
                run_id=run_id,
                task=name,
                payload=payload,
                attempt=attempts,
                owner=req.owner,
                expires_at=float(expires_at),
                claimed_at=float(claimed_at),
                state=state,
                revision=revision,
                tries=attempts - base,
                takeover=bool(takeover),
            )
        return None

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
        def tx(c: Cursor, now: float | None) -> float | None:
            fence = self._fence(lease, now)
            row = _one(c, q.RENEW, {**fence, "ttl": float(ttl)})
            if row is None:
                self._rejected(c, fence, "renew")
                return None
            return float(row[0])

        return self._write(tx, run_id=lease.run_id)

    def ack(self, lease: Lease) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            fence = self._fence(lease, now)
            if _count(c, q.TASK_DONE, fence) == 0:
                self._rejected(c, fence, "ack")
                return False
            _exec(c, q.SUCCEED_IF_EMPTY, fence)
            return True

        return self._write(tx, run_id=lease.run_id)

    def release(self, lease: Lease, delay: float = 0, *, error: str | None = None) -> bool:
        commit = Commit(lease, "release", delay=delay, error=error)
        return self.commit(commit).result is CasResult.OK

    def compare_and_set(self, lease: Lease, expected_revision: int, new_state: JSON) -> CasResult:
        state = dumps(new_state, "state")

        def tx(c: Cursor, now: float | None) -> CasResult:
            params = {**self._fence(lease, now), "state": state, "revision": expected_revision}
            if _count(c, q.CAS_STATE, params) == 0:
                return self._refused(c, params, "compare_and_set")
            return CasResult.OK

        return self._write(tx, run_id=lease.run_id)

    def commit(self, commit: Commit, *, claim: ClaimRequest | None = None) -> CommitOutcome:
        encoded = self._encode(commit)

        def tx(c: Cursor, now: float | None) -> CommitOutcome:
            result = self._apply(c, now, commit, encoded)
            if claim is None:
                return CommitOutcome(result)
            # a claim needs its own "now": the injected one, or the database's in the statement
            return CommitOutcome(result, self._claim(c, self._now_param(), claim))

        outcome = self._write(tx, run_id=commit.lease.run_id)
        if outcome.next_lease is not None:
            self._listener.idle_over()
        return outcome

    @staticmethod
    def _encode(commit: Commit) -> Params:
        """Encode JSON before the transaction starts: a bad value writes nothing."""
        params: Params = {"delay": max(0.0, float(commit.delay)), "error": commit.error}
        if commit.kind in ("finish", "advance"):
            params["state"] = dumps(commit.new_state, "state")
            params["revision"] = commit.expected_revision
        if commit.kind == "finish":
            params["result"] = dumps(commit.result, "result")
        if commit.kind == "advance":
            if not commit.next_task:
                raise InvalidPayload("advance needs the name of the next task")
            params["name"] = commit.next_task
            params["payload"] = dumps(commit.next_payload, "payload")
        if commit.kind == "fail":
            params["reason"] = commit.reason or "failed"
        return params

    def _apply(self, c: Cursor, now: float | None, commit: Commit, p: Params) -> CasResult:
        params = {**p, **self._fence(commit.lease, now)}
        kind = commit.kind
        if kind in ("finish", "advance"):  # the hot path: one statement, the fence in the CAS
            if _count(c, q.FINISH if kind == "finish" else q.ADVANCE, params) == 0:
                return self._refused(c, params, kind)
            return CasResult.OK
        if _one(c, q.CHECK_FENCE, params) is None:
            self._rejected(c, params, commit.kind)
            return CasResult.LEASE_LOST
        if kind == "release":
            _exec(c, q.RELEASE, params)
            if commit.error is not None:
                _exec(c, q.RUN_ERROR, params)
            return CasResult.OK
        if kind == "drop":
            _exec(c, q.TASK_DONE, params)
            return CasResult.OK
        if kind == "fail":
            if _count(c, q.FAIL_RUN, params) == 0:
                return CasResult.CONFLICT
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

        return self._write(tx, run_id=run_id)

    def cancel_run(self, run_id: int) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            self._lock_run(c, run_id)
            return _count(c, q.CANCEL_RUN, {"run_id": run_id, "now": now}) == 1

        return self._write(tx, run_id=run_id)

    def retry_run(self, run_id: int) -> bool:
        def tx(c: Cursor, now: float | None) -> bool:
            if self._lock_run(c, run_id) not in ("failed", "cancelled"):
                return False
            params = {"run_id": run_id, "now": now}
            row = _one(c, q.PENDING_TASKS, params)
            if row is None or row[0] == 0:
                return False
            _exec(c, q.RETRY_RUN, params)
            _exec(c, q.RETRY_TASKS, params)
            return True

        return self._write(tx, run_id=run_id)

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

    # -- reads ---------------------------------------------------------------------------------
    @staticmethod
    def _run(row: tuple[Any, ...]) -> Run:
        return Run(*row)

    def get_run(self, run_id: int) -> Run | None:
        row = self._read(lambda c, _now: _one(c, q.GET_RUN, {"run_id": run_id}))
        return None if row is None else self._run(row)

    @staticmethod
    def _task(r: tuple[Any, ...]) -> TaskInfo:
        return TaskInfo(*r)

    def get_tasks(self, run_id: int) -> list[TaskInfo]:
        rows = self._read(lambda c, _now: _exec(c, q.GET_TASKS, {"run_id": run_id}).fetchall())
        return [self._task(r) for r in rows]

    def get_task(self, task_id: int) -> TaskInfo | None:
        row = self._read(lambda c, _now: _one(c, q.GET_TASK, {"task_id": task_id}))
        return None if row is None else self._task(row)

    def fence_rejections(self, after: int = 0, limit: int = 10_000) -> list[Rejection]:
        params = {"after": after, "limit": limit}
        rows = self._read(lambda c, _now: _exec(c, q.LIST_REJECTIONS, params).fetchall())
        return [Rejection(*r) for r in rows]

    def integrity_violations(self) -> list[str]:
        def read(c: Cursor, now: float | None) -> list[str]:
            found = [
                f"task {t} of run {r} was committed by attempt {done} although attempt "
                f"{latest} had superseded it (a zombie write was accepted)"
                for t, r, done, latest in _exec(c, q.SUPERSEDED_COMMITS, {}).fetchall()
            ]
            found += [
                f"run {r} holds {n} live leases at once (its steps overlap)"
                for r, n in _exec(c, q.OVERLAPPING_LEASES, {"now": now}).fetchall()
            ]
            return found

        return self._read(read)

    def list_runs(self, status: str | None = None, limit: int = 100) -> list[Run]:
        query = q.LIST_RUNS if status is None else q.LIST_RUNS_BY_STATUS
        params = {"status": status, "limit": limit}
        rows = self._read(lambda c, _now: _exec(c, query, params).fetchall())
        return [self._run(r) for r in rows]

    def stats(self) -> Stats:
        def read(c: Cursor, now: float | None) -> Stats:
            runs = {s: int(n) for s, n in _exec(c, q.RUN_COUNTS, {}).fetchall()}
            row = _one(c, q.TASK_COUNTS, {"now": now})
            assert row is not None
            ready, delayed, leased, expired, at = row
            leases = [OwnerLease(*r) for r in _exec(c, q.LIVE_LEASES, {}).fetchall()]
            return Stats(float(at), runs, ready, delayed, leased, expired, leases)

        return self._read(read, snapshot=True)  # one snapshot for every count

    def next_ready_at(self) -> float | None:
        row = self._read(lambda c, _now: _one(c, q.NEXT_READY, {}))
        return None if row is None or row[0] is None else float(row[0])
