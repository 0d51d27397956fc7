"""Plain values the store hands out. No SQL here: these cross the store interface. The
constants are ``statuses``' and what reads answer ``readtypes``' (both importable from here)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from .readtypes import (
    AttemptEnd,
    Event,
    FinishedBucket,
    OwnerLease,
    QueueCounts,
    Rejection,
    Run,
    Stats,
    TaskInfo,
    WorkerInfo,
)
from .records import record
from .statuses import (
    DEFAULT_QUEUE,
    JSON,
    RUN_STATUSES,
    STORED_STATUS,
    SYSTEM_RUNS,
    TERMINAL_STATUSES,
    WAITING_FILTER,
    CasResult,
    Clock,
)

__all__ = [  # what ``statuses`` and ``readtypes`` hold is importable from here too
    "DEFAULT_QUEUE",
    "JSON",
    "MAX_CHILDREN",
    "NO_OPTIONS",
    "RUN_STATUSES",
    "STORED_STATUS",
    "SYSTEM_RUNS",
    "TERMINAL_STATUSES",
    "WAITING_FILTER",
    "AttemptEnd",
    "BatchOutcome",
    "CasResult",
    "Child",
    "ClaimRequest",
    "Clock",
    "Commit",
    "CommitKind",
    "CommitOutcome",
    "Event",
    "FinishedBucket",
    "Lease",
    "OwnerLease",
    "QueueCounts",
    "Rejection",
    "Renewal",
    "Run",
    "RunFailure",
    "Signal",
    "SignalInfo",
    "Stats",
    "TaskInfo",
    "TaskOptions",
    "Usage",
    "WorkerInfo",
]


# Frozen at run time too, unlike the other records (``records``): one instance is shared by
# every lease of a task (``codec.task_options`` keeps them by their text; ``NO_OPTIONS`` is every
# undeclared task's) and by the app's ``Task``, and a handler reaches it (``ctx.lease.options``),
# so an assignment no type checker saw would change the options of every later lease in the
# process, and write unchecked values to the database. One class, made rarely: 0.1 ms at import.
@dataclass(frozen=True)
class TaskOptions:
    """What ``@app.task(...)`` declares for one task, kept in the database by task name (the
    ``task_options`` table), so every worker on every host reads the same values in its claim.
    None: the pool's own option (``--max-attempts``, ``--retry-backoff``, ``--task-timeout``;
    the queue and priority a run is started with)."""

    max_attempts: int | None = None  # deliveries of the task before its run fails (R6)
    retry_backoff: float | None = None  # the first retry delay after a handler error
    timeout: float | None = None  # the hard limit of one execution, in seconds
    queue: str | None = None  # the queue its runs start in, and move to when it is next
    priority: int | None = None  # the priority its runs start with
    limits: tuple[str, ...] | None = None  # the limits its runs wait behind
    tokens: int | None = None  # the tokens a run reserves from its limits' budgets
    stream_ttl: float | None = None  # seconds a succeeded run keeps the stream it wrote (B21)

    @property
    def declared(self) -> dict[str, Any]:
        """The options given (not None), by name: what the database keeps."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


NO_OPTIONS = TaskOptions()


@record
class Signal:
    """A signal sent to a run (``store.signal``), as the wait it resumed sees it
    (``ctx.signal``)."""

    name: str
    payload: JSON
    sent_at: float


@record
class Child:
    """A child run as its parent's join sees it (``ctx.children``, in spawn order)."""

    run_id: int
    status: str
    result: JSON
    error: str | None


MAX_CHILDREN = 1000  # children one spawn may start


@record
class SignalInfo:
    """A signal as ``show`` lists it: ``task_id`` is the task whose wait it resumed (None:
    kept until the run waits for it)."""

    id: int
    name: str
    payload: JSON
    sent_at: float
    task_id: int | None


@record
class Lease:
    """One claim of one task: the holder's proof, matched on every later write (R2)."""

    task_id: int
    run_id: int
    task: str
    payload: JSON
    attempt: int
    owner: str
    expires_at: float
    claimed_at: float
    state: JSON = field(default=None)
    revision: int = 0
    tries: int = 1  # attempts since the run was last retried: what max_attempts bounds (R6)
    takeover: bool = False  # the previous holder's lease expired (or was released as dead)
    queue: str = DEFAULT_QUEUE  # the run's queue when it was claimed (where its end counts)
    options: TaskOptions = NO_OPTIONS  # the task's declared options, read in the claim
    gates: tuple[str, ...] = ()  # the limits' gates it holds a slot of
    reserved: int | None = None  # the tokens its claim reserved from them
    signal: Signal | None = None  # the signal that resumed this task's wait
    parent_id: int | None = None  # the run's parent, if it is a child run
    children: tuple[Child, ...] | None = None  # the join task's children, in spawn order
    traceparent: str | None = None  # the run's W3C trace context (tracing)
    previous_owner: str | None = None  # a takeover's: whose lease it took over
    previous_attempt: int | None = None  # and that lease's attempt
    # the database counts this attempt as begun (B3): claimed to start at once; False: held
    # waiting (a prefetch), its start recorded by the renewal that confirms it
    # (``renew_each(starting=...)``), and a lapse before that spends no attempt
    started: bool = True
    # the task's version (B25): the version of its run's state, as its claim read it (None:
    # unversioned); a worker migrates an older one before the handler begins
    version: int | None = None

    @property
    def fence(self) -> tuple[int, str, int]:
        return (self.task_id, self.owner, self.attempt)


CommitKind = Literal[
    "finish",
    "advance",
    "release",
    "fail",
    "drop",
    "handback",
    "retry_after",
    "wait",
    "spawn",
    "park",
    "ack",
    "compare_and_set",
    "migrate",
]


