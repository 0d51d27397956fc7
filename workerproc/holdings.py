"""What a worker holds, across its threads: the handlers running and the claimed leases waiting for
a slot (the endings not collected yet wait in the conductor's inbox, ``events.py``).

Deliveries (B20) are held here too, but on the worker's delivery lane: ``on_lane`` tells their
leases apart, ``lane`` counts those running, and the ``View`` the policy decides from counts the
users' slots without them (and the lane's apart), so no delivery takes a user's slot.

The conductor, the slot threads, the event loop and the heartbeat thread all touch them, so one
lock guards both. It is held for a few dict and deque operations at a time, never across a
call out (a store, a handler, the heartbeat); code that needs a few steps in one (a slot thread
taking the next waiting lease into ``running``) holds ``lock`` itself.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable

from .execution import Execution, Mode, Stopped
from .policy import View
from .store import Lease


class Holdings:
    def __init__(self, on_lane: Callable[[Lease], bool] | None = None) -> None:
        self.lock = threading.Lock()
        self.running: dict[int, Execution] = {}  # task id -> a handler running now
        self.waiting: deque[Lease] = deque()  # claimed (prefetched), waiting for a slot
        self.on_lane = on_lane  # whether a lease is the delivery lane's (None: no lane)
        self.lane = 0  # of the running, the lane's (``Mode.LANE``)
        self.riders = 0  # of the running, items riding in a batch (its leader holds the slot)
        # of the waiting, the lane's: a turn with no delivery waiting finds none without a scan
        # of every waiting lease (the conductor asks at each start, with dozens waiting)
        self.lane_waiting = 0

    def lane_lease(self, lease: Lease) -> bool:
        """Whether ``lease`` is the delivery lane's (a webhook delivery)."""
        return self.on_lane is not None and self.on_lane(lease)

    def _gone(self, leases: Iterable[Lease]) -> None:
        """``leases`` left the waiting ones (holding ``lock``)."""
        if self.on_lane is not None:
            self.lane_waiting -= sum(map(self.on_lane, leases))

    def users(self) -> int:
        """The users' handlers running now (holding ``lock``; a batch is one)."""
        return len(self.running) - self.lane - self.riders

    def begin(self, ex: Execution) -> None:
        """``ex`` starts: it is running (holding ``lock``)."""
        self.running[ex.lease.task_id] = ex
        if ex.mode is Mode.LANE:
            self.lane += 1
        self.riders += ex.rider

    def executions(self) -> list[Execution]:
        """The handlers running now (never iterate ``running`` without the lock)."""
        with self.lock:
            return list(self.running.values())

    def view(self, capacity: int, finished: int, since: float | None) -> View:
        """What the policy looks at: counts, and (every users' slot busy) the youngest start;
        the delivery lane's running and waiting leases apart (``View.lane``)."""
        with self.lock:
            running = len(self.running) - self.lane - self.riders
            youngest = -math.inf
            if running and running >= capacity:
                youngest = max(ex.started for ex in self.running.values()
                               if ex.mode is not Mode.LANE)  # fmt: skip
            lane_waiting = self.lane_waiting
            return View(running, youngest, len(self.waiting) - lane_waiting, finished, since,
                        self.lane + lane_waiting, lane_waiting)  # fmt: skip

    def busy(self) -> bool:
        """Something is left to do: a live handler or a waiting lease (a handler abandoned after
        a timeout does not count: its lease went back already)."""
        with self.lock:
            if self.waiting:
                return True
            return any(ex.stopped is not Stopped.ABANDONED for ex in self.running.values())

    # -- endings ----------------------------------------------------------------------------------
    def end(self, ex: Execution) -> None:
        """``ex``'s handler ended (any thread): its slot is free."""
        with self.lock:
            if self.running.get(ex.lease.task_id) is ex:  # never a newer attempt's slot
                del self.running[ex.lease.task_id]
                self.lane -= ex.mode is Mode.LANE
                self.riders -= ex.rider

    # -- waiting leases ---------------------------------------------------------------------------
    def take_task(self, task: str, most: int) -> list[Lease]:
        """Up to ``most`` waiting leases of ``task`` (a batch takes them in), each of a task
        that runs no older attempt here (holding ``lock``)."""
        taken = [lease for lease in self.waiting
                 if lease.task == task and lease.task_id not in self.running][:most]  # fmt: skip
        for lease in taken:
            self.waiting.remove(lease)
        self._gone(taken)
        return taken

    def add_waiting(self, leases: Iterable[Lease]) -> None:
        leases = list(leases)
        with self.lock:
            self.waiting.extend(leases)
            if self.on_lane is not None:
                self.lane_waiting += sum(map(self.on_lane, leases))

    def startable(self, users: bool = True, lane: bool = False) -> Lease | None:
        """The first waiting lease whose task runs no older attempt here (one lost, its handler
        not ended yet: two attempts of one task never run at once in one process; the check is
        per task, not per run), among the users' (``users``: a users' slot is free) and the
        delivery lane's (``lane``: a lane slot is free). Call it holding ``lock``."""
        if not users and not (lane and self.lane_waiting):
            return None  # nothing it could start: no scan
        for lease in self.waiting:
            if lease.task_id not in self.running and (lane if self.lane_lease(lease) else users):
                return lease
        return None

    def take(self, lease: Lease) -> None:
        """Take ``lease`` out of the waiting ones to start it (holding ``lock``)."""
        if self.waiting[0] is lease:
            self.waiting.popleft()
        else:
            self.waiting.remove(lease)
        self._gone((lease,))

    def take_waiting(self) -> list[Lease]:
        """Every waiting lease (to go back unstarted), leaving none."""
        with self.lock:
            leases = list(self.waiting)
            self.waiting.clear()
            self.lane_waiting = 0
        return leases

    def drop_waiting(self, lease: Lease) -> bool:
        """Remove ``lease`` if it still waits (it was lost: it never starts)."""
        with self.lock:
            if lease in self.waiting:
                self.waiting.remove(lease)
                self._gone((lease,))
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
                self._gone((lease,))
        return ex, waiting

    def clear(self) -> tuple[list[Execution], list[Lease]]:
        """Everything running and waiting, leaving nothing (QUIT, dead slots)."""
        with self.lock:
            running, waiting = list(self.running.values()), list(self.waiting)
            self.running.clear()
            self.waiting.clear()
            self.lane = self.riders = self.lane_waiting = 0
        return running, waiting
