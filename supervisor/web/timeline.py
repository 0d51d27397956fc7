"""A run's timeline: every attempt of every task, who held it, how long, and how it ended.

Composed from what the store keeps: the task row (its latest attempt, and who committed it),
the attempt history (attempts that ended without a commit: released, failed, taken over,
exhausted) and the writes the fence refused (a zombie's renewals and commits).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from workerproc.store import AttemptEnd, Rejection, Run, TaskInfo
from workerproc.store.calls import PARKED, CallIntent, PaidCall

# outcome -> how the page says it
OUTCOMES = {
    "committed": "committed",
    "released": "released",
    "failed": "failed the run",
    "taken_over": "taken over",
    "unstarted": "lapsed before its handler began (no attempt spent)",
    "exhausted": "refused: attempts exhausted",
    "holding": "holding the lease",
    "expired": "lease expired, not yet taken over",
    "unknown": "no record (before the history was kept)",
}


@dataclass(frozen=True)
class Attempt:
    task_id: int
    number: int
    outcome: str
    owner: str | None = None
    claimed_at: float | None = None
    ended_at: float | None = None  # None while held
    error: str | None = None
    taken_by: str | None = None
    taken_after: float | None = None  # seconds from the lease's end to the next claim
    expires_at: float | None = None  # while held: when the lease runs out
    refused: list[Rejection] = field(default_factory=list)

    @property
    def label(self) -> str:
        return OUTCOMES.get(self.outcome, self.outcome)

    def held(self, now: float) -> float | None:
        """Seconds between the claim and the end (or now, while held)."""
        if self.claimed_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.claimed_at)


@dataclass(frozen=True)
class TaskTimeline:
    task: TaskInfo
    attempts: list[Attempt]


def build(
    tasks: Iterable[TaskInfo],
    history: Iterable[AttemptEnd],
    rejections: Iterable[Rejection],
    now: float,
) -> list[TaskTimeline]:
    ended: dict[tuple[int, int], AttemptEnd] = {}
    for h in history:
        ended.setdefault((h.task_id, h.attempt), h)
    refused: dict[tuple[int, int], list[Rejection]] = defaultdict(list)
    for r in rejections:
        refused[(r.task_id, r.attempt)].append(r)
    return [
        TaskTimeline(t, [_attempt(t, n, ended, refused, now) for n in range(1, t.attempts + 1)])
        for t in tasks
    ]


def _claimed_at(
    task: TaskInfo, number: int, ended: dict[tuple[int, int], AttemptEnd]
) -> float | None:
    if number == task.attempts:
        return task.claimed_at
    h = ended.get((task.id, number))
    return h.claimed_at if h else None


def _attempt(
    task: TaskInfo,
    n: int,
    ended: dict[tuple[int, int], AttemptEnd],
    refused: dict[tuple[int, int], list[Rejection]],
    now: float,
) -> Attempt:
    key = (task.id, n)
    zombie = refused.get(key, [])
    h = ended.get(key)
    if h is not None:
        after = None
        following = _claimed_at(task, n + 1, ended) if n < task.attempts else None
        if h.outcome == "taken_over" and following is not None and h.ended_at is not None:
            after = max(0.0, following - h.ended_at)
        return Attempt(task.id, n, h.outcome, h.owner, h.claimed_at, h.ended_at, h.error,
                       h.taken_by, after, refused=zombie)  # fmt: skip
    latest = n == task.attempts
    if n == task.done_attempt:
        claimed = task.claimed_at if latest else None
        return Attempt(task.id, n, "committed", task.done_owner, claimed, task.done_at,
                       refused=zombie)  # fmt: skip
    if latest and task.lease_owner is not None:
        expires = task.lease_expires_at
        live = expires is not None and expires > now
        return Attempt(task.id, n, "holding" if live else "expired", task.lease_owner,
                       task.claimed_at, None if live else expires, expires_at=expires,
                       refused=zombie)  # fmt: skip
    return Attempt(task.id, n, "unknown", refused=zombie)


def unresolved(run: Run, calls: Iterable[PaidCall], intents: Iterable[CallIntent]) -> list[str]:
    """The paid calls of a live run an operator may resolve: the one it is parked
    on (``outcome_unknown:NAME``) and any whose outcome is unknown (an intent whose attempt
    ended without an answer, not settled) and that has no kept answer."""
    if run.terminal:
        return []
    names: set[str] = set()
    parked = f"{PARKED}:"
    if run.waiting_for and run.waiting_for.startswith(parked):
        names.add(run.waiting_for.removeprefix(parked))
    kept = {(c.task_id, c.name, c.request_hash) for c in calls if c.kept}
    names.update(i.name for i in intents
                 if i.unknown and i.answered_at is None and i.settled is None
                 and (i.task_id, i.name, i.request_hash) not in kept)  # fmt: skip
    return sorted(names)
