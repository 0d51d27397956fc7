"""A simulated worker process: the real decision code, stepped by the scheduler.

What is the product's own: the ``Completer`` (the fused commit-and-claim, its retries and the
settling of conflicts), the ``Policy``'s start rule (``Policy.start``, ``begin_by``: R4), the
heartbeat period (``WorkerConfig.interval``), the failure decision (``execution.failure``) and
the paid call's keep (``once.keep_answer``, retried on a fresh try). What is the simulator's:
the threads. Each of the worker's moves (an exchange, a start, a heartbeat round, one step of
one handler) is an action the scheduler picks, so any interleaving and any pause between two
moves is reachable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from workerproc import once as paid
from workerproc.completer import Completer
from workerproc.config import WorkerConfig
from workerproc.execution import failure
from workerproc.policy import Policy, Start
from workerproc.signals import Signals
from workerproc.store import ClaimRequest, Commit, Lease, StoreError
from workerproc.store.calls import KeptCall

from . import handlers, streams
from .world import Link, LocalClock, Payment

TTL = 10.0
CONCURRENCY = 2
PREFETCH = 1


@dataclass
class Held:
    """A lease the heartbeat keeps: its last confirmation (local clock) and whether the
    database counts its handler as begun."""

    lease: Lease
    confirmed: float
    recorded: bool


@dataclass
class Exec:
    """One handler execution: its plan and where it is."""

    lease: Lease
    plan: handlers.Plan
    pc: int = 0
    lost: bool = False
    cancelled: bool = False
    intent: Any = None  # the paid call's CallStart
    asked: float = 0.0
    answer: Any = None
    payment: Payment | None = None
    key: Any = None
    written: list[str] = field(default_factory=list)  # the chunks its emits wrote
    stream_end: int | None = None  # the offset its last batch ended at (None: none yet)


@dataclass
class Beat:
    """The heartbeat's book (``Renewals`` for the completer): what it holds, and when."""

    clock: LocalClock
    held: dict[tuple[int, int], Held] = field(default_factory=dict)

    def track(self, lease: Lease, lease_start: float) -> None:
        self.held[(lease.task_id, lease.attempt)] = Held(lease, lease_start, lease.started)

    def untrack(self, leases: Any, *, wait: bool = True, timeout: float = 30.0) -> None:
        for lease in leases:
            self.held.pop((lease.task_id, lease.attempt), None)


