"""The simulated world's plumbing: the virtual clock, each simulated process's link to the real
store (where faults strike), and the outside ledger the invariants are judged from.

Nothing here reads the wall clock or depends on thread scheduling: the store's clock is
``VClock.now``, a worker's own monotonic clock is a ``LocalClock`` running at its rate, and
every choice comes from the seeded ``random.Random`` of the schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workerproc.store import (
    BatchOutcome,
    CasResult,
    ClaimRequest,
    Commit,
    Lease,
    Renewal,
    Store,
    StoreError,
    StoreUnavailable,
)
from workerproc.store.streams import Appended

ENDING = ("finish", "advance", "wait", "spawn", "fail")  # a step's last word: at most once


class Violation(Exception):
    """An invariant broke: ``name`` is its name in docs/protocol.md (Invariants)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


class VClock:
    """The world's time (the database's clock): moves only when the schedule says."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class LocalClock:
    """A process's monotonic clock: it runs at ``rate`` of the world's (a slow or fast clock,
    within the documented bound) and its origin is its own."""

    def __init__(self, world: VClock, rate: float = 1.0) -> None:
        self.world = world
        self.rate = rate
        self._base_world = world.now
        self._base_local = 0.0

    def __call__(self) -> float:
        return self._base_local + (self.world.now - self._base_world) * self.rate

    def set_rate(self, rate: float) -> None:
        self._base_local, self._base_world = self(), self.world.now
        self.rate = rate


@dataclass
class Payment:
    """One call of ``fn`` in a paid call (the outside world's bill)."""

    attempt: int
    owner: str
    state: str = "paid"  # paid -> kept | used | dropped | abandoned


@dataclass
class Ledger:
    """What the outside world saw, kept apart from the database: the judge of the invariants."""

    granted: dict[tuple[int, int], float] = field(default_factory=dict)  # (task, attempt) -> exp
    latest: dict[int, int] = field(default_factory=dict)  # task -> latest attempt claimed
    recorded: set[tuple[int, int]] = field(default_factory=set)  # attempts recorded as begun
    retry_base: dict[int, int] = field(default_factory=dict)  # task -> latest attempt at retry
    ends: dict[int, int] = field(default_factory=dict)  # task -> accepted last words
    payments: dict[tuple[int, int, str], list[Payment]] = field(default_factory=dict)
    signals: dict[int, int] = field(default_factory=dict)  # signal number -> run it went to
    resumed: dict[int, int] = field(default_factory=dict)  # signal number -> task it resumed
    spawned: dict[int, tuple[int, ...]] = field(default_factory=dict)  # join task -> children
    runs: set[int] = field(default_factory=set)
    events: list[int] = field(default_factory=list)  # event ids, as read after each step
    tasks_of_run: dict[int, set[int]] = field(default_factory=dict)
    owners: dict[tuple[int, int], str] = field(default_factory=dict)  # (task, attempt) -> owner
    names: dict[int, str] = field(default_factory=dict)  # task -> its name
    dropped: set[tuple[int, int]] = field(default_factory=set)  # live leases a retry dropped
    # runs' streams (``streams``): what was read so far, and what each attempt wrote
    stream_seen: dict[int, int] = field(default_factory=dict)  # run -> last offset read
    stream_last: dict[int, tuple[int, int]] = field(default_factory=dict)  # run -> (step, attempt)
    stream_written: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # task -> attempt whose word stood
    run_of: dict[int, int] = field(default_factory=dict)  # task -> its run

    def started_since_retry(self, task_id: int) -> int:
        base = self.retry_base.get(task_id, 0)
        return sum(1 for t, a in self.recorded if t == task_id and a > base)


Check = Callable[[], None]


@dataclass
class Fault:
    """A fault waiting for a process's next store call: ``before`` (the connection is lost,
    or the lock wait times out, before the call reaches the database) or ``after`` (the call
    landed, its answer is lost)."""

    kind: str  # lost | locked | answer-lost


class Link:
    """One simulated process's connection to the real store: every call goes through here, so
    a fault can strike it and the ledger sees what the database answered."""

    def __init__(self, store: Store, clock: VClock, ledger: Ledger, owner: str) -> None:
        self.store = store
        self.clock = clock
        self.ledger = ledger
        self.owner = owner
        self.fault: Fault | None = None

    def _strike(self, landed: bool) -> None:
        fault = self.fault
        if fault is None:
            return
        if landed != (fault.kind == "answer-lost"):
            return
        self.fault = None
        if fault.kind == "locked":
            raise StoreError("database is locked (simulated lock timeout)")
        raise StoreUnavailable("connection lost (simulated)")

    def call(self, fn: Callable[[], Any]) -> Any:
        self._strike(False)
        out = fn()
        self._strike(True)
        return out

    # -- what the worker's real code calls ------------------------------------------------------
    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        self._strike(False)
        out = self.store.commit_many(commits, claim=claim)
        self.judge_commits(commits, out)
        self._strike(True)
        return out

    def renew_each(
        self, leases: Sequence[Lease], ttl: float, *, starting: Sequence[Lease] = ()
    ) -> list[Renewal]:
        self._strike(False)
        out = self.store.renew_each(leases, ttl, starting=starting)
        for lease, r in zip(leases, out, strict=True):
            if r.expires_at is not None:
                self.grant(lease, r.expires_at)
        for lease in starting:
            r = out[[x.fence for x in leases].index(lease.fence)]
            if r.expires_at is not None:
                self.ledger.recorded.add((lease.task_id, lease.attempt))
        self._strike(True)
        return out

    def append_stream(self, lease: Lease, texts: list[str], after: int | None) -> Appended:
        from . import streams  # noqa: PLC0415 - (it judges with this module's ledger)

        self._strike(False)
        out = self.store.append_stream(lease, texts, after=after)
        streams.judge(self.store, self.ledger, lease, out, self.clock.now)
        self._strike(True)
        return out

    def get_run(self, run_id: int) -> Any:
        return self.call(lambda: self.store.get_run(run_id))

    def begin_call(self, lease: Lease, key: Any, unknown: Any = "pay") -> Any:
        return self.call(lambda: self.store.begin_call(lease, key, unknown))

    def keep_call(self, lease: Lease, key: Any, result: Any, tokens: int | None = None, *,
                  cost: float | None = None, intent: int | None = None) -> Any:  # fmt: skip
        return self.call(lambda: self.store.keep_call(lease, key, result, tokens, cost=cost,
                                                      intent=intent))  # fmt: skip

    def close(self) -> None:
        """The link is the simulation's: the store outlives every simulated process."""

    # -- the ledger's side ---------------------------------------------------------------------
    def grant(self, lease: Lease, expires: float) -> None:
        key = (lease.task_id, lease.attempt)
        self.ledger.granted[key] = max(self.ledger.granted.get(key, 0.0), expires)

    def judge_commits(self, commits: Sequence[Commit], out: BatchOutcome) -> None:
        """R2/R5 from outside: an accepted write came from the attempt that held the task, live;
        a step's last word is accepted once; a claim takes only what no live lease holds."""
        led, now = self.ledger, self.clock.now
        for commit, result in zip(commits, out.results, strict=False):
            if result is not CasResult.OK:
                continue
            lease = commit.lease
            self.ended((lease.task_id, lease.attempt), now)
            holder = led.latest.get(lease.task_id)
            expiry = led.granted.get((lease.task_id, lease.attempt), 0.0)
            if holder != lease.attempt or expiry < now:
                raise Violation(
                    "no write by a non-holder",
                    f"task {lease.task_id}: a {commit.kind} of attempt {lease.attempt} "
                    f"({lease.owner}) was accepted; the holder is attempt {holder}, "
                    f"this lease {'lapsed' if expiry < now else 'was taken over'}",
                )
            if commit.kind in ENDING:
                led.committed[lease.task_id] = lease.attempt
                led.run_of[lease.task_id] = lease.run_id
            if commit.kind == "spawn":
                self.spawned(lease.run_id)
            if commit.kind in ENDING:
                n = led.ends[lease.task_id] = led.ends.get(lease.task_id, 0) + 1
                if n > 1:
                    name = ("a join runs once with every child" if lease.children is not None
                            else "no write by a non-holder")  # fmt: skip
                    why = f"task {lease.task_id}: its last word accepted {n} times"
                    raise Violation(name, why)
        for lease in out.leases:
            self.claimed(lease, now)
        for failure in out.failed:
            if failure.reason == "task_attempts_exhausted":
                self.exhausted(failure.run_id)

    def ended(self, fence: tuple[int, int], now: float) -> None:
        """A lease ended (its commit landed, or it was released): it holds nothing after now."""
        if self.ledger.granted.get(fence, 0.0) > now:
            self.ledger.granted[fence] = now

    def released(self, owner: str, now: float) -> None:
        """``release_owner``: every live lease of ``owner`` ends now (B1)."""
        for fence in sorted(self.ledger.owners):
            if self.ledger.owners[fence] == owner:
                self.ended(fence, now)

    def spawned(self, run_id: int) -> None:
        kids = tuple(sorted(cid for cid, _s, _t in self.store.run_children(run_id, limit=1000)))
        joins = [t.id for t in self.store.get_tasks(run_id) if t.done_at is None]
        for join in joins:
            self.ledger.spawned[join] = kids
        self.ledger.runs.update(kids)

    def claimed(self, lease: Lease, now: float) -> None:
        led = self.ledger
        before = led.latest.get(lease.task_id)
        if before is not None:
            expiry = led.granted.get((lease.task_id, before), 0.0)
            if expiry > now:
                raise Violation(
                    "at most one live holder per task",
                    f"task {lease.task_id}: attempt {lease.attempt} claimed by {lease.owner} "
                    f"while attempt {before}'s lease runs until {expiry - now:.3f} s from now",
                )
        led.latest[lease.task_id] = lease.attempt
        led.owners[(lease.task_id, lease.attempt)] = lease.owner
        led.names[lease.task_id] = lease.task
        led.tasks_of_run.setdefault(lease.run_id, set()).add(lease.task_id)
        self.grant(lease, lease.expires_at)
        if lease.started:
            led.recorded.add((lease.task_id, lease.attempt))
        spent = lease.tries - 1
        began = led.started_since_retry(lease.task_id) - (1 if lease.started else 0)
        if spent > began:
            raise Violation(
                "attempts spent only by started handlers",
                f"task {lease.task_id}: attempt {lease.attempt} is try {lease.tries}, but only "
                f"{began} handler(s) of it began since its last retry",
            )

    def exhausted(self, run_id: int) -> None:
        for task_id in sorted(self.ledger.tasks_of_run.get(run_id, ())):
            began = self.ledger.started_since_retry(task_id)
            latest = self.ledger.latest.get(task_id, 0)
            if self.ledger.ends.get(task_id):
                continue  # a step that ended (the handler's own failure on its last try, say)
            if latest > self.ledger.retry_base.get(task_id, 0) and began < MAX_ATTEMPTS:
                raise Violation(
                    "attempts spent only by started handlers",
                    f"run {run_id} failed task_attempts_exhausted, but only {began} handler(s) "
                    f"of task {task_id} began since its last retry (of {MAX_ATTEMPTS})",
                )


MAX_ATTEMPTS = 3  # every simulated task's bound
