"""The progress watch: does the pool make progress while there is work?

A pool can be alive, ticking and still do nothing: a database that went read-only, a disk that is
full, a lock someone else holds. Workers then fail every claim and the queue stands still while
every liveness signal stays green. This step tells that apart from an idle pool and from a busy
one, cheaply:

- **claims** come from the workers' shared-memory status slots (``Counters.claims``, published
  after every commit): any increase since the last look is progress;
- **free workers** are up and idle or claiming (a worker inside a handler or committing is busy:
  a long handler is never a stall);
- **ready work** is one index lookup per served queue (``next_ready_at(--queues) <= now``),
  read only when nothing moved and some worker is free, so a busy pool never pays for it.

No progress + a free worker + ready work, look after look, is a stall. ``stalled_since`` (wall
clock) goes into the state file for ``supervisor health`` (exit 10 past ``--max-stall``), a
stall that lasts ``LOG_AFTER`` seconds is logged once, with its end, and every look while it
lasts tells the arbiter's subscribers how long it has lasted (``stalled``: chaos mode's verdict
counts a stall of 10 x the ttl as a violation, ``no_progress``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from workerproc.status import CLAIMING, IDLE
from workerproc.store import StoreError

from ..logs import event
from .arbiter import Arbiter

FREE_PHASES = (IDLE, CLAIMING)
LOG_AFTER = 30.0  # seconds of stall before the supervisor's log says so


@dataclass
class StallWatch:
    every: float = 1.0  # seconds between looks
    claims: dict[int, int] = field(default_factory=dict)  # worker pid -> claims last seen
    since: float | None = None  # arbiter clock: when the current stall began
    free: int = 0
    logged: bool = False

    def step(self, arb: Arbiter) -> None:
        if arb.stopping:
            self._set(arb, None)
            return
        if not arb.due("progress", self.every):
            return
        moved = self._moved(arb)
        self.free = self._free(arb)
        if moved or not self.free:
            self._set(arb, None)
            return
        ready = self._ready(arb)
        if ready is False:
            self._set(arb, None)
        elif ready:
            self._set(arb, self.since if self.since is not None else arb.clock())
        # unknown (the database did not answer): keep whatever we knew
        if self.since is not None:
            arb.events.emit("stalled", seconds=arb.clock() - self.since, free=self.free)

    def _moved(self, arb: Arbiter) -> bool:
        seen: dict[int, int] = {}
        moved = False
        for w in arb.pool.workers.values():
            counters = arb.board.slot(w.slot).read_counters(w.pid)
            claims = counters.claims if counters is not None else self.claims.get(w.pid, 0)
            seen[w.pid] = claims
            if claims > self.claims.get(w.pid, 0):
                moved = True
        self.claims = seen
        return moved

    def _free(self, arb: Arbiter) -> int:
        free = 0
        for w in arb.pool.active():
            state = arb.board.read(w.slot)
            if state is not None and state.pid == w.pid and state.phase in FREE_PHASES:
                free += 1
        return free

    @staticmethod
    def _ready(arb: Arbiter) -> bool | None:
        try:
            return arb.gate.ready_now(arb.config.worker.queues)
        except StoreError:
            return None

    def _set(self, arb: Arbiter, since: float | None) -> None:
        now = arb.clock()
        if since is None and self.since is not None and self.logged:
            stalled = now - self.since
            event("progress_resumed", f"the pool makes progress again after {stalled:.0f}s")
        if since is None:
            self.logged = False
        elif not self.logged and now - since >= LOG_AFTER:
            self.logged = True
            event(
                "no_progress",
                f"no task claimed for {now - since:.0f}s although work is ready and {self.free} "
                "workers are free: is the database read-only, locked or full?",
                level=logging.WARNING,
                free=self.free,
            )
        if since != self.since:
            arb.state_dirty = True
        self.since = since
        wall = None if since is None else round(time.time() - (now - since), 3)
        arb.extra_state["progress"] = {"stalled_since": wall, "free": self.free}
