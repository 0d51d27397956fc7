"""What lease holders call: the worker's batched exchange and renewal (what ``WorkerStore``
holds), and the pinned single-lease calls of DESIGN.md (``claim``, ``renew``, ``ack``,
``release``, ``compare_and_set``), each the N = 1 call of a batch verb (``commit_many``,
``renew_each``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import overload

from ..codec import check_owner, commit_params
from ..dialect import Dialect, Tx
from ..driver import RenewAsk
from ..errors import InvalidOption
from ..limits import UNGATED, Gating
from ..starts import placing
from ..streams import Appended, StreamBatch
from ..types import JSON, BatchOutcome, CasResult, ClaimRequest, Commit, Lease, Renewal
from . import claims
from .commits import KINDS, apply_all, rejected
from .limits import Limits
from .streams import append_in, check_batch


def check_start(start: object) -> None:
    """``ClaimRequest.start``: None (every lease begins at once) or a whole number from 0."""
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
        raise ValueError(f"a claim's start is None or a whole number from 0 (got {start!r})")


def check_ttl(ttl: object) -> float:
    """A lease's ttl: a finite number of seconds (a lease must expire: NaN or infinity would
    make one that never does, or that only one backend refuses)."""
    try:
        seconds = float(ttl)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(ttl, bool) or not math.isfinite(seconds):
        raise InvalidOption(f"a lease's ttl must be a finite number of seconds (got {ttl!r})")
    return seconds


class Leases(Limits):
    dialect: Dialect

    # -- the worker's calls --------------------------------------------------------------------
    def commit_many(
        self,
        commits: Sequence[Commit],
        *,
        claim: ClaimRequest | None = None,
        streams: Sequence[StreamBatch] = (),
    ) -> BatchOutcome:
        """Write every commit under its own lease (each a fenced write answering ok, conflict
        or lease_lost on its own) and, in the same transaction, claim up to ``claim.limit``
        tasks (B4). Every value is encoded first: a bad one writes nothing. ``streams``: stream
        batches (lease, chunks' JSON, ``after``) written first in the same transaction, each
        fenced on its own exactly as ``append_stream`` writes it (its answer in
        ``appended``): the worker's stream writer lends the exchange the batches due, so that
        its own connection writes them (B21)."""
        for _, texts, _ in streams:
            check_batch(texts)
        # the heads locked in run order (no two exchanges wait on each other in a cycle); the
        # answers in the caller's order
        order = sorted(range(len(streams)), key=lambda i: streams[i][0].run_id)
        request = claim
        while request is not None:
            check_start(request.start)
            check_ttl(request.ttl)
            request = request.also
        encoded = [commit_params(commit) for commit in commits]
        keeper = self.gatekeeper() if claim is not None and claim.limit else None
        nexts: dict[int, Gating] = {}
        # where each next task waits, if gated
        if any(KINDS[c.kind].next for c in commits if c.kind in KINDS):
            keeper = self.gatekeeper()
            for i, commit in enumerate(commits):
                if commit.kind == "spawn":  # where each child waits, if its task is gated
                    kids = keeper.runs(list(commit.children))
                    commits = [*commits[:i], dataclasses.replace(commit, children=tuple(kids)),
                               *commits[i + 1 :]]  # fmt: skip
                if KINDS[commit.kind].next:
                    name = encoded[i].name
                    got = keeper.of(name, commit.next_payload) if keeper.gated(name) else UNGATED
                    encoded[i].place(got)
                    if got.line:
                        nexts[i] = got

        def exchange(tx: Tx) -> BatchOutcome:
            answers: dict[int, Appended] = {}
            for i in order:
                lease, texts, after = streams[i]
                answers[i] = append_in(tx, lease, texts, after, lazy=False)
            appended = tuple(answers[i] for i in range(len(streams)))
            results = tuple(apply_all(tx, commits, encoded))
            placed = [g for i, g in nexts.items() if results[i] is CasResult.OK]
            if placed:  # after the settling, like it before the claim first looks at gates
                tx.place_gates(placing(placed))
            leases = claims.claim(tx, claim, keeper) if claim is not None and claim.limit else []
            return BatchOutcome(results, tuple(leases), tuple(tx.failed), appended)

        runs = (commit.lease.run_id for commit in commits)  # read only by a dialect with row locks
        out = self.dialect.write(exchange, runs=runs, intent="exchange")
        if out.leases:
            self.dialect.claimed()
        return out

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[float | None]:
        """R3 for every lease of one owner in one step (B5): each lease's new expiry,
        ``max(old, now + ttl)``, or None where that lease is lost or expired (each refusal
        recorded like any other)."""
        return [renewal.expires_at for renewal in self.renew_each(leases, ttl)]

    def renew_each(
        self, leases: Sequence[Lease], ttl: float, *, starting: Sequence[Lease] = ()
    ) -> list[Renewal]:
        """``renew_many`` that also says, for each lease renewed, whether its run is over
        (B15: cancelled under its holder, who must stop the handler and drop the task).
        ``starting``: leases among them whose handlers begin on this renewal's answer (R4's
        confirmation of a start): the database records them as begun (B3), so a lapse after
        this counts as an attempt."""
        renewed = {(lease.task_id, lease.attempt) for lease in leases}
        if any((lease.task_id, lease.attempt) not in renewed for lease in starting):
            raise ValueError("renew_each's starting leases must be among the leases it renews")
        check_ttl(ttl)
        if not leases:
            return []
        if len({lease.owner for lease in leases}) != 1:
            raise ValueError("renew_many renews the leases of one owner")
        check_owner(leases[0].owner)
        ask = RenewAsk(tuple(leases), leases[0].owner, float(ttl),
                       tuple(lease.task_id for lease in starting))  # fmt: skip

        def renew(tx: Tx) -> list[Renewal]:
            renewed = {(row.task_id, row.attempt): row for row in tx.renew_leases(ask)}
            return [
                Renewal(None)
                if (row := renewed.get((lease.task_id, lease.attempt))) is None
                else Renewal(row.expires_at, cancelled=not row.alive)
                for lease in leases
            ]

        def record(tx: Tx) -> None:  # each refusal kept, with its event, in one transaction
            for lease in lost:
                rejected(tx, lease, "renew")

        runs = [lease.run_id for lease in leases]
        renewals = self.dialect.write(renew, runs=runs, intent="statement")
        # a renewal that changed nothing for a lease wrote nothing: its refusal is recorded
        # next (the renewal is one statement on its own on PostgreSQL)
        lost = [lease for lease, r in zip(leases, renewals, strict=True) if r.expires_at is None]
        if lost:
            self.dialect.write(record, runs=[lease.run_id for lease in lost])
        return renewals

    # -- the pinned lease protocol (DESIGN.md) -----------------------------------------------
    @overload
    def claim(
        self, owner: str, ttl: float, *, max_attempts: int = 3, limit: None = None,
        queues: Sequence[str] | None = None, tasks: Sequence[str] | None = None,
    ) -> Lease | None: ...  # fmt: skip
    @overload
    def claim(
        self, owner: str, ttl: float, *, max_attempts: int = 3, limit: int,
        queues: Sequence[str] | None = None, tasks: Sequence[str] | None = None,
    ) -> list[Lease]: ...  # fmt: skip

    def claim(
        self,
        owner: str,
        ttl: float,
        *,
        max_attempts: int = 3,
        limit: int | None = None,
        queues: Sequence[str] | None = None,
        start: int | None = None,
        tasks: Sequence[str] | None = None,
    ) -> Lease | list[Lease] | None:
        """R1: claim the first ready task (or, with ``limit=k``, up to k tasks of k different
        runs) in the served ``queues`` (None: all), a higher priority first: an exchange that
        commits nothing. ``start``: how many of them begin at once (None: all; the others are
        recorded waiting, B3); ``tasks``: of runs whose next task is one of these only (None:
        any, B22)."""
        request = ClaimRequest(
            owner, ttl, max_attempts, 1 if limit is None else limit,
            None if queues is None else tuple(queues), start,
            tasks=None if tasks is None else tuple(tasks),
        )  # fmt: skip
        leases = list(self.commit_many((), claim=request).leases)
        if limit is None:
            return leases[0] if leases else None
        return leases

    def renew(self, lease: Lease, ttl: float, *, start: bool = False) -> bool:
        """R3 for one lease: ``renew_many`` of one (``start``: its handler begins on this
        answer, recorded as begun, B3)."""
        starting = [lease] if start else []
        return self.renew_each([lease], ttl, starting=starting)[0].expires_at is not None

    def release(self, lease: Lease, delay: float = 0, *, error: str | None = None) -> bool:
        """Give the task back for another attempt after ``delay``: a release commit."""
        commit = Commit(lease, "release", delay=delay, error=error)
        return self.commit_many((commit,)).results[0] is CasResult.OK

    def ack(self, lease: Lease) -> bool:
        """Mark the task done under its lease; a run whose last task is done has succeeded:
        an ack commit."""
        return self.commit_many((Commit(lease, "ack"),)).results[0] is CasResult.OK

    def compare_and_set(self, lease: Lease, expected_revision: int, new_state: JSON) -> CasResult:
        """R5: the run's state moves only at ``expected_revision`` of a live run, under the
        lease: ``ok``, ``conflict`` (the revision moved, or the run is over) or ``lease_lost``.
        A compare-and-set commit (the lease stays)."""
        commit = Commit(lease, "compare_and_set", expected_revision, new_state)
        return self.commit_many((commit,)).results[0]

    def migrate_state(self, lease: Lease, version: int, new_state: JSON) -> CasResult:
        """B25: the run's state migrated to ``version`` of its task, written under the lease
        at the revision it was claimed at, with the task's new version: ``ok``, ``conflict``
        (the revision moved) or ``lease_lost`` (refused, recorded). The lease stays."""
        commit = Commit(lease, "migrate", lease.revision, new_state, version=version)
        return self.commit_many((commit,)).results[0]
