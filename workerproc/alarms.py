"""What becomes of a worker's tasks when its heartbeat thread reports (``events.py``): a lease
lost, a run cancelled, a handler past --task-timeout, a handler that ignored its lost lease, the
heartbeat's own death; and the chore it runs while an inline handler holds the conductor's thread
(handing back what waits behind a slow one).

These are the reactions that cannot wait for the conductor's turn (``events.py`` says why), so
they run on the thread that reports, through ``Alarms.react`` (the worker's reflex): on the
heartbeat thread, except for a lost lease, also reported on the conductor's when a claim of this
worker takes over its own older attempt (``Heartbeat.track``). They only take the holdings' lock,
set flags and interrupt handlers through their executor (``Executor.interrupt``), each safe from
either thread. Everything else they answer as a ``Reaction`` the heartbeat carries out on its own
thread and connection (the writes that cannot wait, fenced: a no-op for a lease whose commit came
first; the leases it stops renewing; the exit), or post as an event for the conductor (a drain).
Alarms hold no heartbeat, no store, no worker. A handler that cannot be interrupted after its
timeout costs the worker its slot: the worker drains and exits (``TASK_TIMEOUT``) to be
replaced, at once when that slot is the conductor's own thread.
"""

from __future__ import annotations

import dataclasses
import logging

from . import exitcodes
from .config import WorkerConfig
from .events import (
    DrainAsked,
    Event,
    HandlerStuck,
    HeartbeatDied,
    LeaseLost,
    Post,
    Reaction,
    RunCancelled,
    SlowBehind,
    TaskTimedOut,
)
from .execution import Execution, Stopped, max_attempts, task_timeout
from .executors import Executors
from .holdings import Holdings
from .logs import attempt_of, event
from .store import Commit, Lease

log = logging.getLogger("workerproc.worker")

# A loop that has not ticked for this long is held by the handler it runs: a timeout of any
# other async handler is not that one's fault (it cannot run), and is put off.
STALLED = 0.25
POSTPONE = Reaction(postpone=True)


