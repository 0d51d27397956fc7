"""R4's start rule: a handler starts only on a lease the database confirmed a moment ago.

A lease promises "one holder at this moment", so a paid step must never begin on a lease that
may already belong to someone else: a claim that waited in a prefetch queue, or a process that
was paused (SIGSTOP, a long GC, a frozen VM) between its claim and the handler's start. The
rule is arithmetic over one number, the lease's **age**: the monotonic time since its last
confirmation (its claim, or a renewal) was *sent*. The store read its "now" after that moment,
so ``sent + ttl`` is never later than the real expiry.

- ``fresh``: a lease at most this old starts at once (a claim a few milliseconds ago is its
  confirmation). An older one is renewed synchronously first, every such lease of one turn in
  one statement (``Heartbeat.confirm``); only a renewal the database accepted lets it start, and
  a refused one (the lease was taken over) never starts.
- ``late``: the last checks, made on the thread that calls the handler: immediately before the
  call, and again at the handler's first read of its task (``ctx.payload``, ``ctx.state``: what
  a paid call is made of), so that no wait in between (another thread holding the GIL while
  the process is stopped, say) lets a stale lease begin. A lease older than this never starts:
  it goes back unstarted (a fenced hand-back: refused, and recorded, if someone took it over).
  A handler therefore always begins with at least half a ttl left on its lease, well ahead of
  its next renewal.

What no rule can close: a pause after the last check, inside the handler's first instructions,
is a pause inside the handler, and the fence (R5) covers it like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

FRESH_SHARE = 0.1  # of the ttl ...
FRESH_MAX = 1.0  # ... and never more than a second
LATE_SHARE = 0.5


@dataclass(frozen=True)
class StartRule:
    ttl: float

    @property
    def fresh(self) -> float:
        """The age up to which a lease starts without a renewal first."""
        return min(self.ttl * FRESH_SHARE, FRESH_MAX)

    @property
    def late(self) -> float:
        """The age past which a lease never starts, even on a thread it was handed to."""
        return self.ttl * LATE_SHARE

    def is_fresh(self, confirmed: float, now: float) -> bool:
        """Whether a lease confirmed at ``confirmed`` may start at ``now`` (both monotonic)
        without a renewal first."""
        return now - confirmed <= self.fresh

    def begin_by(self, confirmed: float) -> float:
        """The monotonic moment after which a lease confirmed at ``confirmed`` must not start."""
        return confirmed + self.late
