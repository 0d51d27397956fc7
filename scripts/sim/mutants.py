"""Known bugs the simulator must see (``--mutant NAME``): each is a subclass of the real store or
of the simulated worker, made here; the product's code carries no switch for any of them.

- ``fence-off``: commits ignore the attempt (each is written under whoever holds the task now).
- ``renew-expired``: an expired lease renews (a refused renewal answers a new expiry).
- ``start-early``: a handler starts before its lease is confirmed (the start rule always says
  "now", a prefetched lease never renewed first).
- ``gate-drift``: a retry forgets the gate (``retry_run`` without its line's reopening).
- ``keep-late``: the keep is skipped for one call (each process's first paid call returns its
  answer unkept).
- ``signal-twice``: a signal resumes twice (a run's resumed signal is handed again to its next
  resumed task).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workerproc.policy import Start
from workerproc.store import (
    BatchOutcome,
    ClaimRequest,
    Commit,
    Lease,
    Renewal,
    Signal,
    Store,
)
from workerproc.store.calls import KeptCall

from .worker import Exec, SimWorker


class FenceOff(Store):
    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        fenced = []
        for commit in commits:
            task = self.get_task(commit.lease.task_id)
            if task is not None and task.lease_owner is not None:
                lease = dataclasses.replace(commit.lease, owner=task.lease_owner,
                                            attempt=task.attempts)  # fmt: skip
                commit = dataclasses.replace(commit, lease=lease)
            fenced.append(commit)
        return super().commit_many(fenced, claim=claim)


class RenewExpired(Store):
    def renew_each(
        self, leases: Sequence[Lease], ttl: float, *, starting: Sequence[Lease] = ()
    ) -> list[Renewal]:
        answers = super().renew_each(leases, ttl, starting=starting)
        now = self.now()
        return [Renewal(now + ttl) if a.expires_at is None else a for a in answers]


class GateDrift(Store):
    def retry_run(self, run_id: int) -> bool:
        real = self.dialect.write

        def write(fn: Callable[[Any], Any], **kw: Any) -> Any:
            return real(lambda tx: fn(_Forgetful(tx)), **kw)

        self.dialect.write = write  # type: ignore[method-assign]
        try:
            return super().retry_run(run_id)
        finally:
            del self.dialect.write


class _Forgetful:
    """A transaction that never reopens a run's line (what retry did before lines reopened):
    neither the driver's ``reopen_runs`` verb nor a ``REOPEN_RUN`` statement reaches it."""

    def __init__(self, tx: Any) -> None:
        self._tx = tx

    def count(self, name: str, params: Any) -> int:
        return 0 if name == "REOPEN_RUN" else int(self._tx.count(name, params))

    def reopen_runs(self, run_ids: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


class SignalTwice(Store):
    def __init__(self, dialect: Any) -> None:
        super().__init__(dialect)
        self.resumed: dict[int, Signal] = {}

    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        out = super().commit_many(commits, claim=claim)
        leases = []
        for lease in out.leases:
            if lease.signal is not None:
                self.resumed[lease.run_id] = lease.signal
            elif lease.task == "resume" and lease.run_id in self.resumed:
                lease = dataclasses.replace(lease, signal=self.resumed[lease.run_id])
            leases.append(lease)
        return dataclasses.replace(out, leases=tuple(leases))


class StartEarly(SimWorker):
    def decide(self, confirmed: float | None, recorded: bool) -> Start:
        return Start.DROP if confirmed is None else Start.NOW


class KeepLate(SimWorker):
    skipped = False

    def keep_answer(self, ex: Exec) -> KeptCall:
        if not self.skipped:
            self.skipped = True
            return KeptCall(ex.answer, ex.lease.attempt, None, "kept")
        return super().keep_answer(ex)


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    store: type[Store] = Store
    worker: type[SimWorker] = SimWorker


MUTANTS = {
    m.name: m
    for m in (
        Mutant("fence-off", "commits ignore the attempt", store=FenceOff),
        Mutant("renew-expired", "an expired lease renews", store=RenewExpired),
        Mutant("start-early", "a handler starts before its lease is confirmed", worker=StartEarly),
        Mutant("gate-drift", "a retry forgets the gate", store=GateDrift),
        Mutant("keep-late", "the keep is skipped for one call", worker=KeepLate),
        Mutant("signal-twice", "a signal resumes twice", store=SignalTwice),
    )
}