class Alarms:
    def __init__(
        self, config: WorkerConfig, holdings: Holdings, executors: Executors, post: Post
    ) -> None:
        self.config = config
        self.holdings = holdings
        self.executors = executors
        self._post = post  # what the conductor hears of (a drain)

    def react(self, report: Event) -> Reaction | None:
        """The heartbeat's ``report``, on the thread that made it; what that thread does next."""
        match report:
            case LeaseLost(lease, why):
                return self.lease_lost(lease, why)
            case RunCancelled(lease):
                return self.run_cancelled(lease)
            case TaskTimedOut(lease):
                return self.timed_out(lease)
            case HandlerStuck(lease):
                return self.handler_stuck(lease)
            case HeartbeatDied():
                self.heartbeat_died()
        return None

    # -- prefetched leases that go back unstarted ---------------------------------------------
    def hand_back_behind(self) -> Reaction:
        """A chore the conductor leaves to the heartbeat thread while an inline handler holds
        its own: that handler turned out slow, so what waits behind it goes back (and the
        conductor hears of it: the prefetch is earned again)."""
        leases = tuple(self.holdings.take_waiting())
        return Reaction(write=tuple(Commit(lease, "handback") for lease in leases),
                        forget=leases, then=SlowBehind(len(leases)),
                        what=f"the hand-back of {len(leases)} prefetched tasks",
                        failed="handback_failed", level=logging.WARNING)  # fmt: skip

    # -- the heartbeat's reports -----------------------------------------------------------------
    def _find(self, lease: Lease) -> tuple[Execution | None, tuple[Lease, ...]]:
        """The execution running ``lease``, and ``lease`` itself when it still waited for a
        slot: it never starts now (out of the waiting line), and is renewed no more."""
        ex, waiting = self.holdings.find(lease)
        return ex, (lease,) if waiting else ()

    def lease_lost(self, lease: Lease, why: str) -> Reaction | None:
        """The heartbeat lost ``lease`` (a refused renewal, or its local deadline passed; on
        the heartbeat thread), or this worker's own claim took its task over (on the
        conductor's, from ``Heartbeat.track``)."""
        event(
            log,
            "lease_lost",
            f"task {lease.task_id} {self._attempt(lease)}: lease lost ({why})",
            level=logging.WARNING,
            task_id=lease.task_id,
            attempt=lease.attempt,
            why=why,
        )
        ex, waiting = self._find(lease)
        if ex is not None:  # (None: a late word about a task behind us: never the next one's)
            ex.lost.set()  # a thread's next ctx call raises LeaseLost
            self.executors[ex.mode].interrupt(ex, Stopped.LOST)
        return Reaction(forget=waiting) if waiting else None

    def run_cancelled(self, lease: Lease) -> Reaction | None:
        """A renewal answered that ``lease``'s run was cancelled (B15): its handler stops
        (``RunCancelled`` at its next ctx call, at once inline; an async one is cancelled) and
        its lease is released, nothing of the run written. A lease that still waited for a
        slot never starts: it is handed back now, on the heartbeat's connection (fenced)."""
        event(
            log,
            "run_cancelled",
            f"run {lease.run_id} cancelled in flight: stopping task {lease.task_id} "
            f"({lease.task}) {self._attempt(lease)}",
            run_id=lease.run_id,
            task_id=lease.task_id,
            attempt=lease.attempt,
        )
        ex, waiting = self._find(lease)
        if waiting:
            return Reaction(write=(Commit(lease, "handback"),), forget=waiting,
                            what="a cancelled run's hand-back")  # fmt: skip
        if ex is None:
            return None  # its commit is under way: it answers conflict, settled as a drop
        ex.cancelled.set()  # a thread's next ctx call raises RunCancelled
        self.executors[ex.mode].interrupt(ex, Stopped.CANCELLED)
        return None

    def timed_out(self, lease: Lease) -> Reaction | None:
        """``lease``'s handler outlived --task-timeout. ``postpone``: not its fault yet (another
        handler blocks the event loop it needs; the heartbeat asks again soon)."""
        ex, waiting = self._find(lease)
        if ex is None:
            return Reaction(forget=waiting) if waiting else None
        executor = self.executors[ex.mode]
        blocked = executor.blocked(STALLED)  # one handler holds the executor (the event loop)
        if blocked is not None and blocked[1] is not ex:
            blocker = blocked[1]
            if blocker is not None and blocker.stopped is Stopped.TIMEOUT:
                stuck = self._loop_stuck(blocker, blocked[0])  # the blocker's time is up
                if stuck is not None:
                    return dataclasses.replace(stuck, postpone=True)
            return POSTPONE
        event(
            log,
            "task_timeout",
            f"task {lease.task_id} {self._attempt(lease)} outlived its timeout "
            f"({self._limit(lease)})",
            level=logging.ERROR,
            task_id=lease.task_id,
            attempt=lease.attempt,
            slot=str(ex.mode),
        )
        if blocked is not None:  # it holds the loop itself: no cancel lands
            ex.stopped = Stopped.TIMEOUT
            return self._loop_stuck(ex, blocked[0])
        if executor.interrupt(ex, Stopped.TIMEOUT):
            return None  # cancelled: it ends, and is released
        # A Python call cannot be stopped safely from outside: release the lease now (fenced:
        # a no-op if its commit came first). On the conductor's thread, the process goes and
        # its parent replaces it; on a thread, the worker stops claiming and exits once its
        # other slots finish.
        ex.stopped = Stopped.ABANDONED
        error = f"TaskTimeout: handler ran longer than {task_timeout(lease, self.config) or 0:g} s"
        release = (Commit(lease, "release", error=error),)
        if executor.on_conductor:
            return Reaction(write=release, exit=exitcodes.TASK_TIMEOUT, what="the timeout")
        drain = DrainAsked(exitcodes.TASK_TIMEOUT, f"task {lease.task_id} timed out on a thread")
        return Reaction(write=release, forget=(lease,), then=drain, what="the timeout")

    def _attempt(self, lease: Lease) -> str:
        return attempt_of(lease, max_attempts(lease, self.config))

    def _limit(self, lease: Lease) -> str:
        """The timeout ``lease`` outlived, for people: its own, or the pool's."""
        if lease.options.timeout is not None:
            return f"timeout={lease.options.timeout:g}s of @app.task({lease.task!r})"
        return f"--task-timeout {self.config.task_timeout or 0:g}s"

    def _loop_stuck(self, blocker: Execution, lag: float) -> Reaction | None:
        """Heartbeat thread: ``blocker`` holds the event loop past its --task-timeout, so no
        cancel can reach it (or anything else on the loop). It alone is guilty: its lease is
        released with the error; every other async handler is innocent and goes back unstarted
        in the database's eyes (a hand-back spends no attempt). All of them are abandoned (their
        endings ignored), and the worker exits once its other slots finish. None: done so
        already."""
        with self.holdings.lock:
            innocent = [e for e in self.holdings.running.values()  # the blocked executor's
                        if e.mode is blocker.mode and e is not blocker
                        and e.stopped is not Stopped.ABANDONED]  # fmt: skip
        if blocker.stopped is Stopped.ABANDONED:
            return None
        for ex in (blocker, *innocent):
            ex.stopped = Stopped.ABANDONED
        lease = blocker.lease
        event(log, "loop_stuck",
              f"task {lease.task_id} ({lease.task}) {self._attempt(lease)} outlived "
              f"its timeout, the event loop blocked for {lag:.1f}s: releasing it, handing back "
              f"{len(innocent)} other async tasks, then exiting", level=logging.ERROR,
              task_id=lease.task_id, run_id=lease.run_id, task=lease.task,
              attempt=lease.attempt, handed_back=len(innocent))  # fmt: skip
        error = (
            f"TaskTimeout: handler ran longer than {task_timeout(lease, self.config) or 0:g} s "
            "and blocked the event loop (an async handler calling blocking code)"
        )
        commits = (Commit(lease, "release", error=error),
                   *(Commit(e.lease, "handback") for e in innocent))  # fmt: skip
        drain = DrainAsked(exitcodes.TASK_TIMEOUT, f"task {lease.task_id} blocked the event loop")
        return Reaction(write=commits, forget=tuple(c.lease for c in commits), then=drain,
                        what="the blocked loop's tasks")  # fmt: skip

    def handler_stuck(self, lease: Lease) -> Reaction | None:
        """``lease`` was lost a whole ttl ago and its handler still runs: it ignores
        ``LeaseLost``, and only the process's end stops it. An item riding in a batch (B23)
        is not its handler's to stop: the call goes on for its neighbours (its leader answers
        for it), and the lost item's last word is discarded."""
        ex, _ = self.holdings.find(lease)
        if ex is not None and ex.rider:
            return None
        event(
            log,
            "lease_stuck",
            f"task {lease.task_id} {self._attempt(lease)}: the handler "
            "ignored LeaseLost for a whole ttl; exiting",
            level=logging.ERROR,
            task_id=lease.task_id,
            attempt=lease.attempt,
        )
        return Reaction(exit=exitcodes.LEASE_STUCK)

    def heartbeat_died(self) -> None:
        """Without a heartbeat, leases would lapse silently: every handler is told its lease
        is lost (the conductor, told too, exits ``HEARTBEAT_DIED``)."""
        for ex in self.holdings.executions():
            ex.lost.set()
            self.executors[ex.mode].interrupt(ex, Stopped.LOST)
