"""Operators' bulk writes, written once: retry, cancel or signal many runs by a filter or a list
of ids, ``BULK`` runs per write transaction (no lock is held long, and what a crash interrupts
is whole batches), each run through the same per-run step as the single call (``operators``,
``waits``), held first (its row lock on PostgreSQL), in id order.

A filter's runs are read as each batch begins (``RUNS_MATCHING``: the users' runs only, never
the system's) and each is then judged again, held: a run that moved meanwhile (retried,
finished) is left as it is and not counted."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ..asks import SignalAsk
from ..codec import check_name, check_queue
from ..dialect import Dialect, Params, Tx
from ..errors import InvalidOption, RunNotFound
from ..types import JSON, TERMINAL_STATUSES
from .operators import cancel, retry
from .reads import below, status_filter
from .waits import refusal, signal_ask, signal_event

BULK = 1000  # runs per write transaction
MAX_WITHIN = 100 * 365 * 86_400.0  # ``since``: seconds back, at most a century
RETRYABLE = ("failed", "cancelled")
LIVE = ("pending", "running", "waiting")


def check_since(since: float | None) -> float | None:
    """``since``: None (any time) or a number of seconds back, above 0."""
    if since is None:
        return None
    try:
        seconds = math.nan if isinstance(since, bool) else float(since)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds <= MAX_WITHIN:
        raise InvalidOption(f"since must be a number of seconds above 0 (got {since!r})")
    return seconds


def matching(status: str | None, task: str | None, queue: str | None) -> Params:
    """A filter's parameters (``RUNS_MATCHING``), each checked; None: any."""
    try:
        found = status_filter(status)
    except ValueError as exc:
        raise InvalidOption(str(exc)) from None
    return {**found, "live": None, "task": None if task is None else check_name(task),
            "queue": None if queue is None else check_queue(queue), "below": below(False),
            "created_within": None, "finished_within": None}  # fmt: skip


class Bulk:
    dialect: Dialect

    def retry_many(
        self, status: str = "failed", task: str | None = None, since: float | None = None, *,
        queue: str | None = None,
    ) -> int:  # fmt: skip
        """Retry (B2) every run of ``status`` (failed or cancelled) that matches the filter:
        its ``task`` (the run's first task, as ``list_runs`` shows it), its ``queue``, finished
        within the last ``since`` seconds. How many runs were retried."""
        if status not in RETRYABLE:
            raise InvalidOption(f"retry_many takes status failed or cancelled (got {status!r})")
        params = {**matching(status, task, queue), "finished_within": check_since(since)}
        return self._each(retry, params)

    def cancel_many(
        self, task: str | None = None, status: str | None = None, since: float | None = None,
        *, queue: str | None = None, every: bool = False,
    ) -> int:  # fmt: skip
        """Cancel every live run that matches the filter: its ``task``, its ``status``
        (pending, running or waiting; None: any of them), its ``queue``, created within the
        last ``since`` seconds. An empty filter is refused unless ``every`` (every live run of
        the users'). How many runs were cancelled (their children with them)."""
        if status is not None and status not in LIVE:
            raise InvalidOption(f"cancel_many takes status {', '.join(LIVE)} (got {status!r})")
        if not every and task is None and status is None and since is None and queue is None:
            raise InvalidOption(
                "cancel_many needs a filter (task, status, since or queue); every=True cancels "
                "every live run"
            )
        params = {**matching(status, task, queue), "live": True,
                  "created_within": check_since(since)}  # fmt: skip
        return self._each(cancel, params)

    def signal_many(
        self, run_ids: Iterable[int], name: str, payload: JSON = None
    ) -> dict[int, bool]:
        """Send signal ``name`` with ``payload`` to each run of ``run_ids``, as ``signal``
        does: for each run, True when the signal was kept (delivered now or at the run's next
        wait for it), False when the run is unknown or over (nothing kept for it)."""
        ids = list(dict.fromkeys(run_ids))
        encoded = {run_id: signal_ask(run_id, name, payload) for run_id in ids}
        sent: dict[int, bool] = {}
        for start in range(0, len(ids), BULK):
            batch = sorted(ids[start : start + BULK])

            def write(tx: Tx, batch: list[int] = batch) -> dict[int, bool]:
                return {run_id: _signalled(tx, encoded[run_id]) for run_id in batch}

            sent.update(self.dialect.write(write, runs=batch))
        return {run_id: sent[run_id] for run_id in ids}

    def _each(self, one: Callable[[Tx, int], bool], params: Params) -> int:
        """``one`` for every run ``params`` match, a batch of ``BULK`` per transaction; how
        many it changed."""
        after, done = 0, 0
        while True:

            def batch(tx: Tx, after: int = after) -> tuple[list[int], int]:
                rows = tx.rows("RUNS_MATCHING", {**params, "after": after, "limit": BULK,
                                                 "now": tx.now})  # fmt: skip
                ids = [int(row[0]) for row in rows]
                return ids, sum(1 for run_id in ids if _changed(one, tx, run_id))

            ids, changed = self.dialect.write(batch)
            done += changed
            if len(ids) < BULK:
                return done
            after = ids[-1]


def _changed(one: Callable[[Tx, int], bool], tx: Tx, run_id: int) -> bool:
    try:
        return one(tx, run_id)
    except RunNotFound:  # pruned since the batch read it
        return False


def _signalled(tx: Tx, ask: SignalAsk) -> bool:
    """``signal`` on ``tx`` (the driver's verb, then its event): False for a run that is
    unknown or finished (nothing kept)."""
    sent = tx.signal(ask)
    if sent.signal_id is None:
        if sent.status is None or sent.status in TERMINAL_STATUSES:
            return False
        raise refusal(ask.run_id, sent)
    tx.events.append(signal_event(ask, sent))
    return True
