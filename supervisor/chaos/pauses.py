"""Workers chaos mode stopped on purpose (SIGSTOP) and when each one is resumed (SIGCONT)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..logs import event
from .fault_event import FaultEvent

if TYPE_CHECKING:
    from ..loop.arbiter import Arbiter
    from ..loop.pool import WorkerProcess


@dataclass
class Paused:
    worker: WorkerProcess
    resume_at: float  # arbiter clock
    faults: list[FaultEvent]  # one per lease it held (one with no task if none)


class Pauses:
    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self.paused: dict[int, Paused] = {}

    def __contains__(self, pid: object) -> bool:
        return pid in self.paused

    def add(self, worker: WorkerProcess, resume_at: float, faults: list[FaultEvent]) -> None:
        self.paused[worker.pid] = Paused(worker, resume_at, faults)

    def step(self, arb: Arbiter, now: float) -> None:
        """Resume the workers whose pause is over; ask to be woken for the others."""
        for pid, p in list(self.paused.items()):
            if now >= p.resume_at:
                self._resume(arb, pid, p)
            else:
                arb.wake_at(p.resume_at)

    def resume_all(self, arb: Arbiter) -> None:
        """Stopping: no worker stays frozen (a stopped process cannot drain or exit)."""
        for pid, p in list(self.paused.items()):
            self._resume(arb, pid, p)

    def _resume(self, arb: Arbiter, pid: int, p: Paused) -> None:
        del self.paused[pid]
        if arb.pool.send(p.worker, signal.SIGCONT):
            woke = self._wall()
            for fault in p.faults:
                fault.woke_at = woke
            paused = woke - p.faults[0].t
            event("chaos_resume", f"chaos: SIGCONT pid {pid} after {paused:.2f}s")
