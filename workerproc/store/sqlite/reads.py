"""What the SQLite backend answers without writing: runs, tasks, evidence, counts, and the cheap
reads idle workers poll. Readers never take the write lock (WAL)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..codec import loads
from ..types import OwnerLease, Rejection, Run, Stats, TaskInfo
from . import sql as q
from .dialect import SQLiteBase


class SQLiteReads(SQLiteBase):
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
        row = self._read(lambda c: c.execute(q.GET_RUN, {"run_id": run_id}).fetchone())
        return None if row is None else self._run(row)

    @staticmethod
    def _task(r: tuple[Any, ...]) -> TaskInfo:
        return TaskInfo(r[0], r[1], r[2], loads(r[3], f"task {r[0]}'s payload"), *r[4:])

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

    def list_runs(
        self, status: str | None = None, limit: int = 100, *, queue: str | None = None
    ) -> list[Run]:
        if status is not None:
            sql = q.LIST_RUNS_BY_STATUS
        else:
            sql = q.LIST_RUNS if queue is None else q.LIST_RUNS_BY_QUEUE
        params = {"status": status, "limit": limit, "queue": queue}
        return [self._run(r) for r in self._read(lambda c: c.execute(sql, params).fetchall())]

    def stats(self) -> Stats:
        def read(c: sqlite3.Connection) -> Stats:
            now = self._clock()
            c.execute("BEGIN")  # one snapshot for every count
            try:
                run_rows = c.execute(q.RUN_COUNTS).fetchall()
                task_rows = c.execute(q.TASK_COUNTS, {"now": now}).fetchall()
                leases = [OwnerLease(*r) for r in c.execute(q.LIVE_LEASES).fetchall()]
            finally:
                c.execute("COMMIT")
            return Stats.from_counts(now, run_rows, task_rows, leases)

        return self._read(read)

    def change_token(self) -> int:
        return int(self._read(lambda c: c.execute("PRAGMA data_version").fetchone()[0]))

    def next_ready_at(self, queues: Sequence[str] | None = None) -> float | None:
        if queues is None:
            sql, params = q.NEXT_READY, {}
        else:
            sql, params = q.NEXT_READY_QUEUES, {"queues": json.dumps(list(queues))}
        row = self._read(lambda c: c.execute(sql, params).fetchone())
        return None if row[0] is None else float(row[0])
