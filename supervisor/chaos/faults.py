"""Chaos mode: the supervisor attacks its own workers, as one step of its main loop.

- ``kill``: SIGKILL a worker, preferring one inside its handler (mid-task, holding a lease).
- ``pause``: SIGSTOP a worker inside its handler for at least 2x the ttl, then SIGCONT it: a real
  zombie that wakes believing it still holds its task. The phase is read from the victim's status
  slot *after* it stopped (a stopped process cannot change it), so each event says truly whether
  the victim was in its handler or inside the store. A worker paused inside a write transaction
  holds SQLite's write lock: every other writer waits (and gives up after the busy timeout and
  retries), leases in flight lapse, and attempts are spent through no fault of the tasks. The
  system survives it without a violation; operators see it as a stall of the whole pool.

Victims and fault kinds come from a seeded RNG (the seed is logged; the same seed makes the same
choices from the same candidates). The verifier judges everything from the database.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from workerproc.status import HANDLER
from workerproc.store import StoreError

from ..config import ChaosConfig
from ..files import PUBLIC, write_atomic
from ..logs import event
from ..loop.arbiter import Step
from .verifier import FaultEvent, Verifier, histogram

if TYPE_CHECKING:
    from ..loop.arbiter import Arbiter
    from ..loop.pool import Worker

SUMMARY_EVERY = 60.0
OBSERVE_EVERY = 0.05


def wait_settled(pid: int, fault: str, timeout: float = 0.5) -> bool:
    """True once ``pid`` is stopped (pause) or gone (kill); False if that took too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return True
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return True
        time.sleep(0.0005)
    return False


