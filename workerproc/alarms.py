"""What becomes of a worker's tasks when its heartbeat thread reports: a lease lost, a handler
past --task-timeout, a handler that ignored its lost lease, the heartbeat's own death; and the
chore it runs while an inline handler holds the conductor's thread (handing back what waits
behind a slow one).

Every method here runs on the heartbeat thread, except ``lease_lost``, which also runs on the
conductor's when a claim of this worker takes over its own older attempt (``Heartbeat.track``
reports the old one lost): it only takes the holdings' lock, forgets a waiting lease without
waiting for the heartbeat, and interrupts the old handler, each safe from either thread. They
set flags, interrupt handlers through their executor (``Executor.interrupt``), write what cannot
wait on the heartbeat's own connection (fenced: a no-op for a lease whose commit came first),
and wake the conductor, which does the rest. A handler that cannot be interrupted after its
timeout costs the worker its slot: the worker drains and exits (``TASK_TIMEOUT``) to be
replaced, at once when that slot is the conductor's own thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from . import exitcodes
from .config import WorkerConfig
from .execution import Execution, Stopped, max_attempts, task_timeout
from .executors import Executors
from .heartbeat import Heartbeat
from .holdings import Holdings
from .logs import attempt_of, event
from .policy import Policy
from .signals import Waker
from .store import Commit, Lease, StoreError, WorkerStore

log = logging.getLogger("workerproc.worker")

# A loop that has not ticked for this long is held by the handler it runs: a timeout of any
# other async handler is not that one's fault (it cannot run), and is put off.
STALLED = 0.25


class Alarms:
    def __init__(
        self,
        config: WorkerConfig,
        holdings: Holdings,
        executors: Executors,
        policy: Policy,
        heartbeat: Heartbeat,
        waker: Waker,
        *,
        drain: Callable[[int, str], None],
    ) -> None:
        self.config = config
        self.holdings = holdings
        self.executors = executors
        self.policy = policy
        self.heartbeat = heartbeat
        self.waker = waker
        self._drain = drain  # stop claiming, exit with this code once the other slots finish
        self.exit_code: int | None = None  # exit now (the heartbeat died)

    # -- prefetched leases that go back unstarted ---------------------------------------------
    def hand_back_behind(self, store: WorkerStore) -> None:
        """A chore the conductor leaves to the heartbeat thread while an inline handler holds
        its own: that handler turned out slow, so what waits behind it goes back."""
        leases = self.holdings.take_waiting()
        self.policy.slow_after_all()
        if not leases:
            return
        self.heartbeat.untrack(leases, wait=False)
        try:
            store.commit_many([Commit(lease, "handback") for lease in leases])
        except StoreError as exc:  # they lapse after the ttl: no harm but a delay
            event(
                log,
                "handback_failed",
                f"could not hand back {len(leases)} prefetched tasks: {exc}",
                level=logging.WARNING,
                count=len(leases),
            )

    # -- the heartbeat's reports -----------------------------------------------------------------
    def _find(self, lease: Lease) -> Execution | None:
        ex, waiting = self.holdings.find(lease)
        if waiting:  # lost (or timed out) while it waited: it never starts
            self.heartbeat.untrack([lease], wait=False)
        return ex

    def lease_lost(self, lease: Lease, why: str) -> None:
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
        ex = self._find(lease)
        if ex is None:
            return  # a late word about a task already behind us: never interrupt the next
        ex.lost.set()  # a thread's next ctx call raises LeaseLost
        self.executors[ex.mode].interrupt(ex, Stopped.LOST)

    def run_cancelled(self, lease: Lease, store: WorkerStore) -> None:
        """A renewal answered that ``lease``'s run was cancelled (B15): its handler stops
        (``RunCancelled`` at its next ctx call, at once inline; an async one is cancelled) and
        its lease is released, nothing of the run written. A lease that still waited for a
        slot never starts: it is handed back now, on this thread's connection (fenced)."""
        event(
            log,
            "run_cancelled",
            f"run {lease.run_id} cancelled in flight: stopping task {lease.task_id} "
            f"({lease.task}) {self._attempt(lease)}",
            run_id=lease.run_id,
            task_id=lease.task_id,
            attempt=lease.attempt,
        )
        ex, waiting = self.holdings.find(lease)
        if waiting:
            self.heartbeat.untrack([lease], wait=False)
            _write_now(store, [Commit(lease, "handback")], "a cancelled run's hand-back")
            return
        if ex is None:
            return  # its commit is under way: it answers conflict, settled as a drop
        ex.cancelled.set()  # a thread's next ctx call raises RunCancelled
        self.executors[ex.mode].interrupt(ex, Stopped.CANCELLED)

    def timed_out(self, lease: Lease, store: WorkerStore) -> bool:
        """``lease``'s handler outlived --task-timeout. False: not its fault yet (another
        handler blocks the event loop it needs; the heartbeat asks again soon)."""
        ex = self._find(lease)
        if ex is None:
            return True
        executor = self.executors[ex.mode]
        blocked = executor.blocked(STALLED)  # one handler holds the executor (the event loop)
        if blocked is not None and blocked[1] is not ex:
            blocker = blocked[1]
            if blocker is not None and blocker.stopped is Stopped.TIMEOUT:
                self._loop_stuck(blocker, blocked[0], store)  # the blocker's time is up
            return False
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
            self._loop_stuck(ex, blocked[0], store)
            return True
        if executor.interrupt(ex, Stopped.TIMEOUT):
            return True  # cancelled: it ends, and is released
        # A Python call cannot be stopped safely from outside: release the lease now (fenced:
        # a no-op if its commit came first). On the conductor's thread, the process goes and
        # its parent replaces it; on a thread, the worker stops claiming and exits once its
        # other slots finish.
        ex.stopped = Stopped.ABANDONED
        error = f"TaskTimeout: handler ran longer than {task_timeout(lease, self.config) or 0:g} s"
        _write_now(store, [Commit(lease, "release", error=error)], "the timeout")
        if executor.on_conductor:
            os._exit(exitcodes.TASK_TIMEOUT)
        self.heartbeat.untrack([lease], wait=False)
        self._drain(exitcodes.TASK_TIMEOUT, f"task {lease.task_id} timed out on a thread")
        return True

    def _attempt(self, lease: Lease) -> str:
        return attempt_of(lease, max_attempts(lease, self.config))

    def _limit(self, lease: Lease) -> str:
        """The timeout ``lease`` outlived, for people: its own, or the pool's."""
        if lease.options.timeout is not None:
            return f"timeout={lease.options.timeout:g}s of @app.task({lease.task!r})"
        return f"--task-timeout {self.config.task_timeout or 0:g}s"

    def _loop_stuck(self, blocker: Execution, lag: float, store: WorkerStore) -> None:
        """Heartbeat thread: ``blocker`` holds the event loop past its --task-timeout, so no
        cancel can reach it (or anything else on the loop). It alone is guilty: its lease is
        released with the error; every other async handler is innocent and goes back unstarted
        in the database's eyes (a hand-back spends no attempt). All of them are abandoned (their
        endings ignored), and the worker exits once its other slots finish."""
        with self.holdings.lock:
            innocent = [e for e in self.holdings.running.values()  # the blocked executor's
                        if e.mode is blocker.mode and e is not blocker
                        and e.stopped is not Stopped.ABANDONED]  # fmt: skip
        if blocker.stopped is Stopped.ABANDONED:
            return
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
        commits = [Commit(lease, "release", error=error)]
        commits += [Commit(e.lease, "handback") for e in innocent]
        _write_now(store, commits, "the blocked loop's tasks")
        self.heartbeat.untrack([c.lease for c in commits], wait=False)
        self._drain(exitcodes.TASK_TIMEOUT, f"task {lease.task_id} blocked the event loop")

    def handler_stuck(self, lease: Lease) -> None:
        """``lease`` was lost a whole ttl ago and its handler still runs: it ignores
        ``LeaseLost``, and only the process's end stops it."""
        event(
            log,
            "lease_stuck",
            f"task {lease.task_id} {self._attempt(lease)}: the handler "
            "ignored LeaseLost for a whole ttl; exiting",
            level=logging.ERROR,
            task_id=lease.task_id,
            attempt=lease.attempt,
        )
        os._exit(exitcodes.LEASE_STUCK)

    def heartbeat_died(self, exc: BaseException) -> None:
        """Without a heartbeat, leases would lapse silently: every handler is told its lease
        is lost, and the worker exits (``HEARTBEAT_DIED``)."""
        self.exit_code = exitcodes.HEARTBEAT_DIED
        for ex in self.holdings.executions():
            ex.lost.set()
            self.executors[ex.mode].interrupt(ex, Stopped.LOST)
        self.waker.wake()


def _write_now(store: WorkerStore, commits: list[Commit], what: str) -> None:
    """Fenced writes from the heartbeat thread, on its own connection (a no-op for a lease
    whose commit came first)."""
    try:
        store.commit_many(commits)
    except StoreError as exc:  # the leases lapse after the ttl: no harm but a delay
        event(
            log,
            "timeout_release_failed",
            f"could not record {what}: {exc}",
            level=logging.ERROR,
            task_id=commits[0].lease.task_id,
        )
