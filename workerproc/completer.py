"""Completion: the last words of a worker's finished slots, written with its next claim.

A finished handler's commit waits in the completer's buffer (``add``); when the conductor's
policy says the batch is due, ``commit_and_claim`` writes every buffered commit (and any
hand-backs) and claims the next tasks in ONE transaction, each commit fenced on its own:

- **Single flight with the heartbeat.** The leases written stop being renewed first, and the
  call waits for a renewal in flight (``Heartbeat.untrack``), so no renewal races the commit.
  The claimed leases are held from the moment the claim was *sent* (R4's local deadline).
- **A busy database** is retried with backoff for up to a ttl; a commit that never lands is
  safe (its lease lapses and the task is taken over). A claim alone is tried once: nothing is
  lost by claiming later. Failures are told once per incident (``Outage``), not per try. A
  database that stays read-only for ``READONLY_EXIT`` ends the process (``StoreReadOnly``),
  so that a new one reopens it.
- **One slot's bad value never fails its neighbours.** A batch the store refuses as a whole
  because one of its values cannot be written (``InvalidPayload``: our checks, or the
  database's) is written again one commit at a time, and the commit that cannot be written is
  replaced by its task's failure (``unwritable``: the error recorded, released with backoff
  or, on its last attempt, failed), so the others land.
- **Failures are said.** Every run a write failed (a handler's last attempt, or what the claim
  decided: attempts spent, an undecodable payload, a task no handler has) is logged once, at
  warning level (``run_failed``).
- **Answers.** ``lease_lost`` is logged and discarded (someone else owns the task). A
  ``conflict`` (someone moved the run: an operator cancelled it, say) is settled: the task is
  dropped if the run is over, else released for another attempt, in the next batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from . import tracing
from .logs import attempt_of, event
from .outage import Outage
from .store import (
    BatchOutcome,
    CasResult,
    ClaimRequest,
    Commit,
    InvalidPayload,
    Lease,
    RunFailure,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
    WorkerStore,
)
from .store.backoff import backoff
from .store.streams import StreamBatch

log = logging.getLogger("workerproc.worker")

# A process that opened the database while it could not be written keeps a read-only view of
# it (SQLite's shared-memory index is per process) until all its connections close, the
# heartbeat's too: past this long the worker exits (STORE_ERROR) and a new process reopens it.
# At least the supervisor's crash window, so replacements never escalate its backoff.
READONLY_EXIT = 5.0
RETRY_BASE, RETRY_CAP = 0.02, 0.5  # a busy commit is retried after 20 ms, doubling to 0.5 s
SETTLED_KINDS = ("finish", "advance", "wait", "fail")  # a conflict on these is settled, not dropped


class Riders(Protocol):
    """What completion needs of the stream writer (``streaming.py::Streamer``): the batches
    due, lent to an exchange, and what it answered for them."""

    def lend(self) -> list[tuple[Any, list[str]]]: ...

    def landed(self, lent: list[tuple[Any, list[str]]], answers: tuple[Any, ...]) -> None: ...


class Renewals(Protocol):
    """What completion needs of the heartbeat (``heartbeat.py::Heartbeat``)."""

    def track(self, lease: Lease, lease_start: float) -> None: ...

    def untrack(self, leases: Iterable[Lease]) -> None: ...


def release_unwritable(commit: Commit, exc: InvalidPayload) -> Commit:
    """The plainest stand-in for a commit that cannot be written: release with the error."""
    return Commit(commit.lease, "release", error=f"InvalidPayload: {exc}")


class Completer:
    def __init__(
        self,
        store: WorkerStore,
        ttl: float,
        renewals: Renewals,
        *,
        unwritable: Callable[[Commit, InvalidPayload], Commit] = release_unwritable,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        outage: Outage | None = None,
    ) -> None:
        self.store = store
        self.outage = outage or Outage(clock)  # shared with the heartbeat: one log per incident
        self.ttl = ttl
        self.renewals = renewals
        self.unwritable = unwritable  # what to write instead of a commit that cannot be
        self.clock = clock
        self.sleep = sleep
        self.pending: list[Commit] = []  # finished, to write in the next exchange
        self.since: float | None = None  # monotonic: when the oldest of them finished
        self.readonly_since: float | None = None  # writes failing on a read-only database
        self.sent = 0.0  # monotonic: when the try that last succeeded was sent
        self.riders: Riders | None = None  # the stream writer, whose due batches ride along

    # -- the buffer -------------------------------------------------------------------------------
    def add(self, commit: Commit) -> None:
        self.pending.append(commit)
        if self.since is None:
            self.since = self.clock()

    def take(self) -> list[Commit]:
        """Every buffered commit, leaving the buffer empty."""
        commits, self.pending, self.since = self.pending, [], None
        return commits

    # -- the exchange -----------------------------------------------------------------------------
    def commit_and_claim(
        self, extra: Sequence[Commit], claim: ClaimRequest | None
    ) -> tuple[Lease, ...]:
        """Write the buffered commits and ``extra`` (hand-backs), then claim, in one
        transaction; settle what conflicted (into the buffer, for the next batch). Returns the
        leases claimed, held by the heartbeat from the moment the claim was sent."""
        commits = [*self.take(), *extra]
        # No renewal races these commits; and even with none, no claim goes out while the
        # heartbeat thread's timeout path (which may end the process) is under way.
        self.renewals.untrack([c.lease for c in commits])
        lent = self.riders.lend() if self.riders is not None else []
        answers: tuple[Any, ...] = ()
        try:
            out = self.write(commits, claim, streams=[(em.lease, batch, em.last)
                                                      for em, batch in lent])  # fmt: skip
            answers = out.appended
        finally:
            if self.riders is not None:
                self.riders.landed(lent, answers)
        sent = self.sent  # the leases' local clock starts when the claim was sent
        for i, commit in enumerate(commits):  # the steps' spans, if traced, end (their outcome)
            tracing.ended(commit, out.results[i] if i < len(out.results) else None)
        for commit, result in zip(commits, out.results, strict=False):
            if result is CasResult.LEASE_LOST:
                refused(commit)
            elif result is CasResult.CONFLICT and commit.kind in SETTLED_KINDS:
                settled = self.settle(commit)
                if settled is not None:
                    self.add(settled)
                    self.renewals.track(commit.lease, sent)
        for lease in out.leases:
            self.renewals.track(lease, sent)
        return out.leases

    def write(
        self,
        commits: Sequence[Commit],
        claim: ClaimRequest | None,
        streams: Sequence[StreamBatch] = (),
    ) -> BatchOutcome:
        """Write ``commits`` and claim, retrying while the database is busy. A claim alone is
        tried once (nothing is lost by trying again later); commits are retried for up to a
        ttl: one that never lands is safe, its lease lapses and the task is taken over. An
        outcome with no results (and no leases) says it gave up. ``sent`` is then when the
        successful try was sent: its leases' local clock starts there (R4). ``streams``:
        stream batches written in the same transaction (their answers in ``appended``; none
        when the batch had to be written another way: the stream writer writes them)."""
        extra = {"streams": streams} if streams else {}
        deadline = self.clock() + self.ttl
        tries = 0
        while True:
            started = self.clock()
            try:
                out = self.store.commit_many(commits, claim=claim, **extra)
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
                self.outage.answered()
                for failure in out.failed:
                    run_failed(failure)
                return out
            tries += 1
            self.outage.failed("commit" if commits else "claim", error)
            if not commits:
                return BatchOutcome(())  # the conductor claims again after its backoff
            if self.clock() >= deadline:
                event(
                    log,
                    "commit_gave_up",
                    f"giving up on {len(commits)} commit{'s' if len(commits) > 1 else ''} "
                    f"after {tries} tries: {error} (their leases lapse and the tasks are "
                    "taken over)",
                    level=logging.WARNING,
                    commits=len(commits),
                )
                return BatchOutcome(())
            self.sleep(backoff(tries, RETRY_BASE, RETRY_CAP))

    def _one_by_one(self, commits: Sequence[Commit], claim: ClaimRequest | None) -> BatchOutcome:
        """A batch holds a value that cannot be written: each commit on its own (so only the
        bad one is replaced), then the claim."""
        results: list[CasResult] = []
        for commit in commits:
            out = self.write([commit], None)
            if not out.results:  # gave up on it: its lease lapses, as any commit's would
                return BatchOutcome(tuple(results))
            results.append(out.results[0])
        sent = self.sent
        leases = self.write((), claim).leases if claim is not None else ()
        if not leases:
            self.sent = sent
        return BatchOutcome(tuple(results), leases)

    def _replaced(
        self, commit: Commit, exc: InvalidPayload, claim: ClaimRequest | None
    ) -> BatchOutcome:
        lease = commit.lease
        event(log, "commit_unwritable",
              f"task {lease.task_id} {attempt_of(lease)}: its {commit.kind} cannot be "
              f"written ({exc}); failing that task alone", level=logging.ERROR,
              task_id=lease.task_id, run_id=lease.run_id, attempt=lease.attempt)  # fmt: skip
        instead = self.unwritable(commit, exc)
        try:
            return self.write([instead], claim)
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


def run_failed(failure: RunFailure) -> None:
    """One line at warning level for every run this worker's writes failed: its handler's last
    attempt, or what its claim decided (attempts spent, a payload no worker can decode, a task
    no handler of the app has): the run, its task, the reason and the error's first line."""
    lines = (failure.error or "").strip().splitlines()
    error = f": {lines[0][:300]}" if lines else ""
    event(log, "run_failed",
          f"run {failure.run_id} ({failure.task}) failed: {failure.reason}{error}",
          level=logging.WARNING, run_id=failure.run_id, task=failure.task,
          reason=failure.reason, error=lines[0][:300] if lines else None)  # fmt: skip


def refused(commit: Commit) -> None:
    """The fence refused ``commit``: its lease was lost, whatever it would have written is
    discarded (the database recorded the attempt as evidence)."""
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
