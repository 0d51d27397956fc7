"""Producers (B7), written once: start runs, one or many, in the store's own transaction or
inside the caller's (transactional enqueue), every value checked and encoded first
(``NewRun``), a key already taken answered with its run's id. The driver's ``start_runs``
writes them (``store/starts.py``: keys, debounce, the gates' lines)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..asks import Started, StartRuns
from ..dialect import Dialect, Tx
from ..newrun import NewRun
from ..types import DEFAULT_QUEUE, JSON
from .limits import Limits
from .programs import Program


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
        debounce: float | None = None,
        version: int | None = None,
    ) -> int:
        """Start a run whose first task is ``task``; its state is ``state`` (``{}`` when None).

        ``key`` makes the start idempotent: while a run with that key exists, starting again
        returns its id and creates nothing. ``tx``: the caller's own open transaction on the
        same database (a ``sqlite3.Connection`` for SQLite, a ``psycopg.Connection`` for
        PostgreSQL), so the run exists if and only if the caller's transaction commits; the
        caller commits or rolls back. ``traceparent``: the W3C trace context its steps'
        spans continue (None: the caller's current span's, when OpenTelemetry is installed
        and a span is recording; "": none; ``workerproc.tracing``).

        ``debounce`` (seconds, with a ``key``): a burst of starts makes one run. While the
        key's run is pending and its first task was never claimed, a start replaces that
        task's payload and moves its start to ``debounce`` seconds from now (the run's state,
        queue and priority stay); the run starts ``debounce`` seconds after the last start of
        the burst. Once it began (or ended), a start makes a new run, which takes the key.

        ``version``: the version of ``task`` its state is written for (B25; ``Task.start``
        gives the task's own); None: unversioned, run as it is by any version of the task."""
        new = NewRun.make(task, payload, state, delay, key, queue, priority, traceparent,
                          debounce=debounce, version=version)  # fmt: skip
        (run_id,) = self._start([new], tx)
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
    """Start ``runs`` on ``tx`` (the driver's ``start_runs``): their ids, in order (a key
    already taken: its run's)."""
    return [started.run_id for started in tx.start_runs(StartRuns(tuple(runs)))]


def inserting(runs: list[NewRun]) -> Program[list[int]]:
    """``insert`` as a program (``programs``): the sync and the async store run this same
    one, and a program that starts runs (a fork) yields from it."""
    started: list[Started] = yield StartRuns(tuple(runs))
    return [s.run_id for s in started]
