"""An in-process worker on a real SQLite store that counts its conversations with the store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from helpers import Drains

from workerproc import App
from workerproc.config import WorkerConfig
from workerproc.store import BatchOutcome, ClaimRequest, Commit, Store, open_store
from workerproc.worker import Worker


class Spy(Store):
    """The real store, counting the conversations: every commit_many and what it asked."""

    def __init__(self, db: str) -> None:
        super().__init__(open_store(db).dialect)
        self.exchanges: list[tuple[int, int]] = []  # (commits written, leases asked for)

    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        self.exchanges.append((len(commits), claim.limit if claim else 0))
        return super().commit_many(commits, claim=claim)


def config(db: str, **kw: Any) -> WorkerConfig:
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("lease_ttl", 30.0)
    return WorkerConfig(db=db, app="tests:app", **kw)


def worker(db: str, app: App, cls: type[Worker] = Drains, **kw: Any) -> tuple[Worker, Spy]:
    store = Spy(db)
    return cls(store, app, config(db, **kw), owner="host:1:1.00:w",
               open_store=lambda: open_store(db)), store  # fmt: skip
