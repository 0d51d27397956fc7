"""A plain-Python model of the lease protocol against the real store, driven by hypothesis.

Random interleavings of start (in two queues, at three priorities) / claim / batched claim
(``limit=k``, some queues, some leases claimed waiting) / renew / renew_many / the renewal that
records a start / ack / release / compare_and_set / advance / finish / batched commit (with
hand-backs) / release_owner / cancel / retry / clock advance with four owners. After every step
the store must equal the model, and the invariants hold: at most one live lease per task and per
run, attempts strictly increase per task, nothing acked is handed out again, a superseded lease
never changes anything, and a takeover of a lease whose handler never began spends no attempt
(B3).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pg_session
import pytest
from helpers import FakeClock
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from store_backends import advance, finish, renew_until

from workerproc.store import CasResult, ClaimRequest, Commit, Lease, Store, open_store

OWNERS = ("o1", "o2", "o3", "o4")
QUEUES = ("default", "fast")
SERVED = st.sampled_from([None, None, ("default",), ("fast",), ("fast", "default")])
MAX_ATTEMPTS = 3
ALIVE = ("pending", "running")
PICK = st.one_of(st.integers(0, 2), st.integers(0, 99))  # mostly the newest leases, any of them


@dataclass
class MTask:
    id: int
    run_id: int
    available_at: float
    owner: str | None = None
    expires: float | None = None
    attempts: int = 0
    base: int = 0
    done: bool = False
    started: bool = True  # the current lease's handler began, as the database knows (B3)


@dataclass
class MRun:
    id: int
    status: str = "pending"
    state: object = field(default_factory=dict)  # a run starts with {}
    queue: str = "default"
    priority: int = 0
    revision: int = 0
    tasks: list[MTask] = field(default_factory=list)


class LeaseProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lk-stateful-")
        self.clock = FakeClock()
        self.store = self.open_store()
        self.runs: dict[int, MRun] = {}
        self.tasks: dict[int, MTask] = {}
        self.leases: list[Lease] = []
        self.highest: dict[int, int] = {}  # task id -> highest attempt handed out
        self.acked: set[int] = set()

    def open_store(self) -> Store:
        return open_store(f"sqlite:///{self.dir}/m.db?synchronous=normal", clock=self.clock)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pick(self, i: int) -> Lease:
        return self.leases[-1 - i % len(self.leases)]

    # -- the model ----------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now

    def live(self, t: MTask) -> bool:
        return t.owner is not None and t.expires is not None and t.expires > self.now

    def shown(self, run: MRun) -> str:
        """A run's status as the store reads it: ``running`` while a live lease holds it."""
        held = any(self.live(t) for t in run.tasks if not t.done)
        return "running" if run.status == "pending" and held else run.status

    def current(self, lease: Lease) -> MTask | None:
        """The model's task if ``lease`` is its live, current lease (R2 fence), else None."""
        t = self.tasks[lease.task_id]
        ok = not t.done and t.owner == lease.owner and t.attempts == lease.attempt
        return t if ok and self.live(t) else None

    def add_task(self, run: MRun, delay: float) -> None:
        (task_id,) = {t.id for t in self.store.get_tasks(run.id)} - set(self.tasks)
        t = MTask(task_id, run.id, self.now + delay)
        run.tasks.append(t)
        self.tasks[task_id] = t

    def claimable(self, queues: tuple[str, ...] | None = None) -> list[MTask]:
        """Each claimable run's first task, a higher priority first, then R1's order."""
        out = []
        for run in self.runs.values():
            if run.status not in ALIVE or any(self.live(t) for t in run.tasks if not t.done):
                continue
            if queues is not None and run.queue not in queues:
                continue
            ready = [t for t in run.tasks if not t.done and t.available_at <= self.now]
            if ready:  # created_at follows id here
                out.append(min(ready, key=lambda t: (t.available_at, t.id)))
        return sorted(out, key=lambda t: (-self.runs[t.run_id].priority, t.available_at, t.id))

    def snapshot(self) -> list[object]:
        return [(self.store.get_run(r), self.store.get_tasks(r)) for r in self.runs]

    def check_stale(self, lease: Lease, call: object, refused: object) -> bool:
        """For a superseded lease: the call is refused and changes nothing. True if handled."""
        if self.current(lease) is not None:
            return False
        event("superseded lease refused")
        before = self.snapshot()
        assert call() == refused  # type: ignore[operator]
        assert self.snapshot() == before
        return True

    # -- rules --------------------------------------------------------------------------------
    @initialize(n=st.integers(1, 4))
    def some_runs(self, n: int) -> None:
        for _ in range(n):
            self.start(0.0)

    @rule(
        delay=st.sampled_from([0.0, 0.0, 3.0]),
        queue=st.sampled_from(QUEUES),
        priority=st.sampled_from([0, 0, 1, -1]),
    )
    def start(self, delay: float, queue: str = "default", priority: int = 0) -> None:
        run_id = self.store.start_run("step", {"d": delay}, delay=delay, queue=queue,
                                      priority=priority)  # fmt: skip
        run = MRun(run_id, queue=queue, priority=priority)
        self.runs[run.id] = run
        self.add_task(run, delay)

    @rule(owner=st.sampled_from(OWNERS), ttl=st.sampled_from([2.0, 5.0, 10.0]))
    def claim(self, owner: str, ttl: float) -> None:
        self.claim_one(owner, ttl)

    @rule(ttl=st.sampled_from([2.0, 5.0]))
    def every_owner_claims(self, ttl: float) -> None:
        for owner in OWNERS:
            self.claim_one(owner, ttl)

    def model_claim(
        self, owner: str, ttl: float, k: int, queues: tuple[str, ...] | None = None,
        start: int | None = None,
    ) -> list[MTask]:  # fmt: skip
        expected: list[MTask] = []
        for t in self.claimable(queues):
            if len(expected) == k:
                break
            if t.owner is not None and not t.started:  # B3: it never began, it spent nothing
                t.base += 1
                event("takeover of a lease that never began")
            # a lease taken over from the claimer itself waits for its older handler (B3)
            t.started = (start is None or len(expected) < start) and t.owner != owner
            t.attempts += 1
            run = self.runs[t.run_id]
            if t.attempts - t.base > MAX_ATTEMPTS:  # R6: fail the run, go on to the next
                t.owner = t.expires = None
                run.status = "failed"
                event("claim failed an exhausted run (R6)")
                continue
            t.owner, t.expires = owner, self.now + ttl  # a live lease: the run reads running
            expected.append(t)
        return expected

    def check_leases(self, leases: list[Lease], expected: list[MTask]) -> None:
        got = sorted((lease.task_id, lease.attempt, lease.expires_at) for lease in leases)
        assert got == sorted((t.id, t.attempts, t.expires) for t in expected)
        assert len({lease.run_id for lease in leases}) == len(leases), "two leases in one run"
        began = {t.id: t.started for t in expected}
        for lease in leases:
            assert lease.started == began[lease.task_id]
            assert lease.task_id not in self.acked, "an acked task was handed out again"
            assert lease.attempt > self.highest.get(lease.task_id, 0), "attempts must increase"
            self.highest[lease.task_id] = lease.attempt
            run = self.runs[lease.run_id]
            assert (lease.revision, lease.state) == (run.revision, run.state)
            self.leases.append(lease)

    def claim_one(self, owner: str, ttl: float) -> None:
        expected = self.model_claim(owner, ttl, 1)
        lease = self.store.claim(owner, ttl, max_attempts=MAX_ATTEMPTS)
        if not expected:
            assert lease is None
            return
        assert lease is not None
        t = expected[0]
        event("claim: takeover" if t.attempts - t.base > 1 else "claim: fresh")
        self.check_leases([lease], expected)

    @rule(
        owner=st.sampled_from(OWNERS),
        ttl=st.sampled_from([2.0, 5.0]),
        k=st.integers(1, 5),
        queues=SERVED,
        start=st.sampled_from([None, None, 0, 1, 2]),
    )
    def claim_batch(
        self, owner: str, ttl: float, k: int, queues: tuple[str, ...] | None, start: int | None
    ) -> None:
        expected = self.model_claim(owner, ttl, k, queues, start)
        leases = self.store.claim(owner, ttl, max_attempts=MAX_ATTEMPTS, limit=k, queues=queues,
                                  start=start)  # fmt: skip
        event(f"batch claim: {len(leases)} of {k}")
        self.check_leases(leases, expected)

    @precondition(lambda self: self.leases)
    @rule(picks=st.lists(PICK, min_size=1, max_size=4), ttl=st.sampled_from([1.0, 5.0]))
    def renew_many(self, picks: list[int], ttl: float) -> None:
        owner = self.pick(picks[0]).owner
        leases = list({lease.task_id: lease for i in picks
                       if (lease := self.pick(i)).owner == owner}.values())  # fmt: skip
        expected: list[float | None] = []
        for lease in leases:
            t = self.current(lease)
            if t is None:
                expected.append(None)
                continue
            assert t.expires is not None
            t.expires = max(t.expires, self.now + ttl)
            expected.append(t.expires)
        assert self.store.renew_many(leases, ttl) == expected

    @precondition(lambda self: self.leases)
    @rule(
        picks=st.lists(
            st.tuples(PICK, st.sampled_from(["finish", "advance", "release", "handback"]),
                      st.sampled_from([0, 0, -1])),
            min_size=1, max_size=3,
        ),
        owner=st.sampled_from(OWNERS),
        k=st.integers(0, 3),
        start=st.sampled_from([None, None, 0, 1]),
    )  # fmt: skip
    def commit_batch(
        self, picks: list[tuple[int, str, int]], owner: str, k: int, start: int | None
    ) -> None:
        """Several fenced writes and a claim in one transaction, each answered on its own."""
        commits: list[Commit] = []
        expected: list[CasResult] = []
        for i, kind, off in picks:
            lease = self.pick(i)
            rev = lease.revision + off
            commits.append(Commit(lease, kind, expected_revision=rev,  # type: ignore[arg-type]
                                  new_state={"b": i}, next_task="next"))  # fmt: skip
            expected.append(self.model_commit(lease, kind, rev, {"b": i}))
        request = ClaimRequest(owner, 5.0, MAX_ATTEMPTS, limit=k, start=start)
        out = self.store.commit_many(commits, claim=request)
        assert list(out.results) == expected
        for commit, result in zip(commits, expected, strict=True):
            if result is CasResult.OK and commit.kind == "advance":
                self.add_task(self.runs[commit.lease.run_id], 0.0)
        claimed = self.model_claim(owner, 5.0, k, start=start)  # after the writes, same tx
        event(f"batch commit of {len(commits)}, claim {len(out.leases)} of {k}")
        self.check_leases(list(out.leases), claimed)

    def model_commit(self, lease: Lease, kind: str, rev: int, state: object) -> CasResult:
        t = self.current(lease)
        if t is None:
            return CasResult.LEASE_LOST
        run = self.runs[t.run_id]
        if kind == "release":
            t.owner = t.expires = None
            t.available_at = self.now
            return CasResult.OK
        if kind == "handback":  # the attempt budget is not spent; the token moved on
            t.owner = t.expires = None
            t.base += 1
            event("handback")
            return CasResult.OK
        if run.status not in ALIVE or run.revision != rev:
            return CasResult.CONFLICT
        run.state, run.revision = state, run.revision + 1
        self.finish_task(t)
        if kind == "finish":
            run.status = "succeeded"
        return CasResult.OK

    @precondition(lambda self: self.leases)
    @rule(i=PICK, ttl=st.sampled_from([1.0, 5.0]))
    def confirm_start(self, i: int, ttl: float) -> None:
        """R4's renewal before a waiting lease begins: it records the start (B3)."""
        lease = self.pick(i)
        if self.check_stale(lease, lambda: self.store.renew(lease, ttl, start=True), False):
            return
        t = self.tasks[lease.task_id]
        assert t.expires is not None
        t.expires, t.started = max(t.expires, self.now + ttl), True
        assert self.store.renew(lease, ttl, start=True) is True

    @precondition(lambda self: self.leases)
    @rule(i=PICK, ttl=st.sampled_from([1.0, 5.0, 20.0]))
    def renew(self, i: int, ttl: float) -> None:
        lease = self.pick(i)
        if self.check_stale(lease, lambda: renew_until(self.store, lease, ttl), None):
            return
        t = self.tasks[lease.task_id]
        assert t.expires is not None
        t.expires = max(t.expires, self.now + ttl)
        assert renew_until(self.store, lease, ttl) == t.expires

    def finish_task(self, t: MTask) -> None:
        t.done, t.owner, t.expires = True, None, None
        self.acked.add(t.id)

    @precondition(lambda self: self.leases)
    @rule(i=PICK)
    def ack(self, i: int) -> None:
        lease = self.pick(i)
        if self.check_stale(lease, lambda: self.store.ack(lease), False):
            return
        t = self.tasks[lease.task_id]
        self.finish_task(t)
        run = self.runs[t.run_id]
        if run.status in ALIVE and all(x.done for x in run.tasks):
            run.status = "succeeded"
        assert self.store.ack(lease) is True

    @precondition(lambda self: self.leases)
    @rule(i=PICK, delay=st.sampled_from([0.0, 2.0]))
    def release(self, i: int, delay: float) -> None:
        lease = self.pick(i)
        if self.check_stale(lease, lambda: self.store.release(lease, delay), False):
            return
        t = self.tasks[lease.task_id]
        t.owner, t.expires, t.available_at = None, None, self.now + delay
        assert self.store.release(lease, delay) is True

    @precondition(lambda self: self.leases)
    @rule(
        i=PICK,
        kind=st.sampled_from(["cas", "advance", "finish"]),
        off=st.sampled_from([0, 0, -1, 1]),
        value=st.integers(0, 9),
        delay=st.sampled_from([0.0, 2.0]),
    )
    def write(self, i: int, kind: str, off: int, value: int, delay: float) -> None:
        lease = self.pick(i)
        expected_rev = lease.revision + off
        calls = {
            "cas": lambda: self.store.compare_and_set(lease, expected_rev, {"v": value}),
            "advance": lambda: advance(self.store, lease, expected_rev, {"v": value}, "next",
                                                  delay=delay),
            "finish": lambda: finish(self.store, lease, expected_rev, {"v": value}),
        }  # fmt: skip
        if self.check_stale(lease, calls[kind], CasResult.LEASE_LOST):
            return
        t = self.tasks[lease.task_id]
        run = self.runs[t.run_id]
        expected = CasResult.CONFLICT
        if run.status in ALIVE and run.revision == expected_rev:
            expected = CasResult.OK
            run.state, run.revision = {"v": value}, run.revision + 1
            if kind != "cas":
                self.finish_task(t)
            if kind == "finish":
                run.status = "succeeded"
        event(f"{kind}: {expected}")
        assert calls[kind]() is expected
        if expected is CasResult.OK and kind == "advance":
            self.add_task(run, delay)

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 5.0, 11.0]))
    def tick(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule(owner=st.sampled_from(OWNERS))
    def release_owner(self, owner: str) -> None:
        dead = [t for t in self.tasks.values() if t.owner == owner and self.live(t)]
        for t in dead:
            t.expires = self.now
        assert self.store.release_owner(owner) == len(dead)

    @precondition(lambda self: self.runs)
    @rule(i=PICK, retry=st.booleans())
    def operator(self, i: int, retry: bool) -> None:
        run = list(self.runs.values())[i % len(self.runs)]
        if not retry:
            ok = run.status in ALIVE
            run.status = "cancelled" if ok else run.status
            assert self.store.cancel_run(run.id) is ok
            return
        pending = [t for t in run.tasks if not t.done]
        ok = run.status in ("failed", "cancelled") and bool(pending)
        if ok:
            run.status = "pending"
            # B2: a lease the retry dropped holds the new generation back until it would expire
            held = [t.expires for t in pending if t.owner is not None and t.expires is not None]
            due = max([self.now, *held])
            for t in pending:
                t.base, t.available_at, t.owner, t.expires = t.attempts, due, None, None
        assert self.store.retry_run(run.id) is ok

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def store_equals_model(self) -> None:
        for run in self.runs.values():
            got = self.store.get_run(run.id)
            assert got is not None
            assert (got.status, got.state, got.revision) == (
                self.shown(run),
                run.state,
                run.revision,
            )
            tasks = self.store.get_tasks(run.id)
            assert [(t.id, t.lease_owner, t.lease_expires_at, t.attempts, t.attempt_base,
                     t.done_at is not None, t.available_at) for t in tasks] == [
                (m.id, m.owner, m.expires, m.attempts, m.base, m.done, m.available_at)
                for m in run.tasks
            ]  # fmt: skip

    @invariant()
    def one_live_lease_per_task_and_run(self) -> None:
        per_task: dict[int, int] = {}
        for lease in self.leases:
            if self.current(lease) is not None:
                per_task[lease.task_id] = per_task.get(lease.task_id, 0) + 1
        assert all(n == 1 for n in per_task.values())
        for run in self.runs.values():
            assert sum(1 for t in run.tasks if self.live(t) and not t.done) <= 1

    @invariant()
    def stats_agree(self) -> None:
        if not self.runs:
            return
        st_ = self.store.stats()
        live = [
            t for t in self.tasks.values() if not t.done and self.runs[t.run_id].status in ALIVE
        ]
        assert st_.leased == sum(1 for t in live if self.live(t))
        assert st_.pending_work == len(live)
        ready = {  # when each run may next be claimed: its head, or later its lease's expiry
            r: max([min(t.available_at for t in live if t.run_id == r)]
                   + [t.expires for t in live if t.run_id == r and t.expires is not None])
            for r in {t.run_id for t in live}
        }  # fmt: skip
        # a moment already past only says "claimable now": every past value is now
        assert self.due(self.store.next_ready_at()) == self.due(min(ready.values(), default=None))
        for queue in QUEUES:
            mine = [at for r, at in ready.items() if self.runs[r].queue == queue]
            assert self.due(self.store.next_ready_at([queue])) == self.due(min(mine, default=None))

    def due(self, at: float | None) -> float | None:
        return None if at is None else max(at, self.now)


class PostgresLeaseProtocol(LeaseProtocol):
    """The same machine on PostgreSQL: one schema, emptied before every example."""

    url: str | None = None

    def open_store(self) -> Store:
        cls = PostgresLeaseProtocol
        if cls.url is None:
            cls.url = pg_session.schema_url("sm")
            open_store(cls.url).close()  # creates the schema
        pg_session.truncate(cls.url)
        return open_store(cls.url, clock=self.clock)


EXAMPLES = int(os.environ.get("LK_STATEFUL_EXAMPLES", "100"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LeaseProtocol.TestCase.settings = SETTINGS
# a network round trip per call: fewer examples keep the suite's time in bounds
PostgresLeaseProtocol.TestCase.settings = settings(SETTINGS, max_examples=max(1, EXAMPLES // 2))
# hypothesis runs every example inside one test: bound the whole machine generously, as a loaded
# 2-core CI machine needs (it takes about a minute there, near the suite's 120 s default)
TestLeaseProtocol = pytest.mark.timeout(360)(LeaseProtocol.TestCase)
# the PostgreSQL twin (40 s on two cores) runs in scripts/test-e2e; the SQLite model stays here
TestLeaseProtocolPostgres = pytest.mark.e2e(
    pytest.mark.timeout(360)(PostgresLeaseProtocol.TestCase)
)
