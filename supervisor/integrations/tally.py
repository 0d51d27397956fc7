"""What the supervisor counts for its metrics, from the arbiter's event bus and the workers'
status slots. Exposition (names, types, the text format) is ``metrics``' job, not this one's.

- the event bus: worker starts, exits by kind and reason, reloads, chaos faults
  (``chaos_fault``) and leases fast-released after a worker died (``leases_released``);
- the workers' shared-memory status slots: claims, takeovers, handler times. Each worker counts
  into its slot after every task (no database write); the tally adds up the live slots and banks
  a reaped worker's last counts, so they cover this supervisor's workers since it started.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workerproc import exitcodes as wexit
from workerproc.status import Counters

from ..loop.arbiter import Arbiter
from ..loop.pool import Exit, ExitKind
from ..loop.signals import name as signal_name


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def exit_reason(ex: Exit) -> str:
    """Why a worker exited, as a low-cardinality label value."""
    worker = ex.worker
    if worker.expected_death:
        return "chaos"
    if ex.kind is ExitKind.RETIRED and worker.retiring:
        return slug(worker.retiring)  # stop, reload, memory, scale down, graceful timeout...
    if ex.signal is not None:
        return signal_name(ex.signal)
    return slug(wexit.describe(ex.code if ex.code is not None else -1))


@dataclass
class Tally:
    started_wall: float = field(default_factory=time.time)
    worker_starts: int = 0
    exits: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, reason)
    reloads: int = 0
    chaos_faults: Counter[str] = field(default_factory=Counter)
    leases_released: int = 0
    banked: Counters = field(default_factory=Counters)  # what reaped workers had counted
    _arb: Arbiter | None = None

    def install(self, arb: Arbiter) -> None:
        self._arb = arb
        arb.events.on("worker_started", self._on_started)
        arb.events.on("worker_exited", self._on_exited)
        arb.events.on("reloading", self._on_reloading)
        arb.events.on("chaos_fault", self._on_chaos_fault)
        arb.events.on("leases_released", self._on_leases_released)

    def _on_started(self, **_: Any) -> None:
        self.worker_starts += 1

    def _on_exited(self, exit: Exit, **_: Any) -> None:
        self.exits[(str(exit.kind), exit_reason(exit))] += 1
        if self._arb is not None:  # its slot keeps its last counters until a new worker starts
            counted = self._arb.board.slot(exit.worker.slot).read_counters(exit.worker.pid)
            if counted is not None:
                self.banked.add(counted)

    def _on_reloading(self, **_: Any) -> None:
        self.reloads += 1

    def _on_chaos_fault(self, fault: str, **_: Any) -> None:
        self.chaos_faults[slug(fault)] += 1

    def _on_leases_released(self, count: int, **_: Any) -> None:
        self.leases_released += count

    def work(self, arb: Arbiter) -> Counters:
        """Claims, takeovers and handler times: reaped workers' totals plus the live ones'."""
        total = Counters()
        total.add(self.banked)
        for w in arb.pool.workers.values():
            counted = arb.board.slot(w.slot).read_counters(w.pid)
            if counted is not None:
                total.add(counted)
        return total
