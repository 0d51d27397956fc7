"""The worker's one store conversation: write the last word of every finished slot and claim for
the free ones, in one transaction; retried while the database is busy, bounded by the ttl.

One slot's bad value never fails its neighbours: a batch the store refuses as a whole because
one of its values cannot be written (``InvalidPayload``: our own checks, or the database's) is
written again one commit at a time, and the commit that cannot be written is replaced by its
task's failure (``unwritable``: the error recorded, released with backoff or, on its last
attempt, failed), so the others land."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .backoff import backoff
from .logs import event
from .store import (
    BatchOutcome,
    CasResult,
    ClaimRequest,
    Commit,
    InvalidPayload,
    Store,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
)

log = logging.getLogger("workerproc.worker")

# A process that opened the database while it could not be written keeps a read-only view of
# it (SQLite's shared-memory index is per process) until all its connections close, the
# heartbeat's too: past this long the worker exits (STORE_ERROR) and a new process reopens it.
# At least the supervisor's crash window, so replacements never escalate its backoff.
READONLY_EXIT = 5.0
RETRY_BASE, RETRY_CAP = 0.02, 0.5  # a busy commit is retried after 20 ms, doubling to 0.5 s


def _unwritable(commit: Commit, exc: InvalidPayload) -> Commit:
    return Commit(commit.lease, "release", error=f"InvalidPayload: {exc}")


@dataclass
class Exchanger:
    store: Store
    ttl: float
    # what to write instead of a commit whose values cannot be written (its task's failure)
    unwritable: Callable[[Commit, InvalidPayload], Commit] = field(default=_unwritable)
    readonly_since: float | None = None  # exchanges failing on a read-only database
    sent: float = 0.0  # monotonic: when the try that last succeeded was sent

    def exchange(self, commits: Sequence[Commit], claim: ClaimRequest | None) -> BatchOutcome:
        """Write ``commits`` and claim, retrying while the database is busy. A claim alone is
        tried once (nothing is lost by trying again later); commits are retried for up to a
        ttl: one that never lands is safe, its lease lapses and the task is taken over. An
        outcome with no results (and no leases) says it gave up. ``sent`` is then when the
        successful try was sent: its leases' local clock starts there (R4)."""
        deadline = time.monotonic() + self.ttl
        tries = 0
        while True:
            started = time.monotonic()
            try:
                out = self.store.commit_many(commits, claim=claim)
            except InvalidPayload as exc:
                if len(commits) > 1:
                    return self._one_by_one(commits, claim)
                if not commits:
                    raise  # a claim alone has no value of ours: a bug, not bad input
                return self._replaced(commits[0], exc, claim)
            except StoreCorrupt:
                raise
            except StoreReadOnly as exc:
                since = self.readonly_since = self.readonly_since or started
                if started - since >= READONLY_EXIT:
                    event(
                        log,
                        "database_read_only",
                        f"the database stayed read-only for "
                        f"{started - since:.0f}s: exiting so that a new process reopens it",
                        level=logging.ERROR,
                    )
                    raise
                error: StoreError = exc
            except StoreError as exc:
                error = exc
            else:
                self.readonly_since = None
                self.sent = started
                return out
            tries += 1
            if not commits or time.monotonic() >= deadline:
                what = "giving up on a commit" if commits else "claim failed, will retry"
                event(
                    log,
                    "commit_gave_up" if commits else "claim_failed",
                    f"{what}: {error}",
                    level=logging.WARNING,
                    commits=len(commits),
                )
                return BatchOutcome(())
            event(
                log,
                "commit_retry",
                f"commit failed, retrying: {error}",
                level=logging.WARNING,
                commits=len(commits),
                tries=tries,
            )
            time.sleep(backoff(tries, RETRY_BASE, RETRY_CAP))

    def _one_by_one(self, commits: Sequence[Commit], claim: ClaimRequest | None) -> BatchOutcome:
        """A batch holds a value that cannot be written: each commit on its own (so only the
        bad one is replaced), then the claim."""
        results: list[CasResult] = []
        for commit in commits:
            out = self.exchange([commit], None)
            if not out.results:  # gave up on it: its lease lapses, as any commit's would
                return BatchOutcome(tuple(results))
            results.append(out.results[0])
        sent = self.sent
        leases = self.exchange((), claim).leases if claim is not None else ()
        if not leases:
            self.sent = sent
        return BatchOutcome(tuple(results), leases)

    def _replaced(
        self, commit: Commit, exc: InvalidPayload, claim: ClaimRequest | None
    ) -> BatchOutcome:
        lease = commit.lease
        event(log, "commit_unwritable",
              f"task {lease.task_id} attempt {lease.attempt}: its {commit.kind} cannot be "
              f"written ({exc}); failing that task alone", level=logging.ERROR,
              task_id=lease.task_id, run_id=lease.run_id, attempt=lease.attempt)  # fmt: skip
        instead = self.unwritable(commit, exc)
        try:
            return self.exchange([instead], claim)
        except InvalidPayload as again:  # never expected: our own failure is plain text
            event(log, "commit_dropped", f"task {lease.task_id}: {again}; its lease lapses",
                  level=logging.ERROR, task_id=lease.task_id)  # fmt: skip
            return BatchOutcome(())

    def settle(self, commit: Commit) -> Commit | None:
        """Someone else moved the run under ``commit`` (an operator cancelled it, say): drop
        the task if the run is over, else give it back for another attempt. None: the lease
        will lapse and the task be retried, no harm."""
        lease = commit.lease
        try:
            run = self.store.get_run(lease.run_id)
        except StoreCorrupt:
            raise
        except StoreError as exc:
            event(
                log,
                "conflict_unsettled",
                f"cannot read run {lease.run_id} to settle a conflict: {exc}",
                level=logging.WARNING,
                run_id=lease.run_id,
            )
            return None
        terminal = run is None or run.terminal
        event(
            log,
            "run_moved",
            f"run {lease.run_id} moved under task {lease.task_id}: "
            f"{'dropping it' if terminal else 'releasing it'}",
            run_id=lease.run_id,
            task_id=lease.task_id,
            terminal=terminal,
        )
        return Commit(lease, "drop" if terminal else "release")


def refused(commit: Commit, result: CasResult) -> None:
    if result is CasResult.LEASE_LOST:
        event(
            log,
            "commit_refused",
            f"task {commit.lease.task_id} attempt "
            f"{commit.lease.attempt}: {commit.kind} refused, lease lost; result discarded",
            level=logging.WARNING,
            task_id=commit.lease.task_id,
            attempt=commit.lease.attempt,
            op=commit.kind,
        )
