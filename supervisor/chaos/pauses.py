"""Workers chaos mode stopped on purpose (SIGSTOP) and when each one is resumed (SIGCONT)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..logs import event
from .verifier import FaultEvent

if TYPE_CHECKING:
    from ..loop.arbiter import Arbiter
    from ..loop.pool import Worker


@dataclass
class Paused:
    worker: Worker
    resume_at: float  # arbiter clock
    fault: FaultEvent


class Pauses:
    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self.paused: dict[int, Paused] = {}

    def __contains__(self, pid: object) -> bool:
        return pid in self.paused

    def add(self, worker: Worker, resume_at: float, fault: FaultEvent) -> None:
        self.paused[worker.pid] = Paused(worker, resume_at, fault)

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
            p.fault.woke_at = woke = self._wall()
            event("chaos_resume", f"chaos: SIGCONT pid {pid} after {woke - p.fault.t:.2f}s")
