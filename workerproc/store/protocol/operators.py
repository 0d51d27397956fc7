"""Operators' writes (B1, B2), written once: cancel and retry a run, release a dead owner's
leases, prune finished runs. Each holds the run (its row lock on PostgreSQL) before its tasks."""

from __future__ import annotations

import math

from ..codec import check_owner
from ..dialect import Dialect, Tx
from ..errors import InvalidOption, RunNotFound
from .events import emit, prune_events
from .totals import counted, ended
from .waits import ended_children


def cancel(tx: Tx, run_id: int) -> bool:
    """Cancel live run ``run_id`` in ``tx`` (its row first, then its tasks), its live
    descendants with it (B14, each counted as it ends, with its own ``run.cancelled``
    event); False when it was over already (``RunNotFound`` when there is none)."""
    got = tx.cancel_run(run_id)
    if got is None:
        raise RunNotFound(run_id)
    if not got.cancelled:
        return False
    ended(tx, got.queue, "cancelled")
    emit(tx, "run.cancelled", run_id)
    counted(tx, [(queue, "cancelled", 1) for queue, _ in got.descendants])
    for _, child in got.descendants:
        emit(tx, "run.cancelled", child, with_ancestor=run_id)
    ended_children(tx, [run_id])  # a child's end counts for its parent's join
    return True


def retry(tx: Tx, run_id: int) -> bool:
    """Retry run ``run_id`` in ``tx`` (B2, its row first); False when it is not failed or
    cancelled, or has no pending work (``RunNotFound`` when there is none)."""
    was, queue = status(tx, run_id)
    if was not in ("failed", "cancelled"):
        return False
    params = {"run_id": run_id, "now": tx.now}
    pending = tx.one("PENDING_TASKS", params)
    if pending is None or pending[0] == 0:
        return False
    tx.count("CHILD_RETRIED", params)  # its parent waits for it again (B14)
    tx.count("RETRY_RUN", params)
    tx.count("ATTEMPTS_DROPPED_BY_RETRY", params)
    tx.count("RETRY_TASKS", params)
    tx.reopen_runs([run_id])  # back in its line, its old lease's slot free
    counted(tx, [(queue, was, -1)])
    emit(tx, "run.retried", run_id, was=was)
    return True


class Operators:
    dialect: Dialect

    def cancel_run(self, run_id: int) -> bool:
        """Cancel a live run; False when it was over already. Its holder's next commit
        answers ``conflict``."""

        return self.dialect.write(lambda tx: cancel(tx, run_id), runs=[run_id])

    def retry_run(self, run_id: int) -> bool:
        """B2: a failed or cancelled run with pending work starts a new attempt generation
        (``attempt_base = attempts``; old leases dropped; due when the latest of them would have
        expired, else now). False otherwise."""

        return self.dialect.write(lambda tx: retry(tx, run_id), runs=[run_id])

    def release_owner(self, owner: str) -> int:
        """B1: expire every live lease of ``owner`` (known dead); returns how many."""
        check_owner(owner)

        def release(tx: Tx) -> int:
            return tx.count("RELEASE_OWNER", {"owner": owner, "now": tx.now})

        return self.dialect.write(release)

    def prune(self, older_than: float, *, batch: int = 1000, force: bool = False) -> int:
        """Delete runs that finished more than ``older_than`` seconds ago, with their tasks
        (and refused-write records and events as old: never an event a named consumer has
        not acknowledged or a webhook has not delivered, unless ``force``), ``batch`` runs
        per write transaction so no lock is held long; returns how many runs went."""
        age = float(older_than)
        if not math.isfinite(age):  # (NaN: every finished run is older on PostgreSQL)
            raise InvalidOption(f"prune's age must be a finite number of seconds (got {age})")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidOption(f"prune's batch must be a whole number from 1 (got {batch!r})")
        params = {"age": age, "limit": batch}

        def runs(tx: Tx) -> int:
            gone = tx.rows("PRUNE_RUNS", {**params, "now": tx.now})  # (queue, status) each
            counted(tx, [(queue, status, -1) for queue, status in gone])
            return len(gone)

        def rejections(tx: Tx) -> int:
            return tx.count("PRUNE_REJECTIONS", {**params, "now": tx.now})

        total = 0
        while (n := self.dialect.write(runs)) > 0:
            total += n
        while self.dialect.write(rejections) > 0:
            pass
        prune_events(self.dialect, older_than, batch, force)
        return total


def status(tx: Tx, run_id: int) -> tuple[str, str]:
    """The run's stored status and its queue, the run held (PostgreSQL: its row locked);
    RunNotFound otherwise."""
    row = tx.one("RUN_STATUS", {"run_id": run_id})
    if row is None:
        raise RunNotFound(run_id)
    return str(row[0]), str(row[1])