@record
class Commit:
    """The last word of one execution of a task, written under its lease in one transaction.

    - ``finish``: CAS the run's state at ``expected_revision``, mark it succeeded with ``result``.
    - ``advance``: CAS the state, enqueue ``next_task`` (``next_payload``, after ``delay``).
    - ``release``: give the task back for another attempt after ``delay``, keeping ``error``.
    - ``fail``: fail the run with ``reason`` (and ``error``); the task stays for ``retry_run``.
    - ``drop``: the run moved on without us (cancelled, say): mark the task done, touch nothing.
    - ``handback``: a claimed task that never started goes back at once; the claim does not
      count against ``max_attempts`` (the fencing token still moved on).
    - ``retry_after``: a limit said "not now" (``RetryAfter``): the task goes back after
      ``delay`` without spending an attempt, and (``pause``) its limits pause that long.

    - ``wait``: an ``advance`` whose next task is not due before ``delay`` (its timeout, or
      ``WAIT_FOREVER``) and that marks the run waiting for ``wait_for`` (``signal:NAME``): a
      signal sent to the run makes that task due at once (B14).
    - ``spawn``: a ``wait`` for ``children`` (``NewRun`` each, started in the same
      transaction, each knowing its parent): the next task joins them, due when the last one
      ends.
    - ``park``: a paid call's outcome is unknown (``once(unknown="park")``): the task goes back,
      not due before ``delay``, without spending an attempt, and the run waits for
      ``wait_for`` (``outcome_unknown:NAME``) until ``resolve`` makes it due (B13).

    - ``ack`` (``Store.ack``): mark the task done; a run with no task left has succeeded.
    - ``compare_and_set`` (``Store.compare_and_set``): CAS the state at ``expected_revision``;
      the lease stays.
    - ``migrate`` (``Store.migrate_state``, B25): a compare-and-set that also moves the task to
      ``version``, before its handler begins; the lease stays.

    ``used_tokens``: what the handler reported using (``ctx.usage``), settled against its
    lease's reservation in the same transaction.
    """

    lease: Lease
    kind: CommitKind
    expected_revision: int = 0
    new_state: JSON = None
    next_task: str | None = None
    next_payload: JSON = None
    next_queue: str | None = None  # advance: move the run to this queue (None: stay)
    delay: float = 0.0
    result: JSON = None
    error: str | None = None
    reason: str | None = None
    used_tokens: int | None = None
    usage: Usage | None = None  # what ``ctx.usage`` reported, kept with the commit (spend)
    pause: bool = True
    wait_for: str | None = None  # wait: what the run waits for ("signal:NAME")
    children: tuple[Any, ...] = ()  # spawn: the child runs to start (``NewRun`` each)
    # migrate: the version the task's new state is written for; advance, wait, spawn: the next
    # task's version (B25; None: unversioned)
    version: int | None = None


@record
class Usage:
    """What an execution reported using (``ctx.usage``): tokens, and a cost in the user's own
    unit; kept with its commit for ``supervisor spend``."""

    tokens: int | None = None
    cost: float | None = None


@record
class Renewal:
    """One lease's answer to a renewal (B5, B15): its new expiry, or None where the lease is
    lost or expired; and whether its run is still alive. A live lease on a run that is over
    (an operator cancelled it) is still renewed, so its holder can end it under its own
    fence, and answers ``cancelled``: the handler must stop (``RunCancelled``)."""

    expires_at: float | None
    cancelled: bool = False


@record
class ClaimRequest:
    """What a worker asks for when it fuses "commit these tasks" with "claim the next ones":
    up to ``limit`` leases, from ``queues`` (None: every queue) but those of ``skip``.
    ``start``: how many of them (the first ones) the worker's handlers begin at once (None:
    all); the database records them as begun, and the others as waiting (B3: a lease that
    lapses before its start was recorded spends no attempt). ``also``: a second claim made in
    the same transaction, after this one (a worker's delivery lane: the webhooks' queue, for
    its own slots, B20); the leases of both come back together, this one's first.
    ``tasks``: the task names the claimer has handlers for (None: any); a run whose next task
    is none of them is left to a worker that serves it (B22: a rolling deploy's old workers
    never claim a new version's task). ``task``:
    only runs whose head is a task of this name, and only runs in no line (a batch step's
    claim for more of its own items; the runs of a task with limits join a batch through the
    worker's plain claim, admitted one by one)."""

    owner: str
    ttl: float
    max_attempts: int = 3
    limit: int = 1
    queues: tuple[str, ...] | None = None
    start: int | None = None
    skip: tuple[str, ...] = ()
    also: ClaimRequest | None = None
    tasks: tuple[str, ...] | None = None
    task: str | None = None

    @property
    def begins(self) -> bool:
        """Whether every lease of this claim begins at once (recorded as begun)."""
        return self.start is None or self.start >= self.limit


@record
class CommitOutcome:
    """What a fused commit answers: the fenced write's result and, if asked, the next lease."""

    result: CasResult
    next_lease: Lease | None = None


@record
class RunFailure:
    """A run that a transaction failed (its ``run.failed`` event): the worker logs one line of
    each, whether its handler's commit or the claim decided it (R6, B10, an unknown task)."""

    run_id: int
    task: str | None
    reason: str
    error: str | None


@record
class BatchOutcome:
    """What a batched commit answers: one result per commit, in order, the new leases, the
    runs the transaction failed, and what each stream batch written with it answered
    (``appended``, in the order of ``commit_many``'s ``streams``: ``streams.Appended``)."""

    results: tuple[CasResult, ...]
    leases: tuple[Lease, ...] = ()
    failed: tuple[RunFailure, ...] = ()
    appended: tuple[Any, ...] = ()
