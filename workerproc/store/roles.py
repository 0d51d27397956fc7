"""What each caller of the store depends on: the part of ``Store`` it uses, as typing Protocols.

``Store`` (``store/protocol/``) is all of them at once; a caller annotates against the role it
plays, so what it may call is written down and a test can hand in a smaller fake:

- ``WorkerStore``: a worker: its exchange (commit and claim in one transaction), the
  heartbeat's renewal, the settling of a conflict, the idle wait's cheap reads, and the
  declaration of its app's per-task options when it starts.
- ``Producer``: code that starts runs and waits for them (users, ``supervisor enqueue``).
- ``Inspector``: what reads without writing: ``status``, ``runs``, ``show``, ``check``, the
  dashboard's pages, metrics, the chaos verifier.
- ``Operator``: an inspector that also writes what operators do: cancel, retry, prune, and the
  supervisor's release of a dead worker's leases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .types import (
    DEFAULT_QUEUE,
    JSON,
    AttemptEnd,
    BatchOutcome,
    ClaimRequest,
    Commit,
    FinishedBucket,
    Lease,
    Rejection,
    Run,
    Stats,
    TaskInfo,
    TaskOptions,
)


class Role(Protocol):
    """What every role does: read one run, close the store."""

    def get_run(self, run_id: int) -> Run | None: ...
    def close(self) -> None: ...


class WorkerStore(Role, Protocol):
    """What a worker, its heartbeat and its idle wait call."""

    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome: ...
    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[float | None]: ...
    def change_token(self) -> int: ...
    def next_ready_at(self, queues: Sequence[str] | None = None) -> float | None: ...
    def now(self) -> float: ...
    def register_tasks(self, declared: Mapping[str, TaskOptions]) -> int: ...


class Producer(Role, Protocol):
    """What starts runs and waits for them."""

    def start_run(
        self, task: str, payload: JSON = None, state: JSON = None, delay: float = 0, *,
        key: str | None = None, queue: str = DEFAULT_QUEUE, priority: int = 0, tx: Any = None,
    ) -> int: ...  # fmt: skip
    def start_runs(self, items: Iterable[Mapping[str, Any]], *, tx: Any = None) -> list[int]: ...
    def wait(self, run_id: int, timeout: float | None = None) -> Run: ...


class Inspector(Role, Protocol):
    """What reads without writing (never the write lock)."""

    @property
    def url(self) -> str: ...
    def get_tasks(self, run_id: int) -> list[TaskInfo]: ...
    def get_task(self, task_id: int) -> TaskInfo | None: ...
    def list_runs(
        self, status: str | None = None, limit: int = 100, *, queue: str | None = None
    ) -> list[Run]: ...
    def stats(self) -> Stats: ...
    def fence_rejections(self, after: int = 0, limit: int = 10_000) -> list[Rejection]: ...
    def integrity_violations(self) -> list[str]: ...
    def check_integrity(self, quick: bool = False, limit: int = 100) -> list[str]: ...
    def integrity_check_name(self, quick: bool = False) -> str | None: ...
    def next_ready_at(self, queues: Sequence[str] | None = None) -> float | None: ...
    def now(self) -> float: ...
    def runs_page(
        self, status: str | None = None, task: str | None = None, *, before: int | None = None,
        after: int | None = None, limit: int = 50,
    ) -> list[Run]: ...  # fmt: skip
    def task_names(self, limit: int = 100) -> list[str]: ...
    def attempt_history(self, run_id: int) -> list[AttemptEnd]: ...
    def run_rejections(self, run_id: int) -> list[Rejection]: ...
    def finished_since(
        self, since: float, bucket: float, *, newest: int = 100_000
    ) -> list[FinishedBucket]: ...
    def task_options(self) -> dict[str, TaskOptions]: ...


class Operator(Inspector, Protocol):
    """An inspector that also writes what operators do."""

    def cancel_run(self, run_id: int) -> bool: ...
    def retry_run(self, run_id: int) -> bool: ...
    def release_owner(self, owner: str) -> int: ...
    def prune(self, older_than: float, *, batch: int = 1000) -> int: ...
    def wait(self, run_id: int, timeout: float | None = None) -> Run: ...
