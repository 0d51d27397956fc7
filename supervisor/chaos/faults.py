"""Chaos mode: the supervisor attacks its own workers, as one step of its main loop.

- ``kill``: SIGKILL a worker inside its handler (mid-task, holding a lease).
- ``pause``: SIGSTOP a worker inside its handler for at least 2x the ttl, then SIGCONT it: a real
  zombie that wakes believing it still holds its task.

Both strike only a worker that holds a lease inside its handler, never one that is starting,
claiming or idle (``targets``): while nobody runs a handler, no fault lands.

Every fault first freezes its victim (SIGSTOP), so the phase read from its status slot is the one
it is truly in, and the database shows every lease it holds. Chaos never costs a task its last
allowed attempt: a frozen victim holding one, or one that holds the database's write lock (a
pause would stall every other lease), is let go at once and the fault counts as spared
(``targets``). Paused workers are resumed by ``pauses``; the report is written by ``report``.

Victims and fault kinds come from a seeded RNG (the seed is logged; the same seed makes the same
choices from the same candidates). The verifier judges everything from the database.
"""

from __future__ import annotations

import enum
import logging
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workerproc.store import StoreError

from ..config import ChaosConfig
from ..logs import event
from ..loop.arbiter import Step
from . import report
from .fault_event import FaultEvent
from .pauses import Pauses
from .targets import Held, Spare, Targeting, wait_settled
from .verifier import Verifier

if TYPE_CHECKING:
    from ..loop.arbiter import Arbiter
    from ..loop.pool import WorkerProcess

SUMMARY_EVERY = 60.0
DRAINED = "drain finished"  # the stop's reason when --drain found nothing left (loop.report)
OBSERVE_EVERY = 0.05


class Outcome(enum.Enum):
    STRUCK = "struck"
    SPARED = "spared"  # the rule held it back: this fault's turn is used up
    NO_VICTIM = "no_victim"  # nobody to strike yet: look again soon


