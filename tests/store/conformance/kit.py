"""What the conformance modules share: the ``Driver`` a test receives, the ``verb`` mark that
says which verbs a test covers (``test_meta`` reads it), and small steps over the store."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from helpers import FakeClock
from store_backends import Backend

from workerproc.store import BatchOutcome, CasResult, ClaimRequest, Commit, Lease, Store
from workerproc.store.newrun import NewRun
from workerproc.store.types import JSON, Rejection

TTL = 60.0

KINDS = ("finish", "advance", "release", "fail", "drop", "handback", "retry_after", "wait",
         "spawn", "park")  # fmt: skip


def last_word(lease: Lease, kind: str) -> Commit:
    """A valid commit of ``kind`` under ``lease``."""
    extra: dict[str, object] = {
        "finish": {"result": {"ok": 1}, "new_state": {"n": 1}},
        "advance": {"next_task": "next", "next_payload": {"p": 2}, "new_state": {"n": 1}},
        "release": {"error": "boom", "delay": 5.0},
        "fail": {"reason": "gave_up", "error": "bad"},
        "retry_after": {"delay": 5.0},
        "wait": {"next_task": "resume", "delay": 100.0, "wait_for": "signal:go"},
        "spawn": {"next_task": "join", "delay": 100.0,
                  "children": (NewRun.make("kid", {"k": 1}, None, 0, None, "default", 0),)},
        "park": {"delay": 100.0, "wait_for": "outcome_unknown:pay"},
    }.get(kind, {})  # fmt: skip
    return Commit(lease, kind, **extra)  # type: ignore[arg-type]


def verb(*names: str) -> pytest.MarkDecorator:
    """The verbs (role methods; ``AsyncStore.NAME`` for the async store's) a test covers."""
    return pytest.mark.verb(*names)


@dataclass
class Driver:
    """One backend's store on a fresh database, its clock moved by hand."""

    name: str
    backend: Backend
    clock: FakeClock
    store: Store
    others: list[Store] = field(default_factory=list)

    def open(self) -> Store:
        """Another store on the same database (another process's connection), same clock."""
        other = self.backend.open(self.clock)
        self.others.append(other)
        return other

    def claim(self, owner: str = "w1", ttl: float = TTL, **kw: object) -> Lease:
        """One lease (ClaimRequest's fields in ``kw``), asserting there was one to claim."""
        leases = self.exchange(claim=ClaimRequest(owner, ttl, **kw)).leases  # type: ignore[arg-type]
        assert leases, "expected a claimable task"
        return leases[0]

    def lease(self, task: str = "t", payload: JSON = None, state: JSON = None,
              owner: str = "w1", **start: object) -> Lease:  # fmt: skip
        """Start a run of ``task`` and claim it."""
        self.store.start_run(task, payload, state, **start)  # type: ignore[arg-type]
        return self.claim(owner)

    def exchange(self, *commits: Commit, claim: ClaimRequest | None = None) -> BatchOutcome:
        return self.store.commit_many(commits, claim=claim)

    def commit(self, commit: Commit) -> CasResult:
        return self.exchange(commit).results[0]

    def finish(self, lease: Lease, result: JSON = None, revision: int = 0) -> CasResult:
        return self.commit(Commit(lease, "finish", expected_revision=revision, result=result))

    def zombie(self, task: str = "t") -> tuple[Lease, Lease]:
        """A lease whose ttl ran out and its successor's (another owner took the task over)."""
        old = self.lease(task, owner="zombie")
        self.clock.advance(TTL + 1)
        new = self.claim("w2")
        assert new.task_id == old.task_id and new.attempt == old.attempt + 1
        return old, new

    def refusals(self, op: str) -> list[Rejection]:
        return [r for r in self.store.fence_rejections() if r.op == op]

    def close(self) -> None:
        for other in self.others:
            other.close()
        self.store.close()
