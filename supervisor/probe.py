"""The supervisor's cached view of the queue, shared by sd_notify (STATUS, watchdog health) and
the metrics endpoint.

One read is one short store session (``StoreGate.stats``: open, one snapshot, close), so the
parent still holds no connection when it forks. Reads happen in a loop step, either every
``every`` seconds or on demand when a scrape finds the cache older than it accepts; never once
per loop turn. ``ok_at`` is when the database last answered: the watchdog stops being petted
when it is too old.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workerproc.store import Stats, StoreError

from .logs import event

if TYPE_CHECKING:
    from .arbiter import Arbiter

STEP_NAME = "probe"


@dataclass
class StatsProbe:
    every: float | None = None  # periodic read interval; None: only on demand
    stats: Stats | None = None  # the last successful read
    ok_at: float | None = None  # monotonic time of that read
    read_at: float | None = None  # monotonic time of the last attempt, good or bad
    reads: int = 0
    failures: int = 0  # failed reads in total (a counter for metrics)
    error: str | None = None  # the last failure, while the database keeps failing

    def want_every(self, seconds: float) -> None:
        """Ask for periodic reads at least this often (several users: the smallest wins)."""
        self.every = seconds if self.every is None else min(self.every, seconds)

    def step(self, arb: Arbiter) -> None:
        if self.every is not None and arb.due(STEP_NAME, self.every):
            self.read(arb)

    def at_most(self, arb: Arbiter, max_age: float) -> Stats | None:
        """The cached stats, read again first when the last attempt is older than ``max_age``."""
        if self.read_at is None or arb.clock() - self.read_at >= max_age:
            self.read(arb)
        return self.stats

    def age(self, now: float) -> float | None:
        return None if self.ok_at is None else now - self.ok_at

    def read(self, arb: Arbiter) -> bool:
        now = arb.clock()
        self.read_at = now
        try:
            stats = arb.gate.stats()
        except StoreError as exc:
            self.failures += 1
            if self.error is None:
                event(
                    "store_unreachable",
                    f"cannot read queue statistics: {exc}",
                    level=logging.WARNING,
                    error=str(exc),
                )
            self.error = str(exc)
            return False
        if self.error is not None:
            event("store_reachable", "the database answers again")
        self.error = None
        self.stats = stats
        self.ok_at = arb.clock()
        self.reads += 1
        return True
