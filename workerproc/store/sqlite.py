"""The SQLite backend of the lease protocol (DESIGN.md R1-R7). Connection plumbing lives in
``sqlite_base``; every SQL statement in ``sqlite_sql``."""

from __future__ import annotations

import sqlite3
from typing import Any

from . import sqlite_sql as q
from .base import Commit, Store
from .codec import dumps
from .codec import loads as _loads
from .errors import InvalidPayload, RunNotFound
from .sqlite_base import Params, SQLiteBase
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

__all__ = ["SQLiteStore", "dumps"]


class SQLiteStore(SQLiteBase, Store):
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

        def tx(c: sqlite3.Connection, now: float) -> int:
            run_id = c.execute(q.INSERT_RUN, {**params, "now": now}).lastrowid
            assert run_id is not None
            c.execute(q.INSERT_TASK, {**params, "now": now, "run_id": run_id})
            return run_id

        return self._write(tx)

    # -- the lease protocol --------------------------------------------------------------------
    def claim(self, owner: str, ttl: float, *, max_attempts: int = 3) -> Lease | None:
        request = ClaimRequest(owner, ttl, max_attempts)
        return self._write(lambda c, now: self._claim(c, now, request))

    def _claim(self, c: sqlite3.Connection, now: float, req: ClaimRequest) -> Lease | None:
        params = {"owner": req.owner, "ttl": float(req.ttl), "now": now}
        while True:  # each turn either hands out a lease or fails one run: it terminates
            row = c.execute(q.CLAIM, params).fetchone()
            if row is None:
                return None
            task_id, run_id, name, payload, attempts, base, expires_at, takeover = row
            if attempts - base > req.max_attempts:  # R6: attempt max+1 never runs
                (error,) = c.execute(q.DROP_EXHAUSTED_LEASE, {"task_id": task_id}).fetchone()
                c.execute(
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
            state, revision = c.execute(q.RUN_STATE, {"run_id": run_id}).fetchone()
            return Lease(
                task_id=task_id,
                run_id=run_id,
                task=name,
                payload=_loads(payload),
                attempt=attempts,
                owner=req.owner,
                expires_at=float(expires_at),
                claimed_at=now,
                state=_loads(state),
                revision=revision,
                tries=attempts - base,
                takeover=bool(takeover),
            )

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
        def tx(c: sqlite3.Connection, now: float) -> float | None:
            fence = self._fence(lease, now)
            row = c.execute(q.RENEW, {**fence, "ttl": ttl}).fetchone()
            if row is None:
                self._rejected(c, fence, "renew")
                return None
            return float(row[0])

        return self._write(tx)

    def ack(self, lease: Lease) -> bool:
        def tx(c: sqlite3.Connection, now: float) -> bool:
            fence = self._fence(lease, now)
            if c.execute(q.TASK_DONE, fence).rowcount == 0:
                self._rejected(c, fence, "ack")
                return False
            c.execute(q.SUCCEED_IF_EMPTY, fence)
            return True

        return self._write(tx)

    def release(self, lease: Lease, delay: float = 0, *, error: str | None = None) -> bool:
        commit = Commit(lease, "release", delay=delay, error=error)
        return self.commit(commit).result is CasResult.OK

    def compare_and_set(self, lease: Lease, expected_revision: int, new_state: JSON) -> CasResult:
        state = dumps(new_state, "state")

        def tx(c: sqlite3.Connection, now: float) -> CasResult:
            params = {**self._fence(lease, now), "state": state, "revision": expected_revision}
            if c.execute(q.CAS_STATE, params).rowcount == 0:
                return self._refused(c, params, "compare_and_set")
            return CasResult.OK

        return self._write(tx)

    def commit(self, commit: Commit, *, claim: ClaimRequest | None = None) -> CommitOutcome:
        encoded = self._encode(commit)

        def tx(c: sqlite3.Connection, now: float) -> CommitOutcome:
            result = self._apply(c, now, commit, encoded)
            return CommitOutcome(result, self._claim(c, now, claim) if claim else None)

        return self._write(tx)

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

    def _apply(self, c: sqlite3.Connection, now: float, commit: Commit, p: Params) -> CasResult:
        params = {**p, **self._fence(commit.lease, now)}
        kind = commit.kind
        if kind in ("finish", "advance"):  # the hot path: the fence rides in the CAS
            cas = q.CAS_FINISH if kind == "finish" else q.CAS_STATE
            if c.execute(cas, params).rowcount == 0:
                return self._refused(c, params, kind)
            c.execute(q.TASK_DONE, params)
            if kind == "advance":
                c.execute(q.CAS_NEXT_TASK, params)
            return CasResult.OK
        if c.execute(q.CHECK_FENCE, params).fetchone() is None:
            self._rejected(c, params, commit.kind)
            return CasResult.LEASE_LOST
        if kind == "release":
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

    # -- reads ---------------------------------------------------------------------------------
    @staticmethod
    def _run(row: tuple[Any, ...]) -> Run:
        rid, status, state, revision, result, reason, error, created, updated, finished = row
        return Run(
            rid, status, _loads(state), revision, _loads(result), reason, error,
            created, updated, finished,
        )  # fmt: skip

    def get_run(self, run_id: int) -> Run | None:
        row = self._read(lambda c: c.execute(q.GET_RUN, {"run_id": run_id}).fetchone())
        return None if row is None else self._run(row)

    @staticmethod
    def _task(r: tuple[Any, ...]) -> TaskInfo:
        return TaskInfo(r[0], r[1], r[2], _loads(r[3]), *r[4:])

    def get_tasks(self, run_id: int) -> list[TaskInfo]:
        rows = self._read(lambda c: c.execute(q.GET_TASKS, {"run_id": run_id}).fetchall())
        return [self._task(r) for r in rows]

    def get_task(self, task_id: int) -> TaskInfo | None:
        row = self._read(lambda c: c.execute(q.GET_TASK, {"task_id": task_id}).fetchone())
        return None if row is None else self._task(row)

    def fence_rejections(self, after: int = 0, limit: int = 10_000) -> list[Rejection]:
        params = {"after": after, "limit": limit}
        rows = self._read(lambda c: c.execute(q.LIST_REJECTIONS, params).fetchall())
        return [Rejection(*r) for r in rows]

    def integrity_violations(self) -> list[str]:
        def read(c: sqlite3.Connection) -> list[str]:
            found = [
                f"task {t} of run {r} was committed by attempt {done} although attempt "
                f"{latest} had superseded it (a zombie write was accepted)"
                for t, r, done, latest in c.execute(q.SUPERSEDED_COMMITS).fetchall()
            ]
            now = self._clock()
            found += [
                f"run {r} holds {n} live leases at once (its steps overlap)"
                for r, n in c.execute(q.OVERLAPPING_LEASES, {"now": now}).fetchall()
            ]
            return found

        return self._read(read)

    def list_runs(self, status: str | None = None, limit: int = 100) -> list[Run]:
        sql = q.LIST_RUNS if status is None else q.LIST_RUNS_BY_STATUS
        params = {"status": status, "limit": limit}
        return [self._run(r) for r in self._read(lambda c: c.execute(sql, params).fetchall())]

    def stats(self) -> Stats:
        def read(c: sqlite3.Connection) -> Stats:
            now = self._clock()
            c.execute("BEGIN")  # one snapshot for every count
            try:
                runs = dict(c.execute(q.RUN_COUNTS).fetchall())
                ready, delayed, leased, expired = c.execute(q.TASK_COUNTS, {"now": now}).fetchone()
                leases = [OwnerLease(*r) for r in c.execute(q.LIVE_LEASES).fetchall()]
            finally:
                c.execute("COMMIT")
            return Stats(now, runs, ready, delayed, leased, expired, leases)

        return self._read(read)

    def change_token(self) -> int:
        return int(self._read(lambda c: c.execute("PRAGMA data_version").fetchone()[0]))

    def next_ready_at(self) -> float | None:
        row = self._read(lambda c: c.execute(q.NEXT_READY).fetchone())
        return None if row[0] is None else float(row[0])
