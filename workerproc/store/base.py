"""The store interface every backend implements. Callers depend on this, never on a backend."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .types import (
    JSON,
    CasResult,
    ClaimRequest,
    CommitOutcome,
    Lease,
    Rejection,
    Run,
    Stats,
    TaskInfo,
)

Clock = Callable[[], float]

CommitKind = Literal["finish", "advance", "release", "fail", "drop"]


@dataclass(frozen=True)
class Commit:
    """The last word of one execution of a task, written under its lease in one transaction.

    - ``finish``: CAS the run's state at ``expected_revision``, mark it succeeded with ``result``.
    - ``advance``: CAS the state, enqueue ``next_task`` (``next_payload``, after ``delay``).
    - ``release``: give the task back for another attempt after ``delay``, keeping ``error``.
    - ``fail``: fail the run with ``reason`` (and ``error``); the task stays for ``retry_run``.
    - ``drop``: the run moved on without us (cancelled, say): mark the task done, touch nothing.
    """

    lease: Lease
    kind: CommitKind
    expected_revision: int = 0
    new_state: JSON = None
    next_task: str | None = None
    next_payload: JSON = None
    delay: float = 0.0
    result: JSON = None
    error: str | None = None
    reason: str | None = None


class Store(abc.ABC):
    """Runs and tasks under leases (DESIGN.md R1-R7). Every fenced call matches task id, owner
    and attempt and requires the lease to be live; the store reads "now" only after it holds the
    write lock."""

    url: str

    # -- producers ---------------------------------------------------------------------------
    @abc.abstractmethod
    def start_run(
        self, task: str, payload: JSON = None, state: JSON = None, delay: float = 0
    ) -> int: ...

    # -- the lease protocol (pinned) ---------------------------------------------------------
    @abc.abstractmethod
    def claim(self, owner: str, ttl: float, *, max_attempts: int = 3) -> Lease | None: ...

    @abc.abstractmethod
    def renew_until(self, lease: Lease, ttl: float) -> float | None:
        """Renew (R3) and return the new expiry, or None when the lease is lost or expired."""

    def renew(self, lease: Lease, ttl: float) -> bool:
        return self.renew_until(lease, ttl) is not None

    @abc.abstractmethod
    def ack(self, lease: Lease) -> bool: ...

    @abc.abstractmethod
    def release(self, lease: Lease, delay: float = 0, *, error: str | None = None) -> bool: ...

    @abc.abstractmethod
    def compare_and_set(
        self, lease: Lease, expected_revision: int, new_state: JSON
    ) -> CasResult: ...

    # -- fenced commits for the handler API --------------------------------------------------
    @abc.abstractmethod
    def commit(self, commit: Commit, *, claim: ClaimRequest | None = None) -> CommitOutcome:
        """Write ``commit`` under its lease and, in the same transaction, claim the next task."""

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
    def list_runs(self, status: str | None = None, limit: int = 100) -> list[Run]: ...

    @abc.abstractmethod
    def stats(self) -> Stats: ...

    # -- cheap reads for idle workers (never take the write lock) -----------------------------
    @abc.abstractmethod
    def change_token(self) -> int:
        """A number that changes when another connection commits. Cheap; no write lock."""

    @abc.abstractmethod
    def next_ready_at(self) -> float | None:
        """The earliest moment some task could be claimed (a past value: claimable now)."""

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock (injectable; the database clock on PostgreSQL)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
