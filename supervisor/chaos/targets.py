"""Which worker a chaos fault may strike, and the rule that keeps chaos from failing runs.

**A fault strikes only a worker that holds a lease inside its handler** (``--chaos-faults``):
never one that is starting, claiming or idle. Killing those would prove nothing about takeover
and fencing, and a pool whose new workers are killed before their first claim never claims at
all. A victim is chosen among the workers whose status slot shows a handler, and once frozen it
is struck only if its slot still shows one and the database shows it holding a live lease;
otherwise it is let go (``not_in_handler``, ``no_lease``).

**The rule: chaos never costs a task its last allowed attempt.** A victim is first frozen
(SIGSTOP: its status slot and its leases cannot change any more) and struck only if every lease
it holds in the database leaves its task at least one more try under ``--max-attempts`` (or the
task's own declared bound, B11) (and,
for a pause, if the database's write lock is free, so the frozen victim cannot stall everyone
else's leases); otherwise it is let go at once (SIGCONT, a freeze of milliseconds) and the fault
counts as *spared*. So no task is faulted on more than ``max_attempts - 1`` of its attempts, and
a run under chaos fails only through the code under test.

Before freezing, candidates whose status slot already shows a task on its last attempt are left
out, so a fault goes to another worker when one is eligible (a *redirected* fault, also counted
as spared) instead of being skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import psutil

from workerproc.status import HANDLER, SlotState
from workerproc.store import Inspector, StoreError

if TYPE_CHECKING:
    from ..loop.arbiter import Arbiter
    from ..loop.pool import WorkerProcess

# A write transaction that changes nothing (owners look like host:pid:start:suffix, never this):
# it succeeds only when no frozen process holds the database's write lock.
LOCK_PROBE_OWNER = "chaos-write-lock-probe"
LOCK_PROBE_TIMEOUT = 0.25  # a live writer holds the lock for milliseconds


def wait_settled(pid: int, gone: bool, timeout: float = 0.5) -> bool:
    """True once ``pid`` is stopped (or gone, with ``gone``); False if that took too long."""
    done = {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}
    if not gone:
        done.add(psutil.STATUS_STOPPED)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return True
        if status in done:
            return True
        time.sleep(0.0005)
    return False


def tries(store: Inspector, task_id: int, attempt: int) -> tuple[int, str] | None:
    """Attempts the task has spent since its last retry, and its name, if ``attempt`` is still
    its latest."""
    task = store.get_task(task_id)
    if task is None or task.done_at is not None or task.attempts != attempt:
        return None
    return task.attempts - task.attempt_base, task.name


@dataclass
class Spare:
    """Why a fault was held back (or went elsewhere)."""

    how: str  # skipped | redirected
    reason: str  # last_attempt | not_in_handler | no_lease | store_locked | store_unreadable
    #   | unsettled


class Held(NamedTuple):
    """A live lease a frozen victim holds, as the database has it."""

    task_id: int
    attempt: int
    run_id: int
    expires_at: float  # its end as things stand (an in-flight renewal may still move it)


class Targeting:
    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts

    # -- before the freeze: from the status slots ---------------------------------------------
    @staticmethod
    def candidates(arb: Arbiter, exclude: Callable[[int], bool]) -> list[WorkerProcess]:
        """Workers inside a handler (so holding a lease), whatever the fault; none while the
        pool is starting, claiming or idle."""
        up = [w for w in arb.pool.active() if arb.is_up(w) and not exclude(w.pid)]
        in_handler = [w for w in up if _in_handler(arb.board.read(w.slot), w.pid)]
        return sorted(in_handler, key=lambda w: w.slot)

    def eligible(self, arb: Arbiter, candidates: list[WorkerProcess]) -> list[WorkerProcess] | None:
        """The candidates whose slot shows no task on its last attempt; None: cannot tell."""
        try:
            with arb.gate.session() as store:
                return [w for w in candidates if not self._slot_on_last(arb, store, w)]
        except StoreError:
            return None

    def on_last(self, store: Inspector, task_id: int, attempt: int) -> bool:
        """``attempt`` of the task is its last allowed one: its own declared bound (B11, as the
        claim reads it from the database), else the pool's ``--max-attempts``."""
        spent = tries(store, task_id, attempt)
        if spent is None:
            return False
        declared = store.task_options().get(spent[1])
        limit = (declared.max_attempts if declared else None) or self.max_attempts
        return spent[0] >= limit

    def _slot_on_last(self, arb: Arbiter, store: Inspector, worker: WorkerProcess) -> bool:
        state = arb.board.read(worker.slot)
        if state is None or state.pid != worker.pid or not state.task_id:
            return False
        return self.on_last(store, state.task_id, state.attempt)

    # -- after the freeze: from the database ---------------------------------------------------
    def judge_frozen(
        self, arb: Arbiter, victim: WorkerProcess, fault: str
    ) -> tuple[str | None, list[Held]]:
        """Whether to strike the frozen ``victim`` (None) or why it must be let go, and the
        live leases the database shows it holding: with slots, several."""
        held: list[Held] = []
        if not _in_handler(arb.board.read(victim.slot), victim.pid):
            return "not_in_handler", held  # it left its handler before the freeze landed
        try:
            with arb.gate.session(busy_timeout=LOCK_PROBE_TIMEOUT) as store:
                stats = store.stats()
                for lease in stats.leases:
                    if lease.owner != victim.owner or lease.expires_at <= stats.now:
                        continue
                    if self.on_last(store, lease.task_id, lease.attempt):
                        return "last_attempt", held
                    held.append(Held(lease.task_id, lease.attempt, lease.run_id,
                                     lease.expires_at))  # fmt: skip
                if not held:
                    return "no_lease", held  # its lease lapsed (a handler that outlived it)
                if fault == "pause":
                    try:
                        store.release_owner(LOCK_PROBE_OWNER)
                    except StoreError:
                        return "store_locked", held
        except StoreError:
            return "store_unreadable", held
        return None, sorted(held)


def _in_handler(state: SlotState | None, pid: int) -> bool:
    """Running a handler (with slots: any of them), so it holds a lease."""
    return state is not None and state.pid == pid and (state.busy > 0 or state.phase == HANDLER)
