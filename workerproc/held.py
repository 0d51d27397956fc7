"""What the heartbeat knows of each lease it holds (``Held``), and what falls due when (``look``):
a renewal, a task timeout, the stuck check of a lost lease's handler. Pure: the heartbeat thread
(``heartbeat.py``) calls it with the moment it looks, under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .store import Lease

LATE = 0.25  # a look this long past its moment: this thread did not run (the process paused)


@dataclass
class Held:
    lease: Lease
    confirmed: float  # monotonic: when its last successful claim or renewal was sent
    due: float  # monotonic: renew it by then
    started: float | None = None  # the handler started (task_timeout counts from here)
    timeout_at: float | None = None  # monotonic: task_timeout after the start (or postponed)
    finished: bool = False  # the handler returned: no timeout, no stuck check
    lost_at: float | None = None
    stuck_at: float | None = None  # monotonic: its handler is stuck if still running then
    timed_out: bool = False
    cancelled: bool = False  # a renewal said its run was cancelled (``RunCancelled`` posted)
    recorded: bool = True  # the database counts its handler as begun (B3: the claim said so,
    # or a renewal that carried its start landed)

    def deadline(self, ttl: float) -> float:
        """Monotonic: the lease may be gone after this."""
        return self.confirmed + ttl


def look(
    held: Iterable[Held], now: float, ttl: float, *, urgent: bool = False
) -> tuple[float, list[Held], list[Held], list[Held]]:
    """At monotonic ``now``: when to look next at the latest (``inf``: nothing to wait for),
    and what is due: renewals (every live lease when ``urgent``), timeouts, stuck handlers. A
    lost lease's handler gets a ttl of the process's own time: a look ``LATE`` past that moment
    means the process did not run meanwhile (a pause), so the ttl counts again from now."""
    wake = math.inf
    due, timeouts, stuck = [], [], []
    for h in held:
        if h.lost_at is not None:
            if h.started is not None and not h.finished:
                at = h.stuck_at if h.stuck_at is not None else h.lost_at + ttl
                if at <= now - LATE:  # looked at late: the process did not run meanwhile
                    at = h.stuck_at = now + ttl
                elif at <= now:
                    stuck.append(h)
                wake = min(wake, at)
            continue
        if h.timed_out:
            continue
        if h.timeout_at is not None and not h.finished:
            at = h.timeout_at
            if at <= now:
                timeouts.append(h)
                continue
            wake = min(wake, at)
        if h.due <= now or urgent:
            due.append(h)
        wake = min(wake, h.due)
    return wake, due, timeouts, stuck
