"""What a worker holds, across its threads: the handlers running, the claimed leases waiting for a
slot, and the executions that ended and were not collected yet.

The conductor, the slot threads, the event loop and the heartbeat thread all touch them, so one
lock guards the three. It is held for a few dict and deque operations at a time, never across a
call out (a store, a handler, the heartbeat); code that needs a few steps in one (a slot thread
taking the next waiting lease into ``running``) holds ``lock`` itself.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable

from .execution import Execution, Stopped
from .policy import View
from .store import Lease


class Holdings:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[int, Execution] = {}  # task id -> a handler running now
        self.waiting: deque[Lease] = deque()  # claimed (prefetched), waiting for a slot
        self.ended: deque[Execution] = deque()  # ended, not collected yet

    def executions(self) -> list[Execution]:
        """The handlers running now (never iterate ``running`` without the lock)."""
        with self.lock:
            return list(self.running.values())

    def view(self, capacity: int, finished: int, since: float | None) -> View:
        """What the policy looks at: counts, and (every slot busy) the youngest start."""
        with self.lock:
            running = len(self.running)
            youngest = -math.inf
            if running and running >= capacity:
                youngest = max(ex.started for ex in self.running.values())
            return View(running, youngest, len(self.waiting), finished, since)

    def busy(self) -> bool:
        """Something is left to do: a live handler, an ending not collected, a waiting lease
        (a handler abandoned after a timeout does not count: its lease went back already)."""
        with self.lock:
            if self.ended or self.waiting:
                return True
            return any(ex.stopped is not Stopped.ABANDONED for ex in self.running.values())

    # -- endings ----------------------------------------------------------------------------------
    def end(self, ex: Execution) -> bool:
        """``ex``'s handler ended (any thread): its slot is free. True for the first ending
        since the last ``collect`` (the one that must wake the conductor)."""
        with self.lock:
            if self.running.get(ex.lease.task_id) is ex:  # never a newer attempt's slot
                del self.running[ex.lease.task_id]
            first = not self.ended
            self.ended.append(ex)
        return first

    def collect(self) -> list[Execution]:
        with self.lock:
            ended = list(self.ended)
            self.ended.clear()
        return ended

    # -- waiting leases ---------------------------------------------------------------------------
    def add_waiting(self, leases: Iterable[Lease]) -> None:
        with self.lock:
            self.waiting.extend(leases)

    def startable(self) -> Lease | None:
        """The first waiting lease whose task runs no older attempt here (one lost, its handler
        not ended yet: two attempts of one task never run at once in one process; the check is
        per task, not per run). Call it holding ``lock``."""
        for lease in self.waiting:
            if lease.task_id not in self.running:
                return lease
        return None

    def take(self, lease: Lease) -> None:
        """Take ``lease`` out of the waiting ones to start it (holding ``lock``)."""
        if self.waiting[0] is lease:
            self.waiting.popleft()
        else:
            self.waiting.remove(lease)

    def take_waiting(self) -> list[Lease]:
        """Every waiting lease (to go back unstarted), leaving none."""
        with self.lock:
            leases = list(self.waiting)
            self.waiting.clear()
        return leases

    def drop_waiting(self, lease: Lease) -> bool:
        """Remove ``lease`` if it still waits (it was lost: it never starts)."""
        with self.lock:
            if lease in self.waiting:
                self.waiting.remove(lease)
                return True
        return False

    def find(self, lease: Lease) -> tuple[Execution | None, bool]:
        """The execution running ``lease``'s attempt, if any; and whether ``lease`` was still
        waiting (then it is removed: a lease reported lost or timed out never starts)."""
        with self.lock:
            ex = self.running.get(lease.task_id)
            if ex is not None and ex.lease.attempt != lease.attempt:
                ex = None  # another attempt's (a later one, or an older one still ending)
            waiting = ex is None and lease in self.waiting
            if waiting:
                self.waiting.remove(lease)
        return ex, waiting

    def clear(self) -> tuple[list[Execution], list[Lease]]:
        """Everything running and waiting, leaving nothing (QUIT, dead slots)."""
        with self.lock:
            running, waiting = list(self.running.values()), list(self.waiting)
            self.running.clear()
            self.waiting.clear()
        return running, waiting
