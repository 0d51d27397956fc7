"""What the PostgreSQL backend answers without writing: runs, tasks, evidence, counts, the
dashboard's views, the cheap reads idle workers poll, and the engine's own storage check
(amcheck). Each read is one autocommit statement (stats: one REPEATABLE READ snapshot)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..codec import loads
from ..types import (
    AttemptEnd,
    FinishedBucket,
    OwnerLease,
    Rejection,
    Run,
    Stats,
    TaskInfo,
)
from . import reads_sql as r
from .dialect import Cursor, Params, PostgresBase

MAX_PAGE = 1000  # runs per page, at most
MAX_NEWEST = 10_000_000  # finished_since looks at no more runs than this


def _all(c: Cursor, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
    return c.execute(query, params or {}, prepare=True).fetchall()


def _one(c: Cursor, query: str, params: Params | None = None) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = c.execute(query, params or {}, prepare=True).fetchone()
    return row


class PostgresReads(PostgresBase):
    def _rows(self, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        return self._read(lambda c, _now: _all(c, query, params))

    @staticmethod
    def _run(row: tuple[Any, ...]) -> Run:
        rid, status, state, revision, result, reason, error, created, updated, finished = row[:10]
        queue, priority, key, task = row[10:]
        return Run(
            rid, status, loads(state, f"run {rid}'s state"), revision,
            loads(result, f"run {rid}'s result"), reason, error, created, updated, finished,
            queue, priority, key, task,
        )  # fmt: skip

    def get_run(self, run_id: int) -> Run | None:
        row = self._read(lambda c, _now: _one(c, r.GET_RUN, {"run_id": run_id}))
        return None if row is None else self._run(row)

    @staticmethod
    def _task(row: tuple[Any, ...]) -> TaskInfo:
        return TaskInfo(row[0], row[1], row[2], loads(row[3], f"task {row[0]}'s payload"),
                        *row[4:])  # fmt: skip

    def get_tasks(self, run_id: int) -> list[TaskInfo]:
        return [self._task(row) for row in self._rows(r.GET_TASKS, {"run_id": run_id})]

    def get_task(self, task_id: int) -> TaskInfo | None:
        row = self._read(lambda c, _now: _one(c, r.GET_TASK, {"task_id": task_id}))
        return None if row is None else self._task(row)

    def fence_rejections(self, after: int = 0, limit: int = 10_000) -> list[Rejection]:
        rows = self._rows(r.LIST_REJECTIONS, {"after": after, "limit": limit})
        return [Rejection(*row) for row in rows]

    def integrity_violations(self) -> list[str]:
        def read(c: Cursor, now: float | None) -> list[str]:
            found = [
                f"task {t} of run {run} was committed by attempt {done} although attempt "
                f"{latest} had superseded it (a zombie write was accepted)"
                for t, run, done, latest in _all(c, r.SUPERSEDED_COMMITS)
            ]
            found += [
                f"run {run} holds {n} live leases at once (its steps overlap)"
                for run, n in _all(c, r.OVERLAPPING_LEASES, {"now": now})
            ]
            return found

        return self._read(read)

    def list_runs(
        self, status: str | None = None, limit: int = 100, *, queue: str | None = None
    ) -> list[Run]:
        if status is not None:
            query = r.LIST_RUNS_BY_STATUS
        else:
            query = r.LIST_RUNS if queue is None else r.LIST_RUNS_BY_QUEUE
        params = {"status": status, "limit": limit, "queue": queue}
        return [self._run(row) for row in self._rows(query, params)]

    def stats(self) -> Stats:
        def read(c: Cursor, now: float | None) -> Stats:
            at = _one(c, r.NOW, {"now": now})
            assert at is not None
            run_rows = _all(c, r.RUN_COUNTS)
            task_rows = _all(c, r.TASK_COUNTS, {"now": at[0]})
            leases = [OwnerLease(*row) for row in _all(c, r.LIVE_LEASES)]
            return Stats.from_counts(float(at[0]), run_rows, task_rows, leases)

        return self._read(read, snapshot=True)  # one snapshot for every count

    def next_ready_at(self, queues: Sequence[str] | None = None) -> float | None:
        if queues is None:
            query, params = r.NEXT_READY, {}
        else:
            query, params = r.NEXT_READY_QUEUES, {"queues": list(queues)}
        row = self._read(lambda c, _now: _one(c, query, params))
        return None if row is None or row[0] is None else float(row[0])

    # -- the dashboard ---------------------------------------------------------------------------
    def runs_page(
        self,
        status: str | None = None,
        task: str | None = None,
        *,
        before: int | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> list[Run]:
        if before is not None and after is not None:
            raise ValueError("runs_page takes before or after, not both")
        key = (status is not None, task is not None)
        params: Params = {"status": status, "task": task, "limit": max(1, min(limit, MAX_PAGE))}
        if after is not None:
            query, params["after"] = r.RUNS_AFTER[key], after
        else:
            query, params["before"] = r.RUNS_BEFORE[key], 2**63 - 1 if before is None else before
        runs = [self._run(row) for row in self._rows(query, params)]
        return runs[::-1] if after is not None else runs

    def task_names(self, limit: int = 100) -> list[str]:
        return [row[0] for row in self._rows(r.TASK_NAMES, {"limit": max(1, limit)})]

    def attempt_history(self, run_id: int) -> list[AttemptEnd]:
        return [AttemptEnd(*row) for row in self._rows(r.ATTEMPT_HISTORY, {"run_id": run_id})]

    def run_rejections(self, run_id: int) -> list[Rejection]:
        return [Rejection(*row) for row in self._rows(r.RUN_REJECTIONS, {"run_id": run_id})]

    def finished_since(
        self, since: float, bucket: float, *, newest: int = 100_000
    ) -> list[FinishedBucket]:
        if not bucket > 0:
            raise ValueError("bucket must be > 0 seconds")
        params = {"since": since, "bucket": bucket, "newest": max(1, min(newest, MAX_NEWEST))}
        return [FinishedBucket(since + slot * bucket, bucket, ok, bad, off)
                for slot, ok, bad, off in self._rows(r.FINISHED_SINCE, params)]  # fmt: skip

    # -- the engine's check of its own storage -------------------------------------------------
    def integrity_check_name(self, quick: bool = False) -> str | None:
        if self._amcheck() is None:
            return None
        return "amcheck bt_index_check" if quick else "amcheck bt_index_check + verify_heapam"

    def _amcheck(self) -> str | None:
        """The schema of the amcheck extension in this database, None when not installed."""
        row = self._read(lambda c, _now: _one(c, r.AMCHECK))
        return None if row is None else str(row[0])

    def check_integrity(self, quick: bool = False, limit: int = 100) -> list[str]:
        """amcheck when the extension is installed (a superuser runs ``CREATE EXTENSION
        amcheck``): every B-tree index of our schema (``bt_index_check``; without ``quick``
        also that every heap row is indexed) and, without ``quick``, every table's pages
        (``verify_heapam``). Without amcheck nothing is checked and nothing is found:
        ``integrity_check_name`` says so (None)."""
        where = self._amcheck()
        if where is None:
            return []
        limit = max(1, int(limit))
        ns = sql.Identifier(where)
        bt = sql.SQL("SELECT {}.bt_index_check(%s::regclass, %s)").format(ns)
        heap = sql.SQL(
            "SELECT blkno, offnum, msg FROM {}.verify_heapam(%s::regclass) LIMIT %s"
        ).format(ns)

        def check(c: Cursor, _now: float | None) -> list[str]:
            found: list[str] = []
            for (index,) in _all(c, r.OUR_INDEXES, {"schema": self.schema}):
                try:
                    c.execute(bt, (index, not quick))
                except psycopg.Error as exc:  # corruption is reported, never raised
                    found.append(f"index {index}: {str(exc).strip()}")
            if not quick:
                for (table,) in _all(c, r.OUR_TABLES, {"schema": self.schema}):
                    rows = c.execute(heap, (table, limit)).fetchall()
                    found += [f"table {table}, block {b}, item {o}: {m}" for b, o, m in rows]
            return found[:limit]

        return self._read(check)
