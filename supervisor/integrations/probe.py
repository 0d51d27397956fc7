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
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workerproc.store import Stats, StoreError
from workerproc.store.calls import CallTotals
from workerproc.store.limits import LimitInfo
from workerproc.store.webhooks import WebhookInfo

from ..logs import event

if TYPE_CHECKING:
    from ..loop.arbiter import Arbiter

STEP_NAME = "probe"
REJECTIONS_PER_READ = 5000  # a long history is counted over several reads, never in one stall
LOST_LEASES_REMEMBERED = 4096  # (task, attempt) pairs kept to count each lost lease once


@dataclass
class StatsProbe:
    every: float | None = None  # periodic read interval; None: only on demand
    stats: Stats | None = None  # the last successful read
    calls: CallTotals | None = None  # the paid calls' numbers (ctx.once), at that read
    limits: list[LimitInfo] = field(default_factory=list)  # flow control's limits
    webhooks: list[WebhookInfo] = field(default_factory=list)  # their delivery records (B20)
    ok_at: float | None = None  # monotonic time of that read
    read_at: float | None = None  # monotonic time of the last attempt, good or bad
    reads: int = 0
    failures: int = 0  # failed reads in total (a counter for metrics)
    error: str | None = None  # the last failure, while the database keeps failing
    # Writes the fence refused (``fence_rejections``), read incrementally after ``cursor``:
    # by operation, and how many distinct leases (task, attempt) they belonged to.
    cursor: int = 0
    rejections: Counter[str] = field(default_factory=Counter)
    lost_leases: int = 0
    _recent: OrderedDict[tuple[int, int], None] = field(default_factory=OrderedDict)

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
            with arb.gate.session() as store:  # one short session; closed before any fork
                stats = store.stats()
                calls = store.paid_call_totals()
                limits = store.limits(keys=0)
                webhooks = store.webhooks()
                rejected = store.fence_rejections(self.cursor, REJECTIONS_PER_READ)
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
        self.calls = calls
        self.limits = limits
        self.webhooks = webhooks
        for r in rejected:
            self.cursor = max(self.cursor, r.id)
            self.rejections[r.op] += 1
            key = (r.task_id, r.attempt)
            if key not in self._recent:
                self.lost_leases += 1
                self._recent[key] = None
                if len(self._recent) > LOST_LEASES_REMEMBERED:
                    self._recent.popitem(last=False)
        self.ok_at = arb.clock()
        self.reads += 1
        return True