class Chaos:
    def __init__(
        self,
        config: ChaosConfig,
        *,
        ttl: float,
        poll_interval: float,
        fast_release: bool,
        max_attempts: int,
        server: bool = False,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.seed = (
            config.seed if config.seed is not None else random.SystemRandom().randrange(2**31)
        )
        self.rng = random.Random(self.seed)
        self.ttl = ttl
        self.pause_for = config.pause_for if config.pause_for is not None else 2 * ttl + 0.1
        self.wall = wall
        self.verifier = Verifier(
            ttl=ttl, poll_interval=poll_interval, fast_release=fast_release, server=server
        )
        self.targets = Targeting(max_attempts)
        self.pauses = Pauses(wall)
        self.fast_release = fast_release
        self.started: float | None = None
        self.next_fault = 0.0
        self.injected = 0
        self.spared: Counter[str] = Counter()  # by how: skipped | redirected
        self.spared_why: Counter[str] = Counter()  # by reason
        self.drained = False  # the pool stopped because its drain found nothing left

    def install(self, arb: Arbiter) -> None:
        arb.add_step(Step("chaos", self.step), before="maintain")
        arb.events.on("stopping", lambda **data: self._stopping(arb, data.get("why")))
        arb.events.on("stalled", lambda **data: self.verifier.stall(data["seconds"], data["free"]))
        event(
            "chaos_started",
            f"chaos mode: faults {','.join(self.config.faults)} every ~{self.config.interval:g}s, "
            f"seed {self.seed}, pauses of {self.pause_for:g}s, fast release "
            f"{'on' if self.fast_release else 'off'}, never a task's last of "
            f"{self.targets.max_attempts} attempts",
            seed=self.seed,
        )

    def _stopping(self, arb: Arbiter, why: object) -> None:
        self.drained = why == DRAINED
        self.pauses.resume_all(arb)

    # -- the loop step -------------------------------------------------------------------------
    def step(self, arb: Arbiter) -> None:
        now = arb.clock()
        if self.started is None:
            self.started = now
            self.next_fault = now + self._gap()
            self._with_store(arb, self.verifier.start)
        self.pauses.step(arb, now)
        if not arb.stopping and self._may_inject(now) and now >= self.next_fault:
            if self._inject(arb) is Outcome.NO_VICTIM:
                self.next_fault = now + OBSERVE_EVERY  # no candidate yet: look again soon
            else:
                self.next_fault = now + self._gap()
        if not arb.stopping:
            arb.wake_at(self.next_fault)
        if arb.due("chaos_observe", OBSERVE_EVERY):
            self._with_store(arb, lambda s: self.verifier.observe(s, self.wall()))
        if arb.due("chaos_summary", SUMMARY_EVERY) and self.injected:
            event("chaos_summary", report.summary_line(self.report()))

    def _gap(self) -> float:
        return self.config.interval * self.rng.uniform(0.5, 1.5)

    def _may_inject(self, now: float) -> bool:
        assert self.started is not None
        if self.config.max_faults is not None and self.injected >= self.config.max_faults:
            return False
        return self.config.duration is None or now - self.started < self.config.duration

    def _with_store(self, arb: Arbiter, fn: Callable[[Any], None]) -> None:
        try:
            with arb.gate.session() as store:
                fn(store)
        except StoreError as exc:  # a busy database delays the verdict, it does not change it
            event("chaos_observe_failed", f"chaos: cannot read the store now: {exc}")

    # -- faults --------------------------------------------------------------------------------
    def _inject(self, arb: Arbiter) -> Outcome:
        fault = self.rng.choice(sorted(self.config.faults))
        candidates = self.targets.candidates(arb, exclude=self.pauses.__contains__)
        if not candidates:
            return Outcome.NO_VICTIM
        eligible = self.targets.eligible(arb, candidates)
        if not eligible:
            reason = "store_unreadable" if eligible is None else "last_attempt"
            return self._spare(Spare("skipped", reason), fault, None)
        redirected = len(eligible) < len(candidates)
        victim = self.rng.choice(eligible)
        if not arb.pool.send(victim, signal.SIGSTOP):
            return Outcome.NO_VICTIM  # already gone: normal
        # kill(2) returns before the signal takes effect: wait until the victim cannot run any
        # more, so what its slot and the database say cannot change under us
        frozen = wait_settled(victim.pid, gone=False)
        frozen_at = self.wall()
        why, held = self.targets.judge_frozen(arb, victim, fault) if frozen else ("unsettled", [])
        if why is not None:
            arb.pool.send(victim, signal.SIGCONT)
            return self._spare(Spare("skipped", why), fault, victim)
        if redirected:
            self._spare(Spare("redirected", "last_attempt"), fault, victim)
        self._strike(arb, fault, victim, frozen_at, held)
        return Outcome.STRUCK

    def _strike(
        self, arb: Arbiter, fault: str, victim: WorkerProcess, t: float, held: list[Held]
    ) -> None:
        """``victim`` is frozen and may be struck: keep it stopped (pause: it took effect at
        ``t``, when it froze) or SIGKILL it. Every lease it held (``held``, from the database:
        with slots, several) is one orphan the verifier expects taken over."""
        state = arb.board.read(victim.slot)  # frozen: this is what it was doing
        settled = True
        if fault == "kill":
            arb.pool.kill_on_purpose(victim)
            settled = wait_settled(victim.pid, gone=True)
            t = self.wall()
        self.injected += 1
        phase = state.phase_name if state is not None and state.pid == victim.pid else "handler"
        events = [
            FaultEvent(
                fault=fault,
                pid=victim.pid,
                task_id=lease.task_id,
                attempt=lease.attempt,
                t=t,
                phase=phase if settled else f"{phase}?",
                bound_s=self.verifier.bound(fault),
                run_id=lease.run_id,
                owner=victim.owner,
                expires_at=lease.expires_at,
            )
            for lease in held
        ]
        for ev in events:
            self.verifier.record(ev)
        first = held[0]
        arb.events.emit(
            "chaos_fault", fault=fault, pid=victim.pid, task_id=first.task_id, phase=phase
        )
        if fault == "pause":
            self.pauses.add(victim, arb.clock() + self.pause_for, events)
        signum = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
        leases = ", ".join(f"task {h.task_id} attempt {h.attempt}" for h in held)
        event(
            "chaos_fault",
            f"chaos: {signal.Signals(signum).name} pid {victim.pid} ({phase}, "
            f"{len(held)} lease(s): {leases})",
            fault=fault,
            worker=victim.pid,
            task_id=first.task_id,
            attempt=first.attempt,
            leases=len(held),
            phase=phase,
        )

    def _spare(self, spare: Spare, fault: str, worker: WorkerProcess | None) -> Outcome:
        self.spared[spare.how] += 1
        self.spared_why[spare.reason] += 1
        pid = worker.pid if worker is not None else None
        target = {"skipped": " of pid", "redirected": " to pid"}[spare.how] if pid else ""
        event(
            "chaos_spared",
            f"chaos: {fault} {spare.how}{target}{f' {pid}' if pid else ''} "
            f"({spare.reason.replace('_', ' ')})",
            fault=fault,
            how=spare.how,
            reason=spare.reason,
            worker=pid,
        )
        return Outcome.SPARED

    # -- the end -------------------------------------------------------------------------------
    def report(self, **extra: Any) -> dict[str, Any]:
        return self.verifier.report(
            spared=sum(self.spared.values()),
            spared_by={**dict.fromkeys(("skipped", "redirected"), 0), **self.spared},
            spared_why=dict(self.spared_why),
            max_attempts=self.targets.max_attempts,
            **extra,
        )

    def conclude(self, arb: Arbiter, exit_code: int, violation_code: int) -> int:
        """Resume anyone still paused, judge one last time, write the report, pick the code."""
        self.pauses.resume_all(arb)
        self._with_store(
            arb, lambda s: self.verifier.observe(s, self.wall(), final=True, drained=self.drained)
        )
        calls: list[dict[str, int]] = []  # what ctx.once saved, from the database
        self._with_store(arb, lambda s: calls.append(report.paid_calls(s.paid_call_totals())))
        doc = self.report(
            paid_calls=calls[0] if calls else None,
            seed=self.seed,
            fast_release=self.fast_release,
            drained=self.drained,
            lease_ttl=self.ttl,
            pause_s=self.pause_for,
            duration_s=round(arb.clock() - (self.started or arb.clock()), 2),
        )
        if self.config.report:
            report.write(self.config.report, doc)
        report.print_text(doc, self.verifier.takeover_ms(), self.config.report)
        for w in doc["warnings"]:
            event("chaos_warning", f"chaos warning: {w}", level=logging.WARNING)
        if not doc["ok"]:
            for v in doc["violations"]:
                event("chaos_violation", f"chaos VIOLATION: {v}", level=logging.ERROR)
            return exit_code if exit_code != 0 else violation_code
        return exit_code
