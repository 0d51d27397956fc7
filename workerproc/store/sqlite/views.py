"""What operators read from SQLite (the dashboard), and the attempt history the store keeps on
the unhappy paths. Mixed into ``SQLiteStore``; every SQL statement lives in
``sqlite_views_sql``."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from ..types import AttemptEnd, FinishedBucket, Rejection, Run
from . import reads_sql as v
from .dialect import Params, SQLiteBase

MAX_PAGE = 1000  # runs per page, at most
MAX_NEWEST = 10_000_000  # finished_since looks at no more runs than this


class SQLiteViews(SQLiteBase):
    _run: Callable[[tuple[Any, ...]], Run]  # SQLiteReads parses a run row

    # -- reads -----------------------------------------------------------------------------------
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
        params = {"status": status, "task": task, "limit": max(1, min(limit, MAX_PAGE))}
        if after is not None:
            sql, params["after"] = v.RUNS_AFTER[key], after
        else:
            sql, params["before"] = v.RUNS_BEFORE[key], 2**63 - 1 if before is None else before
        rows = self._read(lambda c: c.execute(sql, params).fetchall())
        runs = [self._run(r) for r in rows]
        return runs[::-1] if after is not None else runs

    def task_names(self, limit: int = 100) -> list[str]:
        params = {"limit": max(1, limit)}
        return [r[0] for r in self._read(lambda c: c.execute(v.TASK_NAMES, params).fetchall())]

    def attempt_history(self, run_id: int) -> list[AttemptEnd]:
        params = {"run_id": run_id}
        rows = self._read(lambda c: c.execute(v.ATTEMPT_HISTORY, params).fetchall())
        return [AttemptEnd(*r) for r in rows]

    def run_rejections(self, run_id: int) -> list[Rejection]:
        params = {"run_id": run_id}
        rows = self._read(lambda c: c.execute(v.RUN_REJECTIONS, params).fetchall())
        return [Rejection(*r) for r in rows]

    def finished_since(
        self, since: float, bucket: float, *, newest: int = 100_000
    ) -> list[FinishedBucket]:
        if not bucket > 0:
            raise ValueError("bucket must be > 0 seconds")
        params = {"since": since, "bucket": bucket, "newest": max(1, min(newest, MAX_NEWEST))}
        rows = self._read(lambda c: c.execute(v.FINISHED_SINCE, params).fetchall())
        return [FinishedBucket(since + slot * bucket, bucket, ok, bad, off)
                for slot, ok, bad, off in rows]  # fmt: skip

    # -- the history, written on the unhappy paths only ------------------------------------------
    @staticmethod
    def _attempt_ended(
        c: sqlite3.Connection, params: Params, outcome: str, error: str | None = None
    ) -> None:
        """Keep the current attempt of ``params["task_id"]`` before its lease is cleared."""
        c.execute(v.ATTEMPT_ENDED, {**params, "outcome": outcome, "error": error})

    @staticmethod
    def _attempts_dropped_by_retry(c: sqlite3.Connection, params: Params) -> None:
        c.execute(v.ATTEMPTS_DROPPED_BY_RETRY, params)
