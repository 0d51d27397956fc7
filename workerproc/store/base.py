"""The store interface every backend implements. Callers depend on this, never on a backend."""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from .errors import RunNotFound
from .types import (
    JSON,
    AttemptEnd,
    BatchOutcome,
    CasResult,
    ClaimRequest,
    CommitOutcome,
    FinishedBucket,
    Lease,
    Rejection,
    Run,
    Stats,
    TaskInfo,
)

Clock = Callable[[], float]

CommitKind = Literal["finish", "advance", "release", "fail", "drop", "handback"]
CHANGE_CHECK = 0.01  # how often ``wait_change`` reads the change token (a cheap local read)
DEFAULT_QUEUE = "default"


MAX_WAIT = 366 * 86_400.0  # a wait longer than a year is a mistake: wait without a timeout


def check_timeout(timeout: float | None) -> float | None:
    """``wait``'s timeout: None (no limit) or a number of seconds from 0 to ``MAX_WAIT``;
    ValueError otherwise (NaN and infinities included)."""
    if timeout is None:
        return None
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT:
        raise ValueError(
            f"timeout must be from 0 to {MAX_WAIT:g} seconds, or None (got {timeout!r})"
        )
    return seconds


@dataclass(frozen=True)
class Commit:
    """The last word of one execution of a task, written under its lease in one transaction.

    - ``finish``: CAS the run's state at ``expected_revision``, mark it succeeded with ``result``.
    - ``advance``: CAS the state, enqueue ``next_task`` (``next_payload``, after ``delay``).
    - ``release``: give the task back for another attempt after ``delay``, keeping ``error``.
    - ``fail``: fail the run with ``reason`` (and ``error``); the task stays for ``retry_run``.
    - ``drop``: the run moved on without us (cancelled, say): mark the task done, touch nothing.
    - ``handback``: a claimed task that never started goes back at once; the claim does not
      count against ``max_attempts`` (the fencing token still moved on).
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


class Store(abc.ABC):
    """Runs and tasks under leases (docs/protocol.md, R1-R7). Every fenced call matches task id,
    owner and attempt and requires the lease to be live; the store reads "now" only after it holds
    the write lock."""

    url: str

    # -- producers ---------------------------------------------------------------------------
    @abc.abstractmethod
    def start_run(
        self,
        task: str,
        payload: JSON = None,
        state: JSON = None,
        delay: float = 0,
        *,
        key: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        tx: Any = None,
    ) -> int:
        """Start a run whose first task is ``task``; its state is ``state`` (``{}`` when None).

        ``key`` makes the start idempotent: while a run with that key exists, starting again
        returns its id and creates nothing. ``tx``: the caller's own open transaction on the
        same database (a ``sqlite3.Connection`` for SQLite), so the run exists if and only if
        the caller's transaction commits; the caller commits or rolls back."""

    @abc.abstractmethod
    def start_runs(self, items: Iterable[Mapping[str, Any]], *, tx: Any = None) -> list[int]:
        """Start many runs in one transaction; each item has ``start_run``'s parameter names
        (only ``task`` is required). Returns the run ids in the items' order."""

    def wait(self, run_id: int, timeout: float | None = None) -> Run:
        """Block until the run is succeeded, failed or cancelled and return it; TimeoutError
        after ``timeout`` seconds. Sleeps on the change token between looks, never spins."""
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            token = self.change_token()
            run = self.get_run(run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.terminal:
                return run
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run {run_id} is still {run.status} after {timeout:g} s")
            self.wait_change(token, min(left, 3600.0))

    # -- the lease protocol (pinned) ---------------------------------------------------------
    @overload
    def claim(
        self,
        owner: str,
        ttl: float,
        *,
        max_attempts: int = 3,
        limit: None = None,
        queues: Sequence[str] | None = None,
    ) -> Lease | None: ...
    @overload
    def claim(
        self,
        owner: str,
        ttl: float,
        *,
        max_attempts: int = 3,
        limit: int,
        queues: Sequence[str] | None = None,
    ) -> list[Lease]: ...

    def claim(
        self,
        owner: str,
        ttl: float,
        *,
        max_attempts: int = 3,
        limit: int | None = None,
        queues: Sequence[str] | None = None,
    ) -> Lease | list[Lease] | None:
        """R1: claim the first ready task (or, with ``limit=k``, up to k tasks of k different
        runs) in the served ``queues`` (None: all), a higher priority first."""
        request = ClaimRequest(
            owner, ttl, max_attempts, 1 if limit is None else limit,
            None if queues is None else tuple(queues),
        )  # fmt: skip
        leases = list(self.commit_many((), claim=request).leases)
        if limit is None:
            return leases[0] if leases else None
        return leases

    @abc.abstractmethod
    def renew_until(self, lease: Lease, ttl: float) -> float | None:
        """Renew (R3) and return the new expiry, or None when the lease is lost or expired."""

    def renew(self, lease: Lease, ttl: float) -> bool:
        return self.renew_until(lease, ttl) is not None

    @abc.abstractmethod
    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[float | None]:
        """R3 for every lease of one owner in one statement: each lease's new expiry, or None
        where that lease is lost or expired (the refusal is recorded like any other)."""

    @abc.abstractmethod
    def ack(self, lease: Lease) -> bool: ...

    def release(self, lease: Lease, delay: float = 0, *, error: str | None = None) -> bool:
        commit = Commit(lease, "release", delay=delay, error=error)
        return self.commit(commit).result is CasResult.OK

    @abc.abstractmethod
    def compare_and_set(
        self, lease: Lease, expected_revision: int, new_state: JSON
    ) -> CasResult: ...

    # -- fenced commits for the handler API --------------------------------------------------
    @abc.abstractmethod
    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        """Write every commit under its own lease (each a fenced write answering ok, conflict or
        lease_lost on its own) and, in the same transaction, claim up to ``claim.limit`` tasks."""

    def commit(self, commit: Commit, *, claim: ClaimRequest | None = None) -> CommitOutcome:
        """Write ``commit`` under its lease and, in the same transaction, claim the next task."""
        out = self.commit_many((commit,), claim=claim)
        return CommitOutcome(out.results[0], out.leases[0] if out.leases else None)

    def advance(
        self,
        lease: Lease,
        expected_revision: int,
        new_state: JSON,
        next_task: str,
        payload: JSON = None,
        delay: float = 0,
    ) -> CasResult:
        return self.commit(
            Commit(
                lease,
                "advance",
                expected_revision=expected_revision,
                new_state=new_state,
                next_task=next_task,
                next_payload=payload,
                delay=delay,
            )
        ).result

    def finish(
        self, lease: Lease, expected_revision: int, new_state: JSON, result: JSON = None
    ) -> CasResult:
        return self.commit(
            Commit(
                lease,
                "finish",
                expected_revision=expected_revision,
                new_state=new_state,
                result=result,
            )
        ).result

    # -- operators ---------------------------------------------------------------------------
    @abc.abstractmethod
    def fail_run(self, run_id: int, reason: str, error: str | None = None) -> bool: ...

    @abc.abstractmethod
    def cancel_run(self, run_id: int) -> bool: ...

    @abc.abstractmethod
    def retry_run(self, run_id: int) -> bool: ...

    @abc.abstractmethod
    def release_owner(self, owner: str) -> int:
        """Expire every live lease of ``owner`` (known dead); returns how many."""

    @abc.abstractmethod
    def prune(self, older_than: float, *, batch: int = 1000) -> int:
        """Delete runs that finished more than ``older_than`` seconds ago, with their tasks
        (and refused-write records as old), ``batch`` runs per write transaction so no lock
        is held long; returns how many runs went."""

    @abc.abstractmethod
    def get_run(self, run_id: int) -> Run | None: ...

    @abc.abstractmethod
    def get_tasks(self, run_id: int) -> list[TaskInfo]: ...

    @abc.abstractmethod
    def get_task(self, task_id: int) -> TaskInfo | None: ...

    @abc.abstractmethod
    def fence_rejections(self, after: int = 0, limit: int = 10_000) -> list[Rejection]:
        """Writes the fence refused (a zombie's renewal or commit, say), oldest first."""

    @abc.abstractmethod
    def integrity_violations(self) -> list[str]:
        """What must never be in the database: a finished task committed by a superseded
        attempt, or a run holding two live leases at once. Empty when all is well."""

    @abc.abstractmethod
    def check_integrity(self, quick: bool = False, limit: int = 100) -> list[str]:
        """What the database engine finds wrong with its own storage: damaged pages, broken
        indexes, missing rows (SQLite: ``PRAGMA integrity_check``, or ``quick_check`` when
        ``quick``, which skips comparing indexes with their tables). At most ``limit`` lines,
        each for people; empty when sound. Corruption is reported, never raised."""

    @abc.abstractmethod
    def integrity_check_name(self, quick: bool = False) -> str | None:
        """What ``check_integrity`` runs, named for people (``integrity_check``); None when
        this database offers no check of its storage (PostgreSQL without the amcheck
        extension): ``check_integrity`` then checks nothing and finds nothing."""

    @abc.abstractmethod
    def list_runs(
        self, status: str | None = None, limit: int = 100, *, queue: str | None = None
    ) -> list[Run]: ...

    @abc.abstractmethod
    def stats(self) -> Stats: ...

    # -- what the dashboard reads (never takes the write lock) ---------------------------------
    @abc.abstractmethod
    def runs_page(
        self,
        status: str | None = None,
        task: str | None = None,
        *,
        before: int | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """One keyset page of runs, newest first: ids below ``before`` (or above ``after``)."""

    @abc.abstractmethod
    def task_names(self, limit: int = 100) -> list[str]:
        """The distinct names of runs' first tasks (what ``runs_page(task=...)`` filters on)."""

    @abc.abstractmethod
    def attempt_history(self, run_id: int) -> list[AttemptEnd]:
        """The attempts of a run's tasks that ended without a commit, oldest first."""

    @abc.abstractmethod
    def run_rejections(self, run_id: int) -> list[Rejection]:
        """The writes the fence refused for this run's tasks, oldest first."""

    @abc.abstractmethod
    def finished_since(
        self, since: float, bucket: float, *, newest: int = 100_000
    ) -> list[FinishedBucket]:
        """Runs finished since ``since`` per ``bucket`` seconds (only non-empty buckets),
        looking at the ``newest`` runs only: a bounded read, whatever the table's size."""

    # -- cheap reads for idle workers (never take the write lock) -----------------------------
    @abc.abstractmethod
    def change_token(self) -> int:
        """A number that changes when another connection commits. Cheap; no write lock."""

    def wait_change(self, token: int, timeout: float) -> int:
        """Sleep until ``change_token()`` differs from ``token`` or ``timeout`` passes; return
        the current token. A backend with notifications overrides this to sleep on them."""
        deadline = time.monotonic() + timeout
        while (current := self.change_token()) == token and time.monotonic() < deadline:
            time.sleep(min(CHANGE_CHECK, max(0.0, deadline - time.monotonic())))
        return current

    @abc.abstractmethod
    def next_ready_at(self, queues: Sequence[str] | None = None) -> float | None:
        """The earliest moment some task of ``queues`` (None: any) could be claimed (a past
        value: claimable now)."""

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock (injectable; the database clock on PostgreSQL)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
