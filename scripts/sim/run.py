"""One schedule, run: the actions a seed draws, played against the real store and the simulated
workers, the invariants checked after every action, then a quiet end (no faults, time runs on)
after which every run must have ended or wait for a named reason."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workerproc.store import Lease, Store, StoreError
from workerproc.store.calls import KeptCall
from workerproc.store.errors import RunNotFound, RunOver
from workerproc.store.protocol import claims
from workerproc.store.protocol.limits import REFRESH, Gatekeeper

from . import checks, handlers, streams
from .worker import TTL, Exec, SimWorker
from .world import Fault, Ledger, Link, LocalClock, Payment, VClock, Violation

WORKERS = 3
MAX_RUNS = 8
STEPS = 60
FOREVER = 86_400.0  # a wait longer than this is for ever (WAIT_FOREVER is a century)
QUIET_ROUNDS, QUIET_TICK = 150, 2.0  # the quiet end: at most 300 s of simulated time
Action = tuple[str, int, int]
ACTIONS: tuple[tuple[str, int], ...] = (  # (kind, weight)
    ("enqueue", 6), ("exchange", 14), ("start", 6), ("step", 22), ("beat", 8), ("tick", 10),
    ("pause", 3), ("kill", 2), ("fault", 4), ("skew", 1), ("cancel", 1), ("retry", 2),
    ("signal", 4), ("release_owner", 1), ("set_limit", 1), ("prune", 1),
)  # fmt: skip
TICKS = (0.05, 0.5, 2.0, 4.0, TTL + 1, handlers.WAIT_TIMEOUT + 1)
PAUSES = (0.5, 3.0, TTL / 2, TTL + 2, 3 * TTL)
RATES = (0.999, 1.0, 1.001)  # a process clock's rate: twice the kernel's largest slew (500 ppm)
FAULTS = ("lost", "locked", "answer-lost")
OUTSIDE = ("tick", "kill", "cancel", "retry", "signal", "release_owner", "set_limit", "prune")


def draw(seed: int, steps: int = STEPS) -> list[Action]:
    """The schedule a seed draws: each action with two small numbers, read against the world
    when it is played (a worker, a run, a length), so any subset of it still plays."""
    rng = random.Random(seed)
    kinds = [k for k, _ in ACTIONS]
    weights = [w for _, w in ACTIONS]
    return [(rng.choices(kinds, weights)[0], rng.randrange(1000), rng.randrange(1000))
            for _ in range(steps)]  # fmt: skip


class SimGatekeeper(Gatekeeper):
    """The store's cache of the limits' declarations and pauses, trusted for ``REFRESH``
    seconds of the simulated clock (the store's own counts them on the wall clock, which a
    schedule's result must not depend on)."""

    def __init__(self, clock: VClock) -> None:
        super().__init__()
        self.clock = clock
        self.read_virtual = -1e18

    def stale(self) -> bool:
        return self.clock.now - self.read_virtual > REFRESH

    def learn(self, options: Any, specs: Any) -> None:
        super().learn(options, specs)
        self.read_virtual = self.clock.now


@dataclass
class Result:
    seed: int
    violation: Violation | None
    played: list[str]


Opener = Callable[[VClock], Store]


class Simulation:
    worker_default: type[SimWorker] = SimWorker
    store_default: type[Store] = Store

    def __init__(
        self, seed: int, opener: Opener, worker_class: type[SimWorker] = SimWorker,
        store_class: type[Store] = Store,
    ) -> None:  # fmt: skip
        self.seed = seed
        self.clock = VClock()
        claims._turns = itertools.count()  # gated runs or the others first: replayable
        random.seed(seed)  # the product's jitter (store/backoff.py) draws from the module's
        self.store = opener(self.clock)
        if store_class is not Store:  # a mutant's store: the same database, a planted bug
            self.store = store_class(self.store.dialect)
        self.store._gatekeeper = SimGatekeeper(self.clock)
        self.ledger = Ledger()
        self.worker_class = worker_class
        self.generation = itertools.count()
        self.workers = [self.new_worker(i) for i in range(WORKERS)]
        self.ops = Link(self.store, self.clock, self.ledger, "operator")
        self.runs_started = 0
        self.signals = itertools.count(1)
        self.played: list[str] = []
        self.dead: list[str] = []  # killed processes the supervisor has not reaped yet

    def new_worker(self, i: int) -> SimWorker:
        owner = f"w{i}.{next(self.generation)}"
        link = Link(self.store, self.clock, self.ledger, owner)
        return self.worker_class(owner, link, LocalClock(self.clock), self.seed)

    # -- playing ---------------------------------------------------------------------------------
    def play(self, actions: Sequence[Action]) -> Result:
        try:
            for action in actions:
                self.act(action)
                self.check(lines=action[0] in OUTSIDE)
            self.quiet_end()
            checks.at_end(self.store, self.ledger)
            streams.at_end(self.store, self.ledger)
        except Violation as v:
            return Result(self.seed, v, self.played)
        finally:
            self.store.close()
        return Result(self.seed, None, self.played)

    def check(self, lines: bool = True) -> None:
        now = self.clock.now
        checks.holders(self.workers, self.ledger, now)
        checks.after_step(self.store, self.ledger, now, lines)

    def act(self, action: Action) -> None:
        kind, a, b = action
        w = self.workers[a % WORKERS]
        self.played.append(f"{self.clock.now - 1_000_000:9.2f} {kind} {a} {b}")
        if kind in ("exchange", "start", "step", "beat") and w.paused_until > self.clock.now:
            return  # a paused process does nothing
        with contextlib.suppress(StoreError):  # a fault its own code did not absorb: it goes on
            self.move(kind, a, b, w)

    def move(self, kind: str, a: int, b: int, w: SimWorker) -> None:
        if kind == "enqueue" and self.runs_started < MAX_RUNS:
            task = handlers.ROOTS[b % len(handlers.ROOTS)]
            delay = (0.0, 0.0, 3.0)[a % 3]
            run_id = self.ops.call(lambda: self.store.start_run(task, {"waits": 0}, delay=delay))
            self.ledger.runs.add(run_id)
            self.runs_started += 1
        elif kind == "exchange":
            w.exchange(self.on_start)
        elif kind == "start":
            w.start(self.on_start)
        elif kind == "step":
            w.step(b, self)
        elif kind == "beat":
            w.heartbeat(PAUSES[b % len(PAUSES)] if b % 7 == 0 else 0.0)
        elif kind == "tick":
            self.clock.advance(TICKS[b % len(TICKS)])
        elif kind == "pause":
            w.paused_until = self.clock.now + PAUSES[b % len(PAUSES)]
        elif kind == "kill":
            self.kill(a % WORKERS, release=b % 2 == 0)
        elif kind == "fault":
            w.link.fault = Fault(FAULTS[b % len(FAULTS)])
        elif kind == "skew":
            w.clock.set_rate(RATES[b % len(RATES)])
        else:
            self.operator(kind, a, b)

    def kill(self, i: int, release: bool) -> None:
        """SIGKILL at any step: the process's state is gone; its supervisor releases its
        leases at once (B1) or they lapse; a new process takes its place."""
        dead = self.workers[i]
        for ex in dead.running.values():
            if ex.payment is not None and ex.payment.state == "paid":
                ex.payment.state = "abandoned"
        if release:
            self.ops.call(lambda: self.store.release_owner(dead.owner))
            self.ops.released(dead.owner, self.clock.now)
        else:
            self.dead.append(dead.owner)
        self.workers[i] = self.new_worker(i)

    def pick_run(self, a: int) -> int | None:
        runs = sorted(self.ledger.runs)
        return runs[a % len(runs)] if runs else None

    def operator(self, kind: str, a: int, b: int) -> None:
        run_id = self.pick_run(a)
        store = self.store
        try:
            if kind == "cancel" and run_id is not None:
                self.ops.call(lambda: store.cancel_run(run_id))
            elif kind == "retry" and run_id is not None:
                if self.ops.call(lambda: store.retry_run(run_id)):
                    self.retried(run_id)
            elif kind == "signal" and run_id is not None:
                waiting = [
                    r
                    for r in sorted(self.ledger.runs)
                    if (run := store.get_run(r)) is not None and run.status == "waiting"
                ]
                run_id = waiting[a % len(waiting)] if waiting and b % 4 else run_id
                n = next(self.signals)
                self.ledger.signals[n] = run_id
                self.ops.call(lambda: store.signal(run_id, handlers.SIGNAL, {"sig": n}))
            elif kind == "release_owner" and self.dead:  # a late reap: B1 is for the dead only
                owner = self.dead.pop(a % len(self.dead))
                self.ops.call(lambda: store.release_owner(owner))
                self.ops.released(owner, self.clock.now)
            elif kind == "set_limit":
                self.ops.call(lambda: store.set_limit(handlers.LIMIT, concurrency=1 + b % 3))
            elif kind == "prune":
                self.ops.call(lambda: store.prune((1.0, 30.0, 300.0)[b % 3]))
        except (RunOver, RunNotFound):
            pass

    def retried(self, run_id: int) -> None:
        """A new attempt generation (B2): the ledger's counts of tries start again."""
        for task_id in sorted(self.ledger.tasks_of_run.get(run_id, ())):
            self.ledger.retry_base[task_id] = self.ledger.latest.get(task_id, 0)
            fence = (task_id, self.ledger.latest.get(task_id, 0))
            if self.ledger.granted.get(fence, 0.0) > self.clock.now:
                self.ledger.dropped.add(fence)  # its holder may run on until it hears (B2)
            self.ops.ended(fence, self.clock.now)
            self.ledger.ends.pop(task_id, None)

    # -- the quiet end ---------------------------------------------------------------------------
    def quiet_end(self) -> None:
        """No more faults or operators: every process wakes, and time runs on in small steps
        until every run has ended or waits (bounded)."""
        self.played.append("-- the quiet end: no faults, every process awake, time runs on")
        for i, w in enumerate(self.workers):
            w.paused_until = 0.0
            w.link.fault = None
            w.clock.set_rate(1.0)
            self.workers[i] = w
        for _round in range(QUIET_ROUNDS):
            for i in range(WORKERS):
                for kind in ("beat", "exchange", "start", "step", "step", "step"):
                    self.act((kind, i, 0))
                    checks.holders(self.workers, self.ledger, self.clock.now)
            self.check()
            if self.settled():
                return
            self.clock.advance(QUIET_TICK)

    def settled(self) -> bool:
        if any(w.running or w.waiting or w.completer.pending for w in self.workers):
            return False
        for run_id in sorted(self.ledger.runs):
            run = self.store.get_run(run_id)
            if run is None or run.status in checks.TERMINAL:
                continue
            if run.status == "waiting" and run.waiting_for and all(
                t.available_at > self.clock.now + FOREVER
                for t in self.store.get_tasks(run_id) if t.done_at is None
            ):  # fmt: skip
                continue  # waits for ever (a signal, its children, a resolve): a named reason
            return False
        return True

    # -- what the ledger sees happen ------------------------------------------------------------
    def on_start(self, worker: SimWorker, lease: Lease) -> None:
        checks.handler_starts(self.store, self.ledger, worker.owner, lease, self.clock.now)

    def last_word(self, worker: SimWorker, ex: Exec, commit: Any) -> None:
        """A handler's last word, buffered for the next exchange (judged when it lands)."""

    def pay(self, worker: SimWorker, ex: Exec) -> Payment:
        p = Payment(ex.lease.attempt, worker.owner)
        checks.payment(self.ledger, (ex.lease.run_id, ex.lease.task_id, ex.key.name), p)
        return p

    def streamed(self, ex: Exec, batch: list[str]) -> None:
        """A batch of ``ex``'s chunks was written (judged already, in ``Link``)."""
        fence = (ex.lease.task_id, ex.lease.attempt)
        self.ledger.stream_written.setdefault(fence, []).extend(batch)

    def kept(self, ex: Exec, kept: KeptCall) -> None:
        if ex.payment is not None:
            ex.payment.state = "kept" if kept.outcome == "kept" else "used"

    def reused(self, ex: Exec) -> None:
        """A reused answer: the call's payments before it were kept (never paid again after)."""

    def dropped(self, worker: SimWorker, ex: Exec, exc: BaseException) -> None:
        assert ex.payment is not None
        ex.payment.state = "dropped"
