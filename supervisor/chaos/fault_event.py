"""One lease a chaos fault orphaned, as the verifier follows it (``verifier``): what was struck
and when, what became of the lease, and the takeover clock (``room``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# the clock's own bookkeeping and what the report does not show
PRIVATE = ("bound_s", "owner", "looked_at", "was_claimable", "claimable_s", "lease_end")


@dataclass
class FaultEvent:
    fault: str  # kill | pause
    pid: int
    task_id: int
    attempt: int
    t: float  # wall clock, same clock as the store's on this host
    phase: str  # what the victim was doing: handler (with slots, its main loop's phase)
    bound_s: float
    run_id: int = 0
    owner: str = ""
    expires_at: float | None = None  # the lease's end in the database when the victim froze
    outcome: str = "pending"  # taken_over | finished_before | committed_in_flight
    #   | superseded_before | run_over | resumed_early | committed_after_fault | lost
    #   | not_taken_over | unresolved
    taken_over_ms: float | None = None  # from the fault to the next attempt's claim
    lease_ended_ms: float | None = None  # from the fault to the lease's end
    claimable_ms: float | None = None  # of the wait, the time it could be claimed (the clock)
    woke_at: float | None = None
    zombie_rejections: int = 0
    # the takeover clock: the last look at it, and what it said
    lease_end: float | None = None
    looked_at: float | None = None
    was_claimable: bool = False
    claimable_s: float = 0.0

    @property
    def stalls_the_store(self) -> bool:
        """Paused inside a store call: it may hold the write lock, so the whole pool waits."""
        return self.fault == "pause" and self.phase.rstrip("?") in ("claiming", "committing")

    @property
    def orphaned(self) -> bool:
        return self.outcome in ("taken_over", "not_taken_over", "lost")

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        for key in PRIVATE:
            out.pop(key)
        return out
