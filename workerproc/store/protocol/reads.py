"""What the store answers without writing, written once: runs, tasks, the evidence, counts, the
dashboard's pages, the idle workers' cheap reads, and ``wait``. Readers never take the write
lock; JSON comes out of the database as text and is decoded here (``codec.loads``)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ..codec import RESERVED, can_exist, check_name, check_queue, loads
from ..dialect import ChangeWatch, Dialect, Params, Row, Tx
from ..errors import RunNotFound
from ..types import (
    RUN_STATUSES,
    STORED_STATUS,
    SYSTEM_RUNS,
    WAITING_FILTER,
    AttemptEnd,
    FinishedBucket,
    OwnerLease,
    Rejection,
    Run,
    Stats,
    TaskInfo,
)
from .programs import Steps, perform

MAX_PAGE = 1000  # runs per page, at most
MAX_NEWEST = 10_000_000  # finished_since looks at no more runs than this
MAX_WAIT = 366 * 86_400.0  # a wait longer than a year is a mistake: wait without a timeout
EVERY_RUN = 2**63 - 1  # an id bound above every run's (the system's runs included)


def _next_ready(queues: Sequence[str] | None) -> tuple[str, Params]:
    """``NEXT_READY`` for every queue, ``NEXT_READY_QUEUES`` for some, and its parameters."""
    if queues is None:
        return "NEXT_READY", {}
    return "NEXT_READY_QUEUES", {"queues": [check_queue(q) for q in queues]}


def below(system: bool) -> int:
    """The id bound of a list: the users' runs only, or the system's too (B20)."""
    return EVERY_RUN if system else SYSTEM_RUNS


def check_timeout(timeout: float | None) -> float | None:
    """``wait``'s timeout: None (no limit) or a number of seconds from 0 to ``MAX_WAIT``;
    ValueError otherwise (NaN and infinities included)."""
    if timeout is None:
        return None
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT:
        raise ValueError(
            f"timeout must be from 0 to {MAX_WAIT:g} seconds, or None (got {timeout!r})"
        )
    return seconds


def waiting(run_id: int, timeout: float | None) -> Steps[Run]:
    """``wait``, written once for the sync and the async store: look at the run; unless it
    ended, watch it (from then on its end moves the change token), then, until it ends or the
    timeout passes, read the token, look again, and sleep until the token moves. Raises
    TimeoutError, and RunNotFound (from the ``run`` operation)."""
    timeout = check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    run: Run = yield ("run", run_id)
    if run.terminal:
        return run
    yield ("watch", run_id)
    while True:
        token = yield ("token",)
        run = yield ("run", run_id)
        if run.terminal:
            return run
        left = 3600.0 if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"run {run_id} is still {run.status} after {timeout:g} s")
        yield ("sleep", token, min(left, 3600.0))


def run_of(row: Row) -> Run:
    rid, status, state, revision, result, reason, error, created, updated, finished = row[:10]
    queue, priority, key, task = row[10:14]
    return Run(
        rid, status, loads(state, f"run {rid}'s state"), revision,
        loads(result, f"run {rid}'s result"), reason, error, created, updated, finished,
        queue, priority, key, task, row[14] if len(row) > 14 else None,
        row[15] if len(row) > 15 else None,
    )  # fmt: skip


def task_of(row: Row) -> TaskInfo:
    return TaskInfo(row[0], row[1], row[2], loads(row[3], f"task {row[0]}'s payload"), *row[4:])


def status_filter(status: str | None) -> Params:
    """A status filter's parameters: ``stored``, the status as the row has it, and ``held``,
    whether a live lease must hold the run (None: either). ``running`` is a pending run that a
    live lease holds, ``pending`` one that none does. No status: each of them None (the
    statements' optional filters, ``(:stored IS NULL OR ...)``)."""
    if status is None:
        return {"status": None, "stored": None, "held": None, "waiting": None}
    if status not in STORED_STATUS:
        raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)} (got {status!r})")
    stored, held = STORED_STATUS[status]
    waiting = WAITING_FILTER.get(status)  # pending: not waiting; waiting: waiting (B14)
    return {"status": status, "stored": stored, "held": held, "waiting": waiting}