class SimWorker:
    def __init__(self, name: str, link: Link, clock: LocalClock, seed: int) -> None:
        self.owner = name
        self.link = link
        self.clock = clock
        self.seed = seed
        self.config = WorkerConfig(db="sim", app="sim", lease_ttl=TTL, concurrency=CONCURRENCY,
                                   prefetch=PREFETCH)  # fmt: skip
        self.policy = Policy(self.config, Signals(), clock=clock, rng=random.Random(seed))
        self.beat = Beat(clock)
        self.completer = Completer(link, TTL, self.beat, clock=clock, sleep=self._sleep)  # type: ignore[arg-type]
        self.waiting: list[Lease] = []
        self.running: dict[tuple[int, int], Exec] = {}
        self.paused_until = 0.0
        self.log: list[str] = []

    def _sleep(self, seconds: float) -> None:
        self.link.clock.advance(seconds)

    # -- the moves --------------------------------------------------------------------------------
    def exchange(self, on_start: Any) -> None:
        """Commit what finished and claim for the free slots (the first ``start`` begin at
        once, the rest wait: a prefetch)."""
        free = CONCURRENCY - len(self.running)
        want = max(0, free + PREFETCH - len(self.waiting))
        start = min(free, want)
        claim = ClaimRequest(self.owner, TTL, self.config.max_attempts, want, None, start=start)
        if not want and not self.completer.pending:
            return
        leases = self.completer.commit_and_claim((), claim if want else None)
        for lease in leases:
            if lease.started:
                self.begin(lease, on_start)
            else:
                self.waiting.append(lease)

    def start(self, on_start: Any) -> None:
        """The conductor's start of the next waiting lease (R4's start rule)."""
        for lease in list(self.waiting):
            if any(t == lease.task_id for t, _a in self.running):
                continue  # an older attempt of its task still runs here: it waits
            self.waiting.remove(lease)
            held = self.beat.held.get((lease.task_id, lease.attempt))
            confirmed = None if held is None else held.confirmed
            recorded = held is not None and held.recorded
            decision = self.decide(confirmed, recorded)
            if decision is Start.DROP:
                return
            if decision is not Start.NOW:
                sent = self.clock()
                try:
                    answer = self.link.renew_each([lease], TTL, starting=[lease])[0]
                except StoreError:  # not confirmed: it waits for the next turn
                    self.waiting.insert(0, lease)
                    return
                if answer.expires_at is None:  # taken over meanwhile: never starts
                    self.beat.untrack([lease])
                    return
                self.beat.track(lease, sent)
                self.beat.held[(lease.task_id, lease.attempt)].recorded = True
                confirmed = sent
            assert confirmed is not None
            if self.clock() > self.policy.begin_by(confirmed):  # too late: back unstarted
                self.completer.add(Commit(lease, "handback"))
                return
            self.begin(lease, on_start)
            return

    def decide(self, confirmed: float | None, recorded: bool) -> Start:
        return self.policy.start(confirmed, None, False, recorded)

    def begin(self, lease: Lease, on_start: Any) -> None:
        on_start(self, lease)
        self.running[(lease.task_id, lease.attempt)] = Exec(lease, handlers.plan(self.seed, lease))

    def heartbeat(self, pause: float) -> None:
        """One heartbeat round: leases past their local deadline are lost; when the oldest is
        due, every lease held is renewed (a pause may fall between the look and the send)."""
        now = self.clock()
        interval = self.config.interval
        for key, held in sorted(self.beat.held.items()):
            if now >= held.confirmed + TTL:
                self.lose(key)
        held_now = sorted(self.beat.held.items())
        if not held_now or all(now < h.confirmed + interval for _k, h in held_now):
            return
        if pause:
            self.link.clock.advance(pause)
        sent = self.clock()
        leases = [h.lease for _k, h in held_now]
        try:
            answers = self.link.renew_each(leases, TTL)
        except StoreError:
            return  # tried again soon; not a loss before the local deadline
        for (key, held), answer in zip(held_now, answers, strict=True):
            if answer.expires_at is None:
                self.lose(key)
                continue
            held.confirmed = sent
            if answer.cancelled and key in self.running:
                self.running[key].cancelled = True

    def lose(self, key: tuple[int, int]) -> None:
        held = self.beat.held.pop(key, None)
        if key in self.running:
            self.running[key].lost = True
        elif held is not None and held.lease in self.waiting:
            self.waiting.remove(held.lease)

    def step(self, i: int, world: Any) -> None:
        """One step of the ``i``-th running handler (in task order)."""
        if not self.running:
            return
        key = sorted(self.running)[i % len(self.running)]
        ex = self.running[key]
        held = self.beat.held.get(key)
        if held is not None and self.clock() >= held.confirmed + TTL:
            ex.lost = True  # its local deadline passed (the heartbeat's look would say so)
        if ex.lost:  # LeaseLost: whatever it made is discarded
            self.end(key, None, world)
            return
        if ex.cancelled:  # B15: the run was cancelled under it
            self.end(key, Commit(ex.lease, "release", error="RunCancelled"), world)
            return
        what = ex.plan.steps[ex.pc]
        ex.pc += 1
        if what == "intent":
            self.intent(key, ex, world)
        elif what == "fn":
            self.fn(key, ex, world)
        elif what == "keep":
            self.keep(key, ex, world)
        elif what == "emit":
            self.emit(ex, world)
        else:
            rng = random.Random(f"{self.seed}/word/{ex.lease.task_id}/{ex.lease.attempt}")
            self.end(key, handlers.last_word(ex.lease, ex.plan, self.config, ex.answer, rng),
                     world)  # fmt: skip

    def end(self, key: tuple[int, int], commit: Commit | None, world: Any) -> None:
        ex = self.running.pop(key)
        if ex.payment is not None and ex.payment.state == "paid":
            ex.payment.state = "abandoned"
        if commit is None:
            self.beat.untrack([ex.lease])
        else:
            world.last_word(self, ex, commit)
            self.completer.add(commit)

    # -- ctx.once, moment by moment ---------------------------------------------------------------
    def intent(self, key: tuple[int, int], ex: Exec, world: Any) -> None:
        ex.key = paid.call_key(ex.lease, "pay", {"n": ex.lease.run_id})
        ex.asked = self.clock()
        try:
            start = self.link.begin_call(ex.lease, ex.key, "pay")
        except StoreError as exc:
            self.end(key, self.fail(ex, exc), world)
            return
        if start.outcome == "reused":
            assert start.kept is not None
            ex.answer = start.kept.result
            ex.pc = len(ex.plan.steps) - 1  # straight to its last word
            world.reused(ex)
        elif start.outcome in ("lost", "over"):
            ex.lost = start.outcome == "lost"
            ex.cancelled = start.outcome == "over"
            ex.pc -= 1
        else:
            ex.intent = start

    def fn(self, key: tuple[int, int], ex: Exec, world: Any) -> None:
        left = ex.intent.left
        if left is not None and self.clock() - ex.asked >= left:  # _within_lease
            ex.lost = True
            ex.pc -= 1
            return
        ex.payment = world.pay(self, ex)
        ex.answer = {"paid_by": ex.lease.attempt, "owner": self.owner}

    def keep(self, key: tuple[int, int], ex: Exec, world: Any) -> None:
        try:
            kept: KeptCall = self.keep_answer(ex)
        except StoreError as exc:
            assert ex.payment is not None
            world.dropped(self, ex, exc)
            self.end(key, self.fail(ex, exc), world)
            return
        if kept.outcome in ("refused", "ended"):
            ex.lost = kept.outcome == "refused"
            ex.cancelled = kept.outcome == "ended"
            ex.pc -= 1
            return
        ex.answer = kept.result
        world.kept(ex, kept)

    def keep_answer(self, ex: Exec) -> KeptCall:
        return paid.keep_answer(self.link, ex.lease, ex.key, ex.answer, None, None,  # type: ignore[arg-type]
                                ex.intent.intent)  # fmt: skip

    # -- ctx.emit, a batch at a time (the stream thread's write) -----------------------------------
    def emit(self, ex: Exec, world: Any) -> None:
        batch = streams.texts(ex.lease, len(ex.written))
        try:
            out = self.link.append_stream(ex.lease, batch, ex.stream_end)
        except StoreError:
            ex.pc -= 1  # the stream thread writes the same batch again (``after``: no double)
            return
        if out.outcome == "written":
            ex.written += batch
            ex.stream_end = out.last
            world.streamed(ex, batch)
        else:  # LeaseLost (refused) or RunCancelled (its run is over) at this emit
            ex.lost = out.outcome != "over"
            ex.cancelled = out.outcome == "over"
            ex.pc -= 1

    def fail(self, ex: Exec, exc: BaseException) -> Commit:
        return failure(ex.lease, exc, self.config)
