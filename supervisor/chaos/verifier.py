"""Chaos mode's judge: it believes the database, never the workers.

For every lease a fault orphaned it records the task, the attempt, the run, the time and the
lease's end as the database had it when the victim froze, then watches the store. Its verdict
states **safety, not load**:

- **Violations** (exit 8) are safety failures only: a zombie write accepted (the faulted
  attempt committed after its lease could have ended, or a superseded attempt committed), two
  handlers of one task on live leases at once (the next attempt claimed before the faulted
  one's lease ended, or a run holding two live leases), a run lost (the drain ended and a
  faulted task was never taken over) or failed by chaos (its attempts ran out with no handler
  failing it, the last one struck by a fault or lost), and a pool that claims nothing for
  ``STALL_TTLS`` x the ttl while work is ready and a worker is free (``no_progress``).
- **Warnings** are load: a takeover slower than its bound. Its clock runs only while the task
  could be claimed (``room.Look``): from the lease's end (a killed worker's release, or the
  expiry), while its limits have room and some worker serving its queue has a free slot; a
  fast-release kill also counts the time until its lease was released. The database is looked
  at every ``OBSERVE_EVERY``; an interval counts when the task was claimable at both its ends.

A paused worker's refused renewals and commits (``fence_rejections``) are counted as zombie
writes rejected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workerproc.store import Inspector, TaskInfo

from .fault_event import FaultEvent
from .room import Look

# A task is claimed within one poll interval of becoming claimable (idle workers look at least
# that often; a change wakes them sooner): the margin leaves room for a busy, loaded machine. A
# killed worker's lease is released by the supervisor and taken over within FAST_RELEASE_BOUND.
FAST_RELEASE_BOUND = 2.0
TAKEOVER_MARGIN = 2.0
COMMIT_SLACK = 0.05  # the faulted attempt's commit may carry a "now" read just before the fault
STALL_TTLS = 10  # no_progress: nothing claimed for this many ttls while work is ready
EXHAUSTED = "task_attempts_exhausted"


class Verifier:
    def __init__(
        self, *, ttl: float, poll_interval: float, fast_release: bool, server: bool = False
    ) -> None:
        self.ttl = ttl
        self.poll_interval = poll_interval
        self.fast_release = fast_release
        # a database server finishes a request its client sent before it froze or died (a
        # commit, a renewal); a file database does nothing once its process stops
        self.server = server
        self.events: list[FaultEvent] = []
        self.violations: list[str] = []
        self.zombie_writes_rejected = 0
        self.rejections_seen = 0
        self.longest_stall = 0.0  # seconds the pool claimed nothing while it could
        self._after = 0  # last fence_rejections id read
        self._killed: set[str] = set()  # owners killed: they claim nothing any more
        self._paused: list[FaultEvent] = []  # pauses whose worker may not be awake yet
        self._stallers: list[FaultEvent] = []  # pauses that may hold the write lock

    def bound(self, fault: str) -> float:
        """Claimable seconds a takeover may take before it is reported slow (a warning)."""
        if fault == "kill" and self.fast_release:
            return FAST_RELEASE_BOUND
        return self.poll_interval + TAKEOVER_MARGIN

    def start(self, store: Inspector) -> None:
        """Rejections from before chaos began are not ours to count."""
        old = store.fence_rejections(after=0)
        self._after = old[-1].id if old else 0

    def record(self, event: FaultEvent) -> None:
        self.events.append(event)
        if event.fault == "kill":
            self._killed.add(event.owner)
        else:
            self._paused.append(event)
        if event.stalls_the_store:
            self._stallers.append(event)

    def _violate(self, message: str) -> None:
        if message not in self.violations:
            self.violations.append(message)

    def stall(self, seconds: float, free: int) -> None:
        """The pool claimed nothing for ``seconds`` although work was ready and ``free``
        workers were (``loop.progress``)."""
        self.longest_stall = max(self.longest_stall, seconds)
        if seconds >= STALL_TTLS * self.ttl:
            self._violate(
                f"no_progress: the pool claimed nothing for {STALL_TTLS} x the ttl "
                f"({STALL_TTLS * self.ttl:g} s) although work was ready and {free} workers "
                "were free"
            )

    def observe(
        self, store: Inspector, now: float, *, final: bool = False, drained: bool = False
    ) -> None:
        """Judge what the database shows now; ``final``: the pool stopped (``drained``: its
        drain found nothing left to do), so nothing pending can resolve any more."""
        look = Look(store, now, self._gone())
        for ev in self.events:
            if ev.outcome == "pending":
                self._judge(store, ev, now, look)
                if final and ev.outcome == "pending":
                    self._unresolved(ev, drained)
        self._count_rejections(store)
        for message in store.integrity_violations():
            self._violate(message)
        if final:
            self._failed_runs(store)

    def _gone(self) -> set[str]:
        """Owners that cannot claim: killed, or paused now."""
        self._paused = [e for e in self._paused if e.woke_at is None]
        return self._killed | {e.owner for e in self._paused}

    # -- one orphan ----------------------------------------------------------------------------
    def _judge(self, store: Inspector, ev: FaultEvent, now: float, look: Look) -> None:
        task = store.get_task(ev.task_id)
        if task is None:
            ev.outcome = "run_over"
        elif task.attempts > ev.attempt and task.claimed_at is not None:
            if task.claimed_at < ev.t:  # already superseded when the fault landed
                ev.outcome = "superseded_before"
            else:
                self._taken_over(store, ev, task)
        elif task.done_at is not None and task.done_attempt == ev.attempt:
            self._committed(ev, task.done_at)
        elif (run := store.get_run(task.run_id)) is None or run.terminal:
            ev.outcome = "run_over"
        else:
            self._look(store, ev, task, run.queue, now, look)

    def _taken_over(self, store: Inspector, ev: FaultEvent, task: TaskInfo) -> None:
        """The next attempt was claimed: time it from the attempt history, and check that it
        was claimed only after the faulted attempt's lease had ended."""
        mine = {h.attempt: h for h in store.attempt_history(task.run_id) if h.task_id == task.id}
        ended, following = mine.get(ev.attempt), mine.get(ev.attempt + 1)
        claimed = task.claimed_at
        if following is not None and following.claimed_at is not None:
            claimed = following.claimed_at
        assert claimed is not None
        end = ended.ended_at if ended is not None and ended.ended_at is not None else None
        end = end if end is not None else (ev.lease_end if ev.lease_end is not None else claimed)
        if end > claimed + 1e-6:
            self._violate(
                f"{ev.fault} of pid {ev.pid}: task {ev.task_id} attempt {ev.attempt + 1} was "
                f"claimed {(end - claimed) * 1000:.0f} ms before attempt {ev.attempt}'s lease "
                "ended (two handlers of one task on live leases)"
            )
        self._count(ev, end, claimed, claimable=True)
        ev.outcome = "taken_over"
        ev.taken_over_ms = round((claimed - ev.t) * 1000, 1)
        self._settle(ev, end)

    def _committed(self, ev: FaultEvent, done_at: float) -> None:
        """The faulted attempt itself committed. Before the fault: fine. After it, a frozen or
        dead process sent nothing new: on a server a request sent before the freeze may still
        land (while its lease lived: at most one renewal in flight could stretch it by a ttl);
        anything later is a zombie write the fence let through (R2, R5)."""
        if done_at <= ev.t + COMMIT_SLACK:
            ev.outcome = "finished_before"
        elif self._resumed_early(ev):
            # a stop (a drain that finished, say) resumed it while its lease may have lived:
            # the fence alone decides its commit
            ev.outcome = "resumed_early"
        elif self.server and done_at < self._last_live(ev):
            ev.outcome = "committed_in_flight"
        else:
            ev.outcome = "committed_after_fault"
            self._violate(
                f"{ev.fault} of pid {ev.pid}: task {ev.task_id} attempt {ev.attempt} "
                f"committed {done_at - ev.t:.2f} s after the fault, after its lease could "
                "have ended (a zombie write)"
            )

    def _last_live(self, ev: FaultEvent) -> float:
        """The latest moment the faulted lease can have been live (see ``_committed``)."""
        end = ev.expires_at if ev.expires_at is not None else ev.t + self.ttl
        return end + self.ttl if self.server else end

    def _resumed_early(self, ev: FaultEvent) -> bool:
        """A pause cut short (by a stop) while the lease may still have been live."""
        return ev.fault == "pause" and ev.woke_at is not None and ev.woke_at < self._last_live(ev)

    def _look(
        self, store: Inspector, ev: FaultEvent, task: TaskInfo, queue: str, now: float, look: Look
    ) -> None:
        """Not taken over yet: once its lease has ended, run the clock while it is claimable."""
        end = self._lease_end(store, ev, task)
        if end is None or end > now:
            return
        claimable = look.claimable(task, queue) and not self._store_stalled(now)
        self._count(ev, end, now, claimable)

    def _lease_end(self, store: Inspector, ev: FaultEvent, task: TaskInfo) -> float | None:
        """When the faulted lease ended or will end (None: not known yet)."""
        if task.attempts == ev.attempt and task.lease_owner is not None:
            return task.lease_expires_at  # an expiry, or a release (it sets the expiry to then)
        if ev.lease_end is None:  # given back without a takeover: the history says when
            for h in store.attempt_history(task.run_id):
                if h.task_id == task.id and h.attempt == ev.attempt and h.ended_at is not None:
                    ev.lease_end = h.ended_at
        return ev.lease_end

    def _count(self, ev: FaultEvent, end: float, at: float, claimable: bool) -> None:
        """The clock from the last look (or the lease's end) to ``at``: it counts when the task
        was claimable at both ends (at the lease's end: as at the first look after it)."""
        since, was = (ev.looked_at, ev.was_claimable) if ev.looked_at is not None else (end, True)
        if was and claimable and at > since:
            ev.claimable_s += at - since - self.stalled(since, at)
        ev.looked_at, ev.was_claimable = max(at, since), claimable
        ev.lease_end = end

    def _settle(self, ev: FaultEvent, end: float) -> None:
        ev.lease_ended_ms = round((end - ev.t) * 1000, 1)
        counted = max(0.0, ev.claimable_s)
        if ev.fault == "kill" and self.fast_release:
            counted += max(0.0, end - ev.t)  # releasing a dead worker's lease is the pool's job
        ev.claimable_ms = round(counted * 1000, 1)

    def _unresolved(self, ev: FaultEvent, drained: bool) -> None:
        self._settle(ev, ev.lease_end if ev.lease_end is not None else ev.t)
        if drained:
            ev.outcome = "lost"
            self._violate(
                f"{ev.fault} of pid {ev.pid}: run {ev.run_id} lost: task {ev.task_id} was never "
                f"taken over after attempt {ev.attempt}, and the drain ended without the run"
            )
        elif (ev.claimable_ms or 0.0) > ev.bound_s * 1000:
            ev.outcome = "not_taken_over"
        else:
            ev.outcome = "unresolved"  # the pool stopped before it could be taken over

    # -- stalls the verifier does not count ---------------------------------------------------
    def _store_stalled(self, now: float) -> bool:
        return any(e.t <= now and e.woke_at is None for e in self._stallers)

    def stalled(self, start: float, end: float) -> float:
        """Seconds of [start, end] during which nobody could take anything over: a paused
        worker may have held the write lock."""
        windows = [(e.t, e.woke_at if e.woke_at is not None else end) for e in self._stallers]
        return _covered(windows, start, end)

    # -- runs failed by chaos ------------------------------------------------------------------
    def _failed_runs(self, store: Inspector) -> None:
        """A run whose task this chaos struck and whose attempts then ran out with no handler
        failing it (the claim after the last allowed attempt failed the run)."""
        struck: dict[int, dict[int, set[int]]] = {}
        for e in self.events:
            struck.setdefault(e.run_id, {}).setdefault(e.task_id, set()).add(e.attempt)
        for run_id, tasks in struck.items():
            run = store.get_run(run_id)
            if run is None or run.status != "failed" or run.failure_reason != EXHAUSTED:
                continue
            for h in store.attempt_history(run_id):
                if h.outcome == "exhausted" and h.task_id in tasks:
                    self._violate(_failed_by_chaos(run_id, h.task_id, h.attempt - 1,
                                                   tasks[h.task_id]))  # fmt: skip

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
            "p50": round(_median(values), 1) if values else None,
            "p99": percentile(values, 99),
            "max": values[-1] if values else None,
        }

    def warnings(self) -> list[str]:
        """Takeovers slower than their bound, counted while the task could be claimed."""
        return [_slow(e) for e in self.events
                if e.claimable_ms is not None and e.claimable_ms > e.bound_s * 1000]  # fmt: skip

    def report(self, **extra: Any) -> dict[str, Any]:
        # one fault strikes one process, holding one lease per slot: faults are counted per
        # struck process, the leases they orphaned apiece
        faults = {"kill": 0, "pause": 0}
        for fault, _pid, _t in {(e.fault, e.pid, e.t) for e in self.events}:
            faults[fault] = faults.get(fault, 0) + 1
        return {
            "faults": faults,
            "leases_hit": len(self.events),
            "orphaned_leases": sum(e.orphaned for e in self.events),
            "taken_over": sum(e.outcome == "taken_over" for e in self.events),
            "not_taken_over": sum(e.outcome in ("not_taken_over", "lost") for e in self.events),
            "takeover_ms": self._latency(),
            # kills follow --fast-release; a paused worker is alive, so its lease always
            # takes the ttl path
            "takeover_ms_by_fault": {f: self._latency(f) for f in ("kill", "pause")},
            "zombie_writes_rejected": self.zombie_writes_rejected,
            "rejected_writes_total": self.rejections_seen,
            "longest_stall_s": round(self.longest_stall, 1),
            "warnings": self.warnings(),
            "violations": list(self.violations),
            "events": [e.public() for e in self.events],
            "ok": not self.violations,
            **extra,
        }


def _failed_by_chaos(run_id: int, task_id: int, last: int, struck: Iterable[int]) -> str:
    if last in struck:
        return (f"run {run_id} failed ({EXHAUSTED}): a fault struck task {task_id} on attempt "
                f"{last}, its last allowed one")  # fmt: skip
    return (f"run {run_id} failed ({EXHAUSTED}) after chaos struck task {task_id} (attempt "
            f"{', '.join(map(str, sorted(struck)))}): its attempts ran out with no handler "
            f"failing it (attempt {last} ended without a commit or an error)")  # fmt: skip


def _slow(e: FaultEvent) -> str:
    figure = f"{e.claimable_ms:.0f} ms of it claimable, over its bound of {e.bound_s:g} s"
    if e.taken_over_ms is not None:
        return (f"{e.fault} of pid {e.pid}: task {e.task_id} taken over after "
                f"{e.taken_over_ms:.0f} ms, {figure}")  # fmt: skip
    return (f"{e.fault} of pid {e.pid}: task {e.task_id} attempt {e.attempt} not taken over "
            f"({e.outcome}), {figure}")  # fmt: skip


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


def _median(values: list[float]) -> float:
    """The median (``statistics`` is not imported for it: every pool loads this module)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