class Chaos:
    def __init__(
        self,
        config: ChaosConfig,
        *,
        ttl: float,
        poll_interval: float,
        fast_release: bool,
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
        self.verifier = Verifier(ttl=ttl, poll_interval=poll_interval, fast_release=fast_release)
        self.fast_release = fast_release
        self.started: float | None = None
        self.next_fault = 0.0
        self.paused: dict[int, tuple[Worker, float, FaultEvent]] = {}
        self.injected = 0

    def install(self, arb: Arbiter) -> None:
        arb.add_step(Step("chaos", self.step), before="maintain")
        arb.events.on("stopping", lambda **_: self.resume_all(arb))
        event(
            "chaos_started",
            f"chaos mode: faults {','.join(self.config.faults)} every ~{self.config.interval:g}s, "
            f"seed {self.seed}, pauses of {self.pause_for:g}s, fast release "
            f"{'on' if self.fast_release else 'off'}",
            seed=self.seed,
        )

    # -- the loop step -------------------------------------------------------------------------
    def step(self, arb: Arbiter) -> None:
        now = arb.clock()
        if self.started is None:
            self.started = now
            self.next_fault = now + self._gap()
            self._with_store(arb, self.verifier.start)
        self._resume_due(arb, now)
        if not arb.stopping and self._may_inject(now) and now >= self.next_fault:
            if self._inject(arb):
                self.next_fault = now + self._gap()
            else:
                self.next_fault = now + OBSERVE_EVERY  # no candidate yet: look again soon
        if not arb.stopping:
            arb.wake_at(self.next_fault)
        for _, resume_at, _ in self.paused.values():
            arb.wake_at(resume_at)
        if arb.due("chaos_observe", OBSERVE_EVERY):
            self._with_store(arb, lambda s: self.verifier.observe(s, self.wall()))
        if arb.due("chaos_summary", SUMMARY_EVERY) and self.injected:
            event("chaos_summary", self.summary_line())

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
        except StoreError as exc:  # a stalled writer (a pause inside the store) is expected
            event("chaos_observe_failed", f"chaos: cannot read the store now: {exc}")

    # -- faults --------------------------------------------------------------------------------
    def _candidates(self, arb: Arbiter, fault: str) -> list[Worker]:
        up = [w for w in arb.pool.active() if arb.is_up(w) and w.pid not in self.paused]
        in_handler = []
        for w in up:
            state = arb.board.read(w.slot)
            if state is not None and state.pid == w.pid and state.phase == HANDLER:
                in_handler.append(w)
        if in_handler or fault == "pause":
            return sorted(in_handler, key=lambda w: w.slot)
        return sorted(up, key=lambda w: w.slot)  # kill: an idle worker if none holds a lease

    def _inject(self, arb: Arbiter) -> bool:
        fault = self.rng.choice(sorted(self.config.faults))
        candidates = self._candidates(arb, fault)
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        signum = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
        sent = (
            arb.pool.kill_on_purpose(victim)
            if fault == "kill"
            else arb.pool.send(victim, signal.SIGSTOP)
        )
        if not sent:  # already gone: normal
            return False
        self.injected += 1
        # kill() returns before the signal takes effect: wait until the victim cannot run any
        # more, so the phase read from its slot is the one it is frozen (or died) in
        settled = wait_settled(victim.pid, fault)
        state = arb.board.read(victim.slot)
        mine = state is not None and state.pid == victim.pid
        phase = state.phase_name if mine and state else "starting"
        task_id = state.task_id if mine and state and state.task_id else None
        attempt = state.attempt if mine and state and state.task_id else None
        ev = FaultEvent(
            fault=fault,
            pid=victim.pid,
            task_id=task_id,
            attempt=attempt,
            t=self.wall(),
            phase=phase if settled else f"{phase}?",
            bound_s=self.verifier.bound(fault),
        )
        self.verifier.record(ev)
        arb.events.emit("chaos_fault", fault=fault, pid=victim.pid, task_id=task_id, phase=phase)
        if fault == "pause":
            self.paused[victim.pid] = (victim, arb.clock() + self.pause_for, ev)
        event(
            "chaos_fault",
            f"chaos: {signal.Signals(signum).name} pid {victim.pid} ({phase}"
            + (f", task {task_id} attempt {attempt})" if task_id else ", no lease)"),
            fault=fault,
            pid=victim.pid,
            task_id=task_id,
            attempt=attempt,
            phase=phase,
        )
        return True

    def _resume_due(self, arb: Arbiter, now: float) -> None:
        for pid, (worker, resume_at, ev) in list(self.paused.items()):
            if now >= resume_at:
                self._resume(arb, pid, worker, ev)

    def _resume(self, arb: Arbiter, pid: int, worker: Worker, ev: FaultEvent) -> None:
        del self.paused[pid]
        if arb.pool.send(worker, signal.SIGCONT):
            ev.woke_at = self.wall()
            event("chaos_resume", f"chaos: SIGCONT pid {pid} after {ev.woke_at - ev.t:.2f}s")

    def resume_all(self, arb: Arbiter) -> None:
        """Stopping: no worker stays frozen (a stopped process cannot drain or exit)."""
        for pid, (worker, _, ev) in list(self.paused.items()):
            self._resume(arb, pid, worker, ev)

    # -- the end -------------------------------------------------------------------------------
    def summary_line(self) -> str:
        r = self.verifier.report()
        return (
            f"chaos: {sum(r['faults'].values())} faults ({r['faults']['kill']} kill, "
            f"{r['faults']['pause']} pause), {r['taken_over']}/{r['orphaned_leases']} orphaned "
            f"leases taken over (p50 {r['takeover_ms']['p50']} ms, p99 {r['takeover_ms']['p99']} "
            f"ms), {r['zombie_writes_rejected']} zombie writes rejected, "
            f"{len(r['violations'])} violations"
        )

    def conclude(self, arb: Arbiter, exit_code: int, violation_code: int) -> int:
        """Resume anyone still paused, judge one last time, write the report, pick the code."""
        self.resume_all(arb)
        self._with_store(arb, lambda s: self.verifier.observe(s, self.wall(), final=True))
        report = self.verifier.report(
            seed=self.seed,
            fast_release=self.fast_release,
            lease_ttl=self.ttl,
            pause_s=self.pause_for,
            duration_s=round(arb.clock() - (self.started or arb.clock()), 2),
        )
        if self.config.report:  # mode 0644, through a random temporary name (never a symlink)
            try:
                write_atomic(self.config.report, json.dumps(report, indent=2), PUBLIC)
            except OSError as exc:
                msg = f"cannot write the chaos report {self.config.report}: {exc.strerror or exc}"
                event("chaos_report_failed", msg, level=logging.ERROR)
        self._print(report)
        if not report["ok"]:
            for v in report["violations"]:
                event("chaos_violation", f"chaos VIOLATION: {v}", level=logging.ERROR)
            return exit_code if exit_code != 0 else violation_code
        return exit_code

    def _print(self, report: dict[str, Any]) -> None:
        lines = ["", "chaos report" + (f" ({self.config.report})" if self.config.report else "")]
        lines.append("  " + self.summary_line().removeprefix("chaos: "))
        lines.append("  takeover latency:")
        lines += histogram(self.verifier.takeover_ms())
        lines.append("  verdict: " + ("OK" if report["ok"] else "VIOLATIONS"))
        print("\n".join(lines), file=sys.stderr, flush=True)
