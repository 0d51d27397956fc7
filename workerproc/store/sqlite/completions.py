"""SQLite's completions and the other steps that end or give back a lease (the catalogue's
``FINISH``, ``ADVANCE``, ``SET_STATE``, ``HANDBACK``, ``TASK_FAILED``, ``RETRY_TASKS``,
``ACK`` and ``RELEASE``; ``steps`` maps them), run on the transaction's connection itself,
their statements read from their modules at each call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dialect import Params, Row, Step
from . import ops_sql as o
from . import sql as q

if TYPE_CHECKING:
    from .dialect import SQLiteTx


# The completions take a batch of N >= 1 commits of distinct runs (``commits``: each one's
# record, ``driver.Completion``) and answer a row for each commit written (its run's id): in
# process, each commit is its own statements.
def finish(tx: SQLiteTx, params: Params) -> list[Row]:
    """For each commit: the fenced compare-and-set that ends the run, then (only if it
    matched) the task done."""
    execute, now, rows = tx.conn.execute, params["now"], []
    for commit in params["commits"]:
        named = commit.params(now)
        if execute(q.CAS_FINISH, named).rowcount:
            execute(q.TASK_DONE, named)
            rows.append((commit.run_id,))
    return rows


def advance(tx: SQLiteTx, params: Params) -> list[Row]:
    """For each commit: the fenced compare-and-set, then the task done, the run moved to
    another queue if one is given, and the next task inserted."""
    execute, now, rows = tx.conn.execute, params["now"], []
    for commit in params["commits"]:
        named = commit.params(now)
        if execute(q.CAS_STATE, named).rowcount:
            execute(q.TASK_DONE, named)
            if commit.queue is not None:
                execute(q.MOVE_RUN, named)
            execute(q.CAS_NEXT_TASK, named)
            rows.append((commit.run_id,))
    return rows


def _each(query: str) -> Step:
    """A completion that is one fenced statement per commit (``sql``'s ``query``, read at each
    call): a row per commit it changed."""

    def step(tx: SQLiteTx, params: Params) -> list[Row]:
        execute, now, statement = tx.conn.execute, params["now"], getattr(q, query)
        return [(commit.run_id,) for commit in params["commits"]
                if execute(statement, commit.params(now)).rowcount]  # fmt: skip

    return step


# a compare-and-set alone (the lease stays)
set_state = _each("CAS_STATE")


def _given_back(query: str) -> Step:
    """A fenced write of the task (``sql``'s ``query``), then (only if it matched) its lease
    goes: a row per commit it changed."""

    def step(tx: SQLiteTx, params: Params) -> list[Row]:
        execute, now, rows = tx.conn.execute, params["now"], []
        for commit in params["commits"]:
            named = commit.params(now)
            if execute(getattr(q, query), named).rowcount:
                execute(q.LEASE_GIVEN_BACK, named)
                rows.append((commit.run_id,))
        return rows

    return step


# a hand-back: the task goes back at once, its claim unspent
handback = _given_back("HANDBACK_TASK")


def task_failed(tx: SQLiteTx, params: Params) -> list[Row]:
    """The holder failed its run: the task keeps its error, and its lease goes."""
    if not tx.conn.execute(q.TASK_FAILED, params).rowcount:
        return []
    tx.conn.execute(q.LEASE_GIVEN_BACK, params)
    return [(params["task_id"],)]


def retry_tasks(tx: SQLiteTx, params: Params) -> list[Row]:
    """retry_run: the run's pending tasks due when its lease would have ended, then the lease
    dropped (``ATTEMPTS_DROPPED_BY_RETRY`` kept it in the history first)."""
    changed = tx.conn.execute(o.RETRY_TASKS_DUE, params).rowcount
    tx.conn.execute(o.RETRY_LEASE_DROPPED, params)
    return [(params["run_id"],)] * changed


def ack(tx: SQLiteTx, params: Params) -> list[Row]:
    """For each commit: the task done, then its run succeeded if no task is left (a row:
    the run, and whether it ended)."""
    execute, now, rows = tx.conn.execute, params["now"], []
    for commit in params["commits"]:
        named = commit.params(now)
        if execute(q.TASK_DONE, named).rowcount:
            rows.append((commit.run_id, execute(q.SUCCEED_IF_EMPTY, named).rowcount > 0))
    return rows


def release(tx: SQLiteTx, params: Params) -> list[Row]:
    """For each commit: is the lease live? Then its attempt's end goes into the history, the
    task goes back after the delay, and the error (if any) onto the run."""
    execute, now, rows = tx.conn.execute, params["now"], []
    for commit in params["commits"]:
        named = commit.params(now)
        if execute(q.CHECK_FENCE, named).fetchone() is None:
            continue
        execute(q.ATTEMPT_ENDED, {**named, "outcome": "released"})
        execute(q.RELEASE_TASK, named)
        execute(q.LEASE_GIVEN_BACK, named)
        if commit.error is not None:
            execute(q.RUN_ERROR, named)
        rows.append((commit.run_id,))
    return rows
