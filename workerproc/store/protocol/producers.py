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
    """``inserting`` on ``tx`` (the sync store, and the caller's own transaction)."""
    return drive(inserting(runs, tx.now), tx)


def inserting(runs: list[NewRun], now: float | None) -> Program[list[int]]:
    """Insert the runs and their first tasks, ids in the runs' order; a run whose key is taken
    (by a run that exists, or by an earlier run of the same batch) inserts nothing and answers
    that run's id. ``INSERT_RUNS`` writes each inserted run's ``run.enqueued`` event itself
    (B18), in the same statement on PostgreSQL. A debounced run (``debounced``) first asks its
    key's run to take its payload. A program (``programs``): the sync and the async store run
    this same one."""
    ids: list[int | None] = [None] * len(runs)
    for i, run in enumerate(runs):
        if run.debounce is not None:
            ids[i] = yield from debounced(run, now)
    for _ in range(DEBOUNCE_TRIES):
        rest = [i for i, found in enumerate(ids) if found is None]
        if not rest:
            return [int(x) for x in ids if x is not None]
        got = yield from _inserted([runs[i] for i in rest], now)
        for i, (run_id, made) in zip(rest, got, strict=True):
            # a debounced run whose key another start took meanwhile (an earlier item of the
            # batch, or a producer whose run committed first): that run takes its payload
            ids[i] = (
                run_id if made or runs[i].debounce is None else (yield from debounced(runs[i], now))
            )
    raise StoreError("a debounced start could not settle on a run (its key kept changing hands)")


DEBOUNCE_TRIES = 5  # inserts a debounced start tries, each after its key's run began meanwhile


def debounced(run: NewRun, now: float | None) -> Program[int | None]:
    """The key's run takes ``run``'s payload and start (pending, its one task never claimed):
    its id. Else None, and a run of the key that began or ended goes on without it, so the
    insert that follows takes the key. On PostgreSQL ``KEY_RUN`` holds the run first: no claim
    can begin it under the update; ``LOCK_KEY`` makes debounced starts of one key take turns
    (a plain start of the key may still insert first: the caller then tries again)."""
    yield "LOCK_KEY", {"key": run.key}
    rows = yield "KEY_RUN", {"key": run.key}
    if not rows:
        return None
    run_id = int(rows[0][0])
    params = {"run_id": run_id, "payload": run.payload, "delay": run.delay, "now": now}
    if (yield "DEBOUNCE_RUN", params):
        return run_id
    yield "RELEASE_KEY", {"run_id": run_id}
    return None


def _inserted(runs: list[NewRun], now: float | None) -> Program[list[tuple[int, bool]]]:
    """``INSERT_RUNS``: each run's id and whether it was made (False: its key was taken, the
    id that of the key's run)."""
    rows = yield "INSERT_RUNS", {"runs": runs, "now": now}  # (id, inserted, ...) each
    got = [(int(row[0]), bool(row[1])) for row in rows]
    placed = [r.gating for r, row in zip(runs, rows, strict=True) if row[1] and r.gating.line]
    if placed:  # gated runs joined their lines: each gate exists, each line may admit now
        place = placing(placed)
        yield "PLACE_GATES", {"gates": list(place.gates), "lines": list(place.lines), "now": now}
    taken = [i for i, (_, made) in enumerate(got) if not made]
    if taken:  # keys that name a run already there: the first run's id, nothing created
        keys = [runs[i].key for i in taken]
        found: dict[str | None, int] = dict((yield "FIND_BY_KEYS", {"keys": keys}))
        for i in taken:
            if runs[i].key not in found:
                raise StoreError(f"{runs[i].key!r}: a run with this key was not found")
            got[i] = (int(found[runs[i].key]), False)
    return got


def placing(gatings: list[Gating]) -> Placing:
    """What ``PLACE_GATES`` writes: every gate the runs name (created when new), and the
    lines they joined (each may admit a run now, unless it is closed for a while)."""
    gates = sorted({g for x in gatings for g in x.gates})
    lines = sorted({x.line for x in gatings if x.line})
    return Placing(tuple(gates), tuple(lines))
