"""What the store's reads answer (``types`` re-exports them): a run, an event, a task's and a
worker's view, a refused write, the leases and counts of ``stats``, an attempt's end, finished
runs by time. No SQL here: these cross the store interface."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Any

from .records import record
from .statuses import JSON, SYSTEM_RUNS, TERMINAL_STATUSES


@record
class Run:
    id: int
    status: str
    state: JSON
    revision: int
    result: JSON
    failure_reason: str | None
    last_error: str | None
    created_at: float
    updated_at: float
    finished_at: float | None
    queue: str = "default"
    priority: int = 0
    key: str | None = None
    task: str | None = None  # the name of the run's first task (None: before schema v6)
    waiting_for: str | None = None  # a waiting run's wait ("signal:NAME"), else None
    parent_id: int | None = None  # the run that spawned this one (a child run), else None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def system(self) -> bool:
        """One of the system's own runs (a webhook's delivery run), not a user's."""
        return self.id >= SYSTEM_RUNS


@record
class Event:
    """One transition of a run, written in the transaction that made it (the outbox, B18).

    ``id`` increases in commit order (a consumer that stored "after N" never misses one that
    commits later); ``kind`` is one of ``protocol.events.KINDS``; ``task`` the task's name
    (None for a run's own transitions, such as a cancel); ``attempt`` the lease's fencing
    token where one is involved; ``data`` the transition's details (``owner``, ``error``,
    ``reason``, ...)."""

    id: int
    at: float
    run_id: int | None
    kind: str
    task: str | None
    attempt: int | None
    data: dict[str, Any]


@record
class TaskInfo:
    id: int
    run_id: int
    name: str
    payload: JSON
    available_at: float
    created_at: float
    lease_owner: str | None
    lease_expires_at: float | None
    attempts: int
    attempt_base: int
    last_error: str | None
    done_at: float | None
    claimed_at: float | None = None  # when the latest attempt was claimed
    done_attempt: int | None = None  # the attempt whose commit finished the task
    done_owner: str | None = None  # the owner whose commit finished the task
    version: int | None = (
        None  # the version its run's state is written for (B25; None: unversioned)
    )


@record
class WorkerInfo:
    """A worker process as the ``workers`` table lists it, kept by its heartbeat:
    any host, a producer or the dashboard can tell that a pool is claiming without a pidfile.
    ``alive``: it beat within three of its heartbeat periods (``beat_every``)."""

    owner: str
    host: str
    pid: int
    started_at: float
    beat_every: float
    slots: int
    queues: tuple[str, ...] | None
    version: str
    state: str = "running"  # or "draining": it claims no more and finishes what it holds
    heartbeat_at: float = 0.0
    alive: bool = True
    tasks: tuple[str, ...] | None = None  # the tasks it has handlers for (None: any, B22)


@record
class Rejection:
    """A fenced write the database refused: the lease (owner, attempt) was no longer live."""

    id: int
    at: float
    task_id: int
    run_id: int
    owner: str
    attempt: int
    op: str


@record
class OwnerLease:
    """A lease as operators see it: who holds which task until when."""

    owner: str
    task_id: int
    run_id: int
    task: str
    attempt: int
    expires_at: float


@record
class QueueCounts:
    """One queue's pending tasks (by state) and runs (by status)."""

    ready: int = 0
    delayed: int = 0
    leased: int = 0
    expired: int = 0
    runs: dict[str, int] = field(default_factory=dict)


@record
class Stats:
    now: float
    runs: dict[str, int]
    ready: int
    delayed: int
    leased: int
    expired: int
    leases: list[OwnerLease]
    queues: dict[str, QueueCounts] = field(default_factory=dict)

    @classmethod
    def from_counts(
        cls,
        now: float,
        run_rows: Sequence[Sequence[Any]],
        task_rows: Sequence[Sequence[Any]],
        leases: list[OwnerLease],
    ) -> Stats:
        """Both backends' count rows: ``(queue, status, runs)`` (the live runs' and the finished
        runs' totals) and ``(queue, ready, delayed, leased, expired)``, summed per queue and
        over all of them."""
        runs: dict[str, int] = {}
        by_queue: dict[str, dict[str, int]] = {}
        for queue, status, n in run_rows:
            runs[status] = runs.get(status, 0) + n
            by_queue.setdefault(queue, {})[status] = n
        counts = {row[0]: tuple(row[1:5]) for row in task_rows}
        queues = {}
        for name in sorted(set(by_queue) | set(counts)):
            ready, delayed, leased, expired = counts.get(name, (0, 0, 0, 0))
            queues[name] = QueueCounts(ready, delayed, leased, expired, by_queue.get(name, {}))
        return cls(
            now,
            runs,
            sum(q.ready for q in queues.values()),
            sum(q.delayed for q in queues.values()),
            sum(q.leased for q in queues.values()),
            sum(q.expired for q in queues.values()),
            leases,
            queues,
        )

    @property
    def pending_work(self) -> int:
        """Tasks that still need a worker: ready, delayed, leased or expired."""
        return self.ready + self.delayed + self.leased + self.expired


@record
class AttemptEnd:
    """An attempt that ended without a commit (a committed one is on its task: ``done_*``).

    ``outcome``: ``released`` (given back, with ``error`` if its handler raised), ``failed``
    (its handler failed the run), ``taken_over`` (its lease ran out or was released as dead,
    and ``taken_by`` claimed the task; ``ended_at`` is when the lease ended), ``unstarted``
    (the same, for a lease whose handler never began: no attempt spent, B3), ``exhausted`` (the
    claim that would have exceeded max_attempts failed the run instead).
    """

    task_id: int
    attempt: int
    owner: str
    claimed_at: float | None
    ended_at: float | None
    outcome: str
    error: str | None = None
    taken_by: str | None = None


@record
class FinishedBucket:
    """Runs that finished within ``[start, start + seconds)``, by outcome."""

    start: float
    seconds: float
    succeeded: int
    failed: int
    cancelled: int
