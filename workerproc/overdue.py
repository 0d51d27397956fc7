"""The heartbeat's second pair of eyes: a lease whose local deadline passes while the heartbeat
thread is stuck inside a call (a renewal sent into a network that stopped carrying packets, a
reconnect that waits for its timeout) is lost at that deadline, not when the call returns.

The heartbeat thread judges a lease's deadline itself only when a renewal *fails*. A call that
hangs does not fail for a while (``network_timeout`` on PostgreSQL, then a reconnect): meanwhile
its handler would go on past the deadline, and past the moment the database may let another
worker take the task over (R4: a handler learns of its loss at the local deadline, the
confirmation's send time plus the ttl, which is never later than the database's expiry). This
thread only reads the clock and the heartbeat's records; it never speaks to the database.

Only a deadline that passes *during* the call counts: one already past when the call began (the
process was paused, say) is the database's to judge (R5: the renewal is sent, and its refusal
recorded as evidence), and so is one that passed while this thread itself did not run (it looked
``LATE``: a pause).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from .held import LATE, Held
from .signals import main_thread_only

# (now, deadlines up to this moment are not ours) -> (next look, leases overdue now)
Look = Callable[[float, float], tuple[float, list[Held]]]

MAX_WAIT = 1.0  # the longest sleep while a lease is held (a call may begin meanwhile, unsaid)
# With nothing held there is nothing to watch: the watch sleeps on its condition, which the
# first lease tracked notifies (``Heartbeat.track``); the bound only keeps every wait bounded.
IDLE_WAIT = 30.0
IDLE_RECHECK = 0.05  # past a deadline with no call in flight: the heartbeat judges it itself
# While a call is in flight the watch looks at least this often, so that a pause of the whole
# process (SIGSTOP, a frozen VM) shows as a look ``LATE`` past its moment however close the
# next deadline was planned to the moment the process resumed.
BUSY_TICK = LATE / 2


def overdue(
    held: Iterable[Held], now: float, ttl: float, *, busy: bool, after: float
) -> tuple[float, list[Held]]:
    """When to look next (``inf``: nothing is held, nothing to look at until a lease is), and
    (only while a call is in flight: ``busy``) the live leases whose local deadline passed
    after ``after`` (when the call began, or the watch last woke late)."""
    held = list(held)
    if not held:
        return math.inf, []
    live = [h for h in held if h.lost_at is None and not h.timed_out and h.deadline(ttl) > after]
    if not live:
        return now + MAX_WAIT, []
    wake = min(h.deadline(ttl) for h in live)
    if not busy:
        return max(wake, now + IDLE_RECHECK), []
    return min(wake, now + BUSY_TICK), [h for h in live if h.deadline(ttl) <= now]


class OverdueWatch:
    def __init__(self, cond: threading.Condition, look: Look,
                 lose: Callable[[Held], None]) -> None:  # fmt: skip
        """``look(now)``, called under ``cond``: when to look next and what is overdue; each
        overdue lease is handed to ``lose`` outside the lock."""
        self._cond = cond
        self._look = look
        self._lose = lose
        self._closed = False
        self.idle = False  # asleep with nothing held: a lease tracked must notify ``cond``
        self._thread = threading.Thread(target=self._main, name="overdue-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _main(self) -> None:
        main_thread_only()
        planned = time.monotonic()
        resumed = 0.0  # the last look that came LATE: deadlines before it are not ours
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                if now - planned > LATE:
                    resumed = now
                wake, overdue = self._look(now, resumed)
                if not overdue:
                    self.idle = wake == math.inf
                    pause = IDLE_WAIT if self.idle else max(0.001, min(wake - now, MAX_WAIT))
                    planned = now + pause
                    self._cond.wait(pause)
                    self.idle = False
                    planned = min(planned, time.monotonic())  # woken early: on time
                    continue
                planned = time.monotonic()
            for held in overdue:
                self._lose(held)
