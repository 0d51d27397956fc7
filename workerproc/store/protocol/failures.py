"""Runs that end without a handler's word (R6, B10, B12), written once: a run failed by the
claim or by its holder (``fail_run``), the attempt a lease held kept in the history before the
lease goes (``attempt_ended``), and a gated run whose token reservation no bucket of its limits
can ever hold, failed where the claim finds it (``refuse_too_large``)."""

from __future__ import annotations

from collections.abc import Callable

from ..dialect import Tx
from ..limits import TOO_LARGE
from ..types import RunFailure
from .events import emit
from .operators import status
from .totals import ended
from .waits import ended_children


def fail_run(
    tx: Tx, run_id: int, queue: str, reason: str, error: str | None, task: str | None = None,
    attempt: int | None = None,
) -> int:  # fmt: skip
    """Fail a live run (of ``queue``, where it is counted; ``task`` at ``attempt`` failed
    it); how many runs changed (0: it was over already)."""
    params = {"run_id": run_id, "reason": reason, "error": error, "now": tx.now}
    changed = tx.count("FAIL_RUN", params)
    if changed:
        ended(tx, queue, "failed")
        emit(tx, "run.failed", run_id, task, attempt, reason=reason, error=error)
        tx.failed.append(RunFailure(run_id, task, reason, error))  # for the worker's log line
        ended_children(tx, [run_id])  # a child's failure counts for its parent's join (B14)
    return changed


def attempt_ended(
    tx: Tx, run_id: int, task_id: int, outcome: str, error: str | None = None
) -> None:
    """Keep the current attempt of ``task_id`` (of ``run_id``) in the history before its lease
    is cleared."""
    params = {"run_id": run_id, "task_id": task_id, "now": tx.now, "outcome": outcome,
              "error": error}  # fmt: skip
    tx.count("ATTEMPT_ENDED", params)


def refuse_too_large(
    tx: Tx, run_id: int, task_id: int, lapsed: bool, why: Callable[[str], str]
) -> None:
    """B12: fail gated run ``run_id`` (locked by the claim), whose head task ``task_id``
    reserves more tokens than a bucket of its limits ever holds (``why``: the line that says
    so, given the task's name), with reason ``reservation_too_large``: it never blocks the
    line it cannot enter. ``lapsed``: an expired lease is still on the task; its attempt ends
    in the history and the lease goes (its reservation the caller gives back)."""
    row = tx.one("GET_TASK", {"task_id": task_id})
    name = None if row is None else str(row[2])
    error = why(name or f"#{task_id}")
    _, queue = status(tx, run_id)
    if lapsed:
        attempt_ended(tx, run_id, task_id, "failed", error)
        tx.count("DROP_EXHAUSTED_LEASE", {"run_id": run_id, "task_id": task_id})
    fail_run(tx, run_id, queue, TOO_LARGE, error, name)