class Reads:
    dialect: Dialect

    def _rows(self, statement: str, params: Params) -> list[Row]:
        """The rows of a read; every read is given "now" (a run's status says whether a live
        lease holds it)."""
        return self.dialect.read(lambda tx: tx.rows(statement, {**params, "now": tx.now}))

    def get_run(self, run_id: int) -> Run | None:
        """Run ``run_id`` as it stands: status (``running`` while a live lease holds it),
        state, result, failure; None when there is no such run (or it was pruned)."""
        if not can_exist(run_id):
            return None
        rows = self._rows("GET_RUN", {"run_id": run_id})
        return run_of(rows[0]) if rows else None

    def get_tasks(self, run_id: int) -> list[TaskInfo]:
        """Run ``run_id``'s tasks (its steps), oldest first, each with its attempts and lease;
        empty when there is no such run."""
        if not can_exist(run_id):
            return []
        return [task_of(row) for row in self._rows("GET_TASKS", {"run_id": run_id})]

    def get_task(self, task_id: int) -> TaskInfo | None:
        """Task ``task_id`` (one step of a run) with its attempts and lease; None when there is
        no such task."""
        if not can_exist(task_id):
            return None
        rows = self._rows("GET_TASK", {"task_id": task_id})
        return task_of(rows[0]) if rows else None

    def list_runs(
        self, status: str | None = None, limit: int = 100, *, queue: str | None = None,
        system: bool = False,
    ) -> list[Run]:  # fmt: skip
        """Runs newest first: of one status (and queue), of one queue, or all; the users'
        runs, and with ``system`` the system's own too (the webhooks' delivery runs, B20)."""
        if queue is not None:
            check_queue(queue)
        params = {"limit": max(0, limit), "queue": queue, "below": below(system),
                  **status_filter(status)}  # fmt: skip
        return [run_of(row) for row in self._rows("LIST_RUNS", params)]

    def stats(self) -> Stats:
        """Runs by queue and status, pending tasks by queue and state, and the live leases,
        all read in one snapshot. No finished run is read: the live runs are counted, the
        finished ones come from their totals (``totals``), so the cost follows the live work,
        not the history."""

        def read(tx: Tx) -> Stats:
            now = tx.time()
            run_rows = tx.rows("RUN_COUNTS", {"now": now}) + tx.rows("RUN_TOTALS", {})
            task_rows = tx.rows("TASK_COUNTS", {"now": now})
            leases = [OwnerLease(*row) for row in tx.rows("LIVE_LEASES", {})]
            return Stats.from_counts(now, run_rows, task_rows, leases)

        return self.dialect.read(read, snapshot=True)

    # -- the evidence and the integrity checks ---------------------------------------------------
    def fence_rejections(self, after: int = 0, limit: int = 10_000) -> list[Rejection]:
        """Writes the fence refused (a zombie's renewal or commit, say), oldest first."""
        rows = self._rows("LIST_REJECTIONS", {"after": after, "limit": max(0, limit)})
        return [Rejection(*row) for row in rows]

    def integrity_violations(self) -> list[str]:
        """What must never be in the database: a finished task committed by a superseded
        attempt, or a run holding two live leases at once. Empty when all is well."""

        def read(tx: Tx) -> list[str]:
            found = [
                f"task {t} of run {r} was committed by attempt {done} although attempt "
                f"{latest} had superseded it (a zombie write was accepted)"
                for t, r, done, latest in tx.rows("SUPERSEDED_COMMITS", {})
            ]
            found += [
                f"run {r} holds {n} live leases at once (its steps overlap)"
                for r, n in tx.rows("OVERLAPPING_LEASES", {"now": tx.now})
            ]
            return found

        return self.dialect.read(read)

    def check_integrity(self, quick: bool = False, limit: int = 100) -> list[str]:
        """What the database engine finds wrong with its own storage: damaged pages, broken
        indexes, missing rows (SQLite: ``PRAGMA integrity_check``, or ``quick_check`` when
        ``quick``; PostgreSQL: amcheck). At most ``limit`` lines, each for people; empty when
        sound. Corruption is reported, never raised."""
        return self.dialect.check_storage(quick, max(1, int(limit)))

    def integrity_check_name(self, quick: bool = False) -> str | None:
        """What ``check_integrity`` runs, named for people; None when this database offers no
        check of its storage (PostgreSQL without amcheck)."""
        return self.dialect.storage_check(quick)

    # -- the idle worker's cheap reads ---------------------------------------------------------
    def change_token(self) -> int:
        """A number that changes when another connection commits. Cheap; no write lock."""
        return self.dialect.change_token()

    def wait_change(self, token: int, timeout: float) -> int:
        """Sleep until the change token differs from ``token`` or ``timeout`` seconds pass (on
        notifications where the database has them); the current token."""
        return self.dialect.wait_change(token, timeout)

    def change_watch(self) -> ChangeWatch | None:
        """What a waiter that also waits for something else (an idle worker's self-pipe) may
        sleep on instead of polling ``change_token``: a descriptor that becomes readable when
        another connection may have committed (None: poll). A hint; the token decides."""
        return self.dialect.change_watch()

    def pending_ids(self, limit: int = 1000, *, queues: Sequence[str] | None = None) -> list[int]:
        """The ids of the newest ``limit`` pending runs (of ``queues``; None: any), newest
        first, the users' runs only: ids alone, nothing decoded (a drain's look for runs no
        worker of its pool serves, ``unserved``, B22)."""
        picked = None if queues is None else [check_queue(q) for q in queues]
        params = {"limit": max(0, limit), "below": below(False), "queues": picked}
        return [int(row[0]) for row in self._rows("PENDING_IDS", params)]

    def commits_move_token(self) -> bool:
        """Whether every commit of another connection moves ``change_token`` (SQLite; on
        PostgreSQL only new work and watched runs' ends do, unless it polls): a waiter for
        other commits (the webhooks' waker, for events) need not read anything while the
        token stands still."""
        return self.dialect.commits_move_token()

    def next_ready_at(self, queues: Sequence[str] | None = None) -> float | None:
        """The earliest moment some task of ``queues`` (None: any) could be claimed (a past
        value: claimable now)."""
        rows = self._rows(*_next_ready(queues))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def ready_in(self, queues: Sequence[str] | None = None) -> float | None:
        """Seconds until some task of ``queues`` (None: any) could be claimed (0 or less:
        now); None when none could. ``next_ready_at`` against the clock it was judged by, in
        one read: on PostgreSQL one statement, which reads the database's clock itself (an
        idle worker's look at each poll interval, R7)."""
        statement, params = _next_ready(queues)

        def look(tx: Tx) -> tuple[list[Row], float | None]:
            return tx.rows(statement, {**params, "now": tx.now}), tx.now

        rows, now = self.dialect.read(look)
        if not rows or rows[0][0] is None:
            return None
        clock = now if now is not None else rows[0][1]  # (None: the statement's own clock)
        return float(rows[0][0]) - float(clock)

    def now(self) -> float:
        """The store's clock (injectable; the database clock on PostgreSQL)."""
        return self.dialect.now()

    def wait(self, run_id: int, timeout: float | None = None) -> Run:
        """Block until the run is succeeded, failed or cancelled and return it; TimeoutError
        after ``timeout`` seconds. Sleeps on the change token between looks, never spins."""
        dialect = self.dialect
        return perform(waiting(run_id, timeout), {
            "run": self._run,
            "watch": dialect.watch,
            "token": lambda: dialect.change_token("end"),
            "sleep": lambda token, seconds: dialect.wait_change(token, seconds, "end"),
        })  # fmt: skip

    def _run(self, run_id: int) -> Run:
        run = self.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    # -- the dashboard -------------------------------------------------------------------------
    def runs_page(
        self,
        status: str | None = None,
        task: str | None = None,
        *,
        before: int | None = None,
        after: int | None = None,
        limit: int = 50,
        system: bool = False,
    ) -> list[Run]:
        """One keyset page of runs, newest first: ids below ``before`` (or above ``after``);
        the users' runs, and with ``system`` the system's own too (B20)."""
        if before is not None and after is not None:
            raise ValueError("runs_page takes before or after, not both")
        if task is not None:
            check_name(task)
        bound = below(system)
        params: Params = {"task": task, "below": bound, "limit": max(1, min(limit, MAX_PAGE)),
                          **status_filter(status)}  # fmt: skip
        if after is not None:
            statement, params["after"] = "RUNS_AFTER", after
        else:
            upto = bound if before is None else min(bound, before)
            statement, params["before"] = "RUNS_BEFORE", upto
        runs = [run_of(row) for row in self._rows(statement, params)]
        return runs[::-1] if after is not None else runs

    def task_names(self, limit: int = 100, *, system: bool = False) -> list[str]:
        """The distinct names of runs' first tasks (what ``runs_page(task=...)`` filters on);
        the built-in tasks' (``leasekeeper.*``, the system's runs, B20) only with ``system``."""
        # (one name more: the one built-in task may be among them)
        names = [row[0] for row in self._rows("TASK_NAMES", {"limit": max(1, limit) + 1})]
        return [n for n in names if system or not n.startswith(RESERVED)][: max(1, limit)]

    def attempt_history(self, run_id: int) -> list[AttemptEnd]:
        """The attempts of a run's tasks that ended without a commit, oldest first."""
        if not can_exist(run_id):
            return []
        return [AttemptEnd(*row) for row in self._rows("ATTEMPT_HISTORY", {"run_id": run_id})]

    def run_rejections(self, run_id: int) -> list[Rejection]:
        """The writes the fence refused for this run's tasks, oldest first."""
        if not can_exist(run_id):
            return []
        return [Rejection(*row) for row in self._rows("RUN_REJECTIONS", {"run_id": run_id})]

    def failed_since(self, since: float) -> dict[str, int]:
        """How many runs failed at or after ``since`` (the store's clock) and are failed still,
        per queue (``start --drain --fail-on-failed``)."""
        return {queue: n for queue, n in self._rows("FAILED_SINCE", {"since": since})}

    def finished_since(
        self, since: float, bucket: float, *, newest: int = 100_000
    ) -> list[FinishedBucket]:
        """Runs finished since ``since`` per ``bucket`` seconds (only non-empty buckets),
        looking at the ``newest`` runs only: a bounded read, whatever the table's size."""
        if not bucket > 0:
            raise ValueError("bucket must be > 0 seconds")
        params = {"since": since, "bucket": bucket, "newest": max(1, min(newest, MAX_NEWEST))}
        return [FinishedBucket(since + slot * bucket, bucket, ok, bad, off)
                for slot, ok, bad, off in self._rows("FINISHED_SINCE", params)]  # fmt: skip
