"""Producers (B7), written once: start runs, one or many, in the store's own transaction or
inside the caller's (transactional enqueue), every value checked and encoded first
(``NewRun``), a key already taken answered with its run's id."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..dialect import Dialect, Tx
from ..driver import Placing
from ..errors import StoreError
from ..limits import Gating
from ..newrun import NewRun
from ..types import DEFAULT_QUEUE, JSON
from .limits import Limits
from .programs import Program, drive


class Producers(Limits):
    dialect: Dialect

    def start_run(
        self,
        task: str,
        payload: JSON = None,
        state: JSON = None,
        delay: float = 0,
        *,
        key: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        tx: Any = None,
        traceparent: str | None = None,
    ) -> int:
        """Start a run whose first task is ``task``; its state is ``state`` (``{}`` when None).

        ``key`` makes the start idempotent: while a run with that key exists, starting again
        returns its id and creates nothing. ``tx``: the caller's own open transaction on the
        same database (a ``sqlite3.Connection`` for SQLite, a ``psycopg.Connection`` for
        PostgreSQL), so the run exists if and only if the caller's transaction commits; the
        caller commits or rolls back. ``traceparent``: the W3C trace context its steps'
        spans continue (None: the caller's current span's, when OpenTelemetry is installed
        and a span is recording; "": none; ``workerproc.tracing``)."""
        (run_id,) = self._start(
            [NewRun.make(task, payload, state, delay, key, queue, priority, traceparent)], tx
        )
        return run_id

    def start_runs(self, items: Iterable[Mapping[str, Any]], *, tx: Any = None) -> list[int]:
        """Start many runs in one transaction; each item has ``start_run``'s parameter names
        (only ``task`` is required). Returns the run ids in the items' order."""
        return self._start([NewRun.from_item(item) for item in items], tx)

    def _start(self, runs: list[NewRun], caller: Any) -> list[int]:
        if not runs:
            return []
        runs = self.gatekeeper().runs(runs)  # where each waits, if its task has limits
        return self.dialect.write(lambda tx: insert(tx, runs), intent="start", caller=caller)


def insert(tx: Tx, runs: list[NewRun]) -> list[int]:
    """``inserting`` on ``tx`` (the sync store, and the caller's own transaction)."""
    return drive(inserting(runs, tx.now), tx)


def inserting(runs: list[NewRun], now: float | None) -> Program[list[int]]:
    """Insert the runs and their first tasks, ids in the runs' order; a run whose key is taken
    (by a run that exists, or by an earlier run of the same batch) inserts nothing and answers
    that run's id. ``INSERT_RUNS`` writes each inserted run's ``run.enqueued`` event itself
    (B18), in the same statement on PostgreSQL. A program (``programs``): the sync and the
    async store run this same one."""
    rows = yield "INSERT_RUNS", {"runs": runs, "now": now}  # (id, inserted, ...) each
    ids = [int(row[0]) for row in rows]
    taken = [i for i, row in enumerate(rows) if not row[1]]
    placed = [r.gating for r, row in zip(runs, rows, strict=True) if row[1] and r.gating.line]
    if placed:  # gated runs joined their lines: each gate exists, each line may admit now
        place = placing(placed)
        yield "PLACE_GATES", {"gates": list(place.gates), "lines": list(place.lines), "now": now}
    if taken:  # keys that name a run already there: the first run's id, nothing created
        keys = [runs[i].key for i in taken]
        found: dict[str | None, int] = dict((yield "FIND_BY_KEYS", {"keys": keys}))
        for i in taken:
            if runs[i].key not in found:
                raise StoreError(f"{runs[i].key!r}: a run with this key was not found")
            ids[i] = int(found[runs[i].key])
    return ids


def placing(gatings: list[Gating]) -> Placing:
    """What ``PLACE_GATES`` writes: every gate the runs name (created when new), and the
    lines they joined (each may admit a run now, unless it is closed for a while)."""
    gates = sorted({g for x in gatings for g in x.gates})
    lines = sorted({x.line for x in gatings if x.line})
    return Placing(tuple(gates), tuple(lines))
