"""Chaos mode's judge: it believes the database, never the workers.

For every fault on a lease holder it records the task, the attempt and the time, then watches the
store: a claim of that task with a higher attempt is a takeover (``tasks.claimed_at`` times it
exactly); the faulted attempt committing after the fault, a takeover that never comes within its
bound, a superseded attempt that committed, or two live leases on one run are violations. A
paused worker's refused renewals and commits (``fence_rejections``) are counted as zombie writes
rejected.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from workerproc.store import Inspector

# A kill with fast release is taken over as soon as a worker is free: a few ms when one is idle,
# one handler's length when all are busy. The bound leaves room for a busy, loaded machine.
FAST_RELEASE_BOUND = 2.0
TTL_PATH_MARGIN = 2.0
COMMIT_SLACK = 0.05  # the faulted attempt's commit may carry a "now" read just before the fault


@dataclass
class FaultEvent:
    fault: str  # kill | pause
    pid: int
    task_id: int | None  # None: the victim held no lease
    attempt: int | None
    t: float  # wall clock, same clock as the store's on this host
    phase: str  # what the victim was doing: handler | claiming | committing | idle
    bound_s: float
    outcome: str = "pending"  # taken_over | finished_before | superseded_before | run_over
    #   | not_taken_over | committed_after_fault | resumed_early | no_lease | unresolved
    taken_over_ms: float | None = None
    woke_at: float | None = None
    zombie_rejections: int = 0

    @property
    def stalls_the_store(self) -> bool:
        """Paused inside a store call: it may hold the write lock, so the whole pool waits."""
        return self.fault == "pause" and self.phase.rstrip("?") in ("claiming", "committing")

    @property
    def orphaned(self) -> bool:
        return self.outcome in ("taken_over", "not_taken_over")

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("bound_s")
        return out


class Verifier:
    def __init__(self, *, ttl: float, poll_interval: float, fast_release: bool) -> None:
        self.ttl = ttl
        self.poll_interval = poll_interval
        self.fast_release = fast_release
        self.events: list[FaultEvent] = []
        self.violations: list[str] = []
        self.zombie_writes_rejected = 0
        self.workers = 0  # the pool's size now (chaos keeps it current)
        self.rejections_seen = 0
        self._after = 0  # last fence_rejections id read

    def bound(self, fault: str) -> float:
        if fault == "kill" and self.fast_release:
            return FAST_RELEASE_BOUND
        return self.ttl + self.poll_interval + TTL_PATH_MARGIN

    def start(self, store: Inspector) -> None:
        """Rejections from before chaos began are not ours to count."""
        old = store.fence_rejections(after=0)
        self._after = old[-1].id if old else 0

    def record(self, event: FaultEvent) -> None:
        if event.task_id is None:
            event.outcome = "no_lease"
        self.events.append(event)

    def _violate(self, message: str) -> None:
        if message not in self.violations:
            self.violations.append(message)

    def observe(self, store: Inspector, now: float, *, final: bool = False) -> None:
        for ev in self.events:
            if ev.outcome == "pending":
                self._judge(store, ev, now, final)
        self._count_rejections(store)
        for message in store.integrity_violations():
            self._violate(message)

    def resumed_early(self, ev: FaultEvent) -> bool:
        """A pause cut short (by a stop) before a ttl had passed: the lease renewed last at the
        fault may still be live when the worker wakes, so its commit proves nothing."""
        return ev.fault == "pause" and ev.woke_at is not None and ev.woke_at - ev.t < self.ttl

    def stalled(self, start: float, end: float, victim: int | None = None) -> float:
        """Seconds of [start, end] during which nobody could take anything over, so takeover
        bounds do not count that time: a paused worker may have held the write lock, or every
        worker but ``victim`` was paused by chaos itself (none was free to take over)."""
        windows = []
        for ev in self.events:
            if ev.stalls_the_store:
                windows.append((ev.t, ev.woke_at if ev.woke_at is not None else end))
        windows += self._none_free(start, end, victim)
        return _covered(windows, start, end)

    def _none_free(self, start: float, end: float, victim: int | None) -> list[tuple[float, float]]:
        """The parts of [start, end] during which every worker but ``victim`` was paused."""
        if victim is None or self.workers < 2:
            return []
        others = {(e.pid, e.t, e.woke_at if e.woke_at is not None else end)
                  for e in self.events if e.fault == "pause" and e.pid != victim}  # fmt: skip
        edges = sorted([(t, 1, pid) for pid, t, _ in others] +
                       [(w, -1, pid) for pid, _, w in others])  # fmt: skip
        out, since = [], 0.0
        frozen: dict[int, int] = {}  # pid -> pauses open (a pid counts once)
        for at, step, pid in edges:
            before = len(frozen)
            frozen[pid] = frozen.get(pid, 0) + step
            if frozen[pid] <= 0:
                del frozen[pid]
            if before < self.workers - 1 <= len(frozen):
                since = at
            elif len(frozen) < self.workers - 1 <= before:
                out.append((since, at))
        return [(max(a, start), min(b, end)) for a, b in out if b > start and a < end]

    def _judge(self, store: Inspector, ev: FaultEvent, now: float, final: bool) -> None:
        assert ev.task_id is not None and ev.attempt is not None
        task = store.get_task(ev.task_id)
        if task is None:
            ev.outcome = "run_over"
        elif task.attempts > ev.attempt and task.claimed_at is not None:
            if task.claimed_at < ev.t:  # already superseded when the fault landed
                ev.outcome = "superseded_before"
            else:
                ev.outcome = "taken_over"
                ev.taken_over_ms = round((task.claimed_at - ev.t) * 1000, 1)
                delay = task.claimed_at - ev.t - self.stalled(ev.t, task.claimed_at, ev.pid)
                if delay > ev.bound_s:
                    self._violate(
                        f"{ev.fault} of pid {ev.pid}: task {ev.task_id} taken over after "
                        f"{ev.taken_over_ms:.0f} ms, over its bound of {ev.bound_s:g} s"
                    )
        elif task.done_at is not None and task.done_attempt == ev.attempt:
            if task.done_at <= ev.t + COMMIT_SLACK:
                ev.outcome = "finished_before"
            elif self.resumed_early(ev):
                # a stop (a drain that finished, say) resumed it before its lease could expire:
                # its lease may still be live, and the fence alone decides its commit
                ev.outcome = "resumed_early"
            else:
                ev.outcome = "committed_after_fault"
                self._violate(
                    f"{ev.fault} of pid {ev.pid}: task {ev.task_id} attempt {ev.attempt} "
                    f"committed {task.done_at - ev.t:.2f} s after the fault (a zombie write)"
                )
        elif self._run_over(store, task.run_id):
            ev.outcome = "run_over"
        elif now - ev.t - self.stalled(ev.t, now, ev.pid) > ev.bound_s:
            ev.outcome = "not_taken_over"
            self._violate(
                f"{ev.fault} of pid {ev.pid}: task {ev.task_id} attempt {ev.attempt} not "
                f"taken over within {ev.bound_s:g} s"
            )
        elif final:
            ev.outcome = "unresolved"  # the pool stopped before its bound ran out

    @staticmethod
    def _run_over(store: Inspector, run_id: int) -> bool:
        run = store.get_run(run_id)
        return run is None or run.terminal

    def _count_rejections(self, store: Inspector) -> None:
        paused = {(e.task_id, e.attempt): e for e in self.events if e.fault == "pause"}
        for rejection in store.fence_rejections(after=self._after):
            self._after = rejection.id
            self.rejections_seen += 1
            ev = paused.get((rejection.task_id, rejection.attempt))
            if ev is not None and rejection.at >= ev.t:
                ev.zombie_rejections += 1
                self.zombie_writes_rejected += 1

    # -- the report ----------------------------------------------------------------------------
    def takeover_ms(self, fault: str | None = None) -> list[float]:
        return sorted(
            e.taken_over_ms
            for e in self.events
            if e.taken_over_ms is not None and fault in (None, e.fault)
        )

    def _latency(self, fault: str | None = None) -> dict[str, float | None]:
        values = self.takeover_ms(fault)
        return {
            "p50": round(statistics.median(values), 1) if values else None,
            "p99": percentile(values, 99),
            "max": values[-1] if values else None,
        }

    def report(self, **extra: Any) -> dict[str, Any]:
        # one fault strikes one process, holding one lease per slot (or none): faults are
        # counted per struck process, the leases they orphaned apiece
        faults = {"kill": 0, "pause": 0}
        for fault, _pid, _t in {(e.fault, e.pid, e.t) for e in self.events}:
            faults[fault] = faults.get(fault, 0) + 1
        return {
            "faults": faults,
            "leases_hit": sum(e.task_id is not None for e in self.events),
            "orphaned_leases": sum(e.orphaned for e in self.events),
            "taken_over": sum(e.outcome == "taken_over" for e in self.events),
            "not_taken_over": sum(e.outcome == "not_taken_over" for e in self.events),
            "takeover_ms": self._latency(),
            # kills follow --fast-release; a paused worker is alive, so its lease always
            # takes the ttl path
            "takeover_ms_by_fault": {f: self._latency(f) for f in ("kill", "pause")},
            "zombie_writes_rejected": self.zombie_writes_rejected,
            "rejected_writes_total": self.rejections_seen,
            "violations": list(self.violations),
            "events": [e.public() for e in self.events],
            "ok": not self.violations,
            **extra,
        }


def _covered(windows: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] inside at least one of ``windows`` (overlaps counted once)."""
    total, reach = 0.0, start
    for opened, closed in sorted(windows):
        a, b = max(opened, reach), min(closed, end)
        if b > a:
            total += b - a
            reach = b
    return total


def percentile(ordered: list[float], p: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]
