"""Limit bookkeeping cannot drift: a plain-Python model of runs under two limits
against the real store, driven by hypothesis in random order, 500 steps an example, on both
backends.

Every operation that moves a run into or out of a limited task's line or its slots runs here:
enqueue (now or later), claim (batched, three owners), each commit kind (finish, advance, release,
hand-back, RetryAfter with and without its pause, fail, wait for a signal, spawn children and join
them, drop), expiry and takeover, a reaped owner's release, retry, cancel, signal, ``limits set``
and prune. After every step:

- the counters operators read (``store.limits()``: slots in use and runs waiting, per key) equal
  a recount of the model's leases and runs;
- no line needs ``check``'s repair (``Store.repair_lines``): no run can wait for ever;
- a claim never exceeds a cap, and a claim that returns fewer leases than it asked for leaves no
  run that it could have admitted (every run due, unleased and with room in each of its gates
  was taken): a line left closed by mistake fails here at once.

At the end of each example the clock runs on and every run is claimed and finished: none is
left waiting.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import pg_session
import pytest
from helpers import FakeClock
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from workerproc.store import Commit, Lease, Store, TaskOptions, open_store
from workerproc.store.codec import WAIT_FOREVER
from workerproc.store.errors import RunOver
from workerproc.store.limits import SEP, LimitSpec
from workerproc.store.newrun import NewRun
from workerproc.store.protocol import claims

TTL = 30.0
WAIT = 100.0  # a wait's timeout
TENANTS = ("x", "y", "z")
OWNERS = ("o1", "o2", "o3")
TASKS = ("a", "b", "c")  # a: per-tenant line behind both limits; b: behind "g" alone; c: free
PICK = st.one_of(st.integers(0, 3), st.integers(0, 999))  # mostly the newest, any of them
ALIVE = "pending"


def gates_of(task: str | None, tenant: str) -> tuple[str, ...]:
    if task == "a":
        return (f"t{SEP}{tenant}", "g")
    return ("g",) if task == "b" else ()


@dataclass
class MRun:
    id: int
    task: str | None  # its head task's name (None: no pending task)
    tenant: str
    due: float
    task_id: int | None = None  # its head task's id, once known
    status: str = ALIVE  # pending | succeeded | failed | cancelled
    lease: Lease | None = None  # the latest lease on its head task
    expires: float = 0.0  # that lease's expiry, as the model keeps it
    waiting: bool = False  # waits for the signal "go" until ``due``
    kept: int = 0  # signals kept, not taken by a wait yet
    parent: int | None = None
    join: int | None = None  # a child: the parent's join task it counts for
    left: int = 0  # a parent: the children its join still waits for
    joining: bool = False
    ended_at: float | None = None
    kids: list[int] = field(default_factory=list)

    @property
    def gates(self) -> tuple[str, ...]:
        return gates_of(self.task, self.tenant)


class LimitBookkeeping(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lk-limits-")
        self.clock = FakeClock()
        claims._turns = itertools.count()  # which goes first, gated or plain: replayable
        self.store = self.open_store()
        self.store.register_tasks({
            "a": TaskOptions(limits=("t", "g"), max_attempts=1000),
            "b": TaskOptions(limits=("g",), max_attempts=1000),
            "c": TaskOptions(max_attempts=1000),
        })  # fmt: skip
        self.cap = 3
        declared = {"g": LimitSpec.declare("g", concurrency=self.cap),
                    "t": LimitSpec.declare("t", concurrency=1, per="tenant")}  # fmt: skip
        assert self.store.declare_limits(declared, by="test") == []
        self.runs: dict[int, MRun] = {}
        self.leases: list[Lease] = []
        self.paused: dict[str, float] = {}
        self.steps = 0

    def open_store(self) -> Store:
        return open_store(f"sqlite:///{self.dir}/m.db?synchronous=normal", clock=self.clock)

    def teardown(self) -> None:
        try:
            if self.steps and sys.exc_info()[0] is None:  # a step failed: that is the news
                self.everything_ends()
        finally:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ----------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now

    def live(self, run: MRun) -> bool:
        return run.lease is not None and run.expires > self.now

    def current(self, lease: Lease) -> MRun | None:
        run = self.runs.get(lease.run_id)
        if run is None or run.lease is None or not self.live(run):
            return None
        same = (run.lease.task_id, run.lease.attempt) == (lease.task_id, lease.attempt)
        return run if same else None

    def in_use(self, gate: str) -> int:
        return sum(1 for r in self.runs.values() if self.live(r) and gate in r.gates)

    def cap_of(self, gate: str) -> int:
        return self.cap if gate == "g" else 1

    def room(self, gate: str) -> bool:
        return self.paused.get(gate, 0.0) <= self.now and self.in_use(gate) < self.cap_of(gate)

    def claimable(self, run: MRun) -> bool:
        return (run.status == ALIVE and run.task is not None and run.due <= self.now
                and not self.live(run))  # fmt: skip

    def admissible(self, run: MRun) -> bool:
        return self.claimable(run) and all(self.room(g) for g in run.gates)

    def head_task(self, run: MRun) -> int:
        pending = [t for t in self.store.get_tasks(run.id) if t.done_at is None]
        assert len(pending) == 1, pending
        return pending[0].id

    def add_run(self, run_id: int, task: str, tenant: str, due: float, **kw: object) -> MRun:
        run = self.runs[run_id] = MRun(run_id, task, tenant, due, **kw)  # type: ignore[arg-type]
        return run

    def ended(self, run: MRun, status: str) -> None:
        """``run`` ended now: its lease is over (unless cancelled under its holder) and the
        parent it is a child of waits for one less."""
        run.status, run.ended_at, run.waiting, run.joining = status, self.now, False, False
        if status != "cancelled":
            run.lease = None
        if status == "succeeded":
            run.task = None
        self.child_ended(run)

    def child_ended(self, child: MRun) -> None:
        parent = self.runs.get(child.parent) if child.parent is not None else None
        if parent is None or parent.status != ALIVE or parent.task_id != child.join:
            return
        if parent.left > 0:
            parent.left -= 1
            if parent.left == 0:  # its join is due now, its wait over
                parent.due, parent.joining, parent.waiting = self.now, False, False

    def cancel_tree(self, run: MRun) -> None:
        """Every live descendant of ``run`` is cancelled with it (B14), a live one below a
        child that ended before too (a grandchild retried after its parent was cancelled):
        the store walks the whole tree (``CANCEL_DESCENDANTS``). Their leases stay (B15)."""
        for kid in run.kids:
            child = self.runs.get(kid)
            if child is None:  # pruned: nothing below it is linked any more
                continue
            if child.status == ALIVE:
                child.status, child.ended_at = "cancelled", self.now
                child.waiting = child.joining = False
            self.cancel_tree(child)

    # -- producers ------------------------------------------------------------------------------
    @rule(task=st.sampled_from(TASKS), tenant=st.sampled_from(TENANTS),
          delay=st.sampled_from([0.0, 0.0, 0.0, 40.0]))  # fmt: skip
    def enqueue(self, task: str, tenant: str, delay: float) -> None:
        run_id = self.store.start_run(task, {"tenant": tenant}, delay=delay)
        self.add_run(run_id, task, tenant, self.now + delay)

    # -- claims -----------------------------------------------------------------------------------
    @rule(owner=st.sampled_from(OWNERS), k=st.integers(1, 6))
    def claim(self, owner: str, k: int) -> None:
        before = {g: self.in_use(g) for g in self._gates()}
        leases = self.store.claim(owner, TTL, limit=k)
        for lease in leases:
            run = self.runs[lease.run_id]
            assert self.claimable(run), (lease, run)
            assert lease.task == run.task and lease.payload == {"tenant": run.tenant}
            assert all(self.paused.get(g, 0.0) <= self.now for g in run.gates), (lease, run)
            run.lease, run.expires, run.task_id = lease, self.now + TTL, lease.task_id
            self.leases.append(lease)
        for gate, was in before.items():  # a cap may be lowered below its use, never passed
            assert self.in_use(gate) <= max(was, self.cap_of(gate)), gate
        if len(leases) < k:
            missed = [r for r in self.runs.values() if self.admissible(r)]
            assert not missed, f"a claim of {k} took {len(leases)} and left {missed}"

    def _gates(self) -> set[str]:
        return {"g"} | {f"t{SEP}{t}" for t in TENANTS}

    # -- commits --------------------------------------------------------------------------------
    def _commit(self, lease: Lease, kind: str, **kw: object) -> str:
        commit = Commit(lease, kind, expected_revision=lease.revision, **kw)  # type: ignore[arg-type]
        return self.store.commit_many([commit]).results[0].value

    def _held(self, i: int, alive: bool = True) -> tuple[Lease, MRun | None, bool]:
        """A lease handed out, the run it holds now (None: it is not the current lease) and
        whether to leave it be (its run is not in the state asked for: a holder whose run
        was cancelled under it only drops it, ``holder_of_an_ended_run``)."""
        lease = self.leases[-1 - i % len(self.leases)]
        run = self.current(lease)
        return lease, run, run is not None and (run.status == ALIVE) != alive

    @precondition(lambda self: self.leases)
    @rule(i=PICK, kind=st.sampled_from(["finish", "fail", "release", "handback"]),
          delay=st.sampled_from([0.0, 30.0]))  # fmt: skip
    def end(self, i: int, kind: str, delay: float) -> None:
        lease, run, other = self._held(i)
        if other:
            return
        kw: dict[str, object] = {"new_state": {}} if kind == "finish" else {}
        if kind == "fail":
            kw = {"reason": "boom"}
        if kind == "release":
            kw = {"delay": delay}
        out = self._commit(lease, kind, **kw)
        if run is None:
            assert out in ("lease_lost", "conflict"), out
            return
        assert out == "ok", (kind, out, run)
        run.lease = None
        if kind == "finish":
            self.ended(run, "succeeded")
        elif kind == "fail":
            self.ended(run, "failed")
        elif kind == "release":
            run.due = self.now + delay

    @precondition(lambda self: self.leases)
    @rule(i=PICK, delay=st.sampled_from([1.0, 20.0]), pause=st.booleans())
    def retry_after(self, i: int, delay: float, pause: bool) -> None:
        lease, run, other = self._held(i)
        if other:
            return
        out = self._commit(lease, "retry_after", delay=delay, pause=pause)
        if run is None:
            assert out in ("lease_lost", "conflict"), out
            return
        assert out == "ok", out
        if pause:
            for gate in run.gates:
                self.paused[gate] = max(self.paused.get(gate, 0.0), self.now + delay)
        run.lease, run.due = None, self.now + delay

    @precondition(lambda self: self.leases)
    @rule(i=PICK, task=st.sampled_from(TASKS), tenant=st.sampled_from(TENANTS),
          how=st.sampled_from(["advance", "wait"]))  # fmt: skip
    def advance(self, i: int, task: str, tenant: str, how: str) -> None:
        lease, run, other = self._held(i)
        if other:
            return
        payload = {"tenant": tenant}
        if how == "wait":
            out = self._commit(lease, "wait", new_state={}, next_task=task, next_payload=payload,
                               delay=WAIT, wait_for="signal:go")  # fmt: skip
        else:
            out = self._commit(lease, "advance", new_state={}, next_task=task,
                               next_payload=payload)  # fmt: skip
        if run is None:
            assert out in ("lease_lost", "conflict"), out
            return
        assert out == "ok", out
        run.lease, run.task, run.tenant, run.due = None, task, tenant, self.now
        run.task_id = self.head_task(run)
        if how == "wait":
            run.due, run.waiting = self.now + WAIT, True
            if run.kept:  # a signal sent before the wait is delivered by it at once
                run.kept, run.due, run.waiting = run.kept - 1, self.now, False

    @precondition(lambda self: self.leases)
    @rule(i=PICK, tenant=st.sampled_from(TENANTS),
          kids=st.lists(st.tuples(st.sampled_from(TASKS), st.sampled_from(TENANTS)),
                        max_size=2))  # fmt: skip
    def spawn(self, i: int, tenant: str, kids: list[tuple[str, str]]) -> None:
        lease, run, other = self._held(i)
        if other:
            return
        children = tuple(NewRun.from_item({"task": t, "payload": {"tenant": k}}) for t, k in kids)
        out = self._commit(lease, "spawn", new_state={}, next_task="a",
                           next_payload={"tenant": tenant}, delay=WAIT_FOREVER,
                           wait_for="children", children=children)  # fmt: skip
        if run is None:
            assert out in ("lease_lost", "conflict"), out
            return
        assert out == "ok", out
        run.lease, run.task, run.tenant = None, "a", tenant
        run.task_id = self.head_task(run)
        run.due, run.joining, run.left = self.now + WAIT_FOREVER, True, len(kids)
        if not kids:
            run.due, run.joining = self.now, False
        known = set(self.runs)
        new = [cid for cid, _status, _task in self.store.run_children(run.id)
               if cid not in known]  # fmt: skip
        assert len(new) == len(kids)
        for cid, (task, kt) in zip(sorted(new), kids, strict=True):
            self.add_run(cid, task, kt, self.now, parent=run.id, join=run.task_id)
            run.kids.append(cid)

    @precondition(lambda self: self.leases)
    @rule(i=PICK, kind=st.sampled_from(["release", "drop", "finish"]))
    def holder_of_an_ended_run(self, i: int, kind: str) -> None:
        """The holder of a run cancelled under it stops (B15): its release ends its lease and
        keeps the step for a retry; a drop (a last word settled) ends its step; a last word
        that would change the run is refused."""
        lease, run, other = self._held(i, alive=False)
        if other:
            return
        kw: dict[str, object] = {"new_state": {}} if kind == "finish" else {}
        out = self._commit(lease, kind, **kw)
        if run is None:
            return  # not the current holder of an ended run: whatever it says, nothing moves
        assert out == ("conflict" if kind == "finish" else "ok"), (kind, out)
        if kind == "release":
            run.lease, run.due = None, self.now
        if kind == "drop":  # its step is over: nothing of the run is left to retry
            run.lease, run.task = None, None

    # -- time and operators -----------------------------------------------------------------------
    @rule(seconds=st.sampled_from([0.5, 5.0, 25.0, TTL + 1, WAIT + 1]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(owner=st.sampled_from(OWNERS))
    def reaped(self, owner: str) -> None:
        self.store.release_owner(owner)
        for run in self.runs.values():
            if self.live(run) and run.lease is not None and run.lease.owner == owner:
                run.expires = self.now

    @precondition(lambda self: self.runs)
    @rule(i=PICK)
    def cancel(self, i: int) -> None:
        run = self._run(i)
        done = self.store.cancel_run(run.id)
        assert done == (run.status == ALIVE)
        if done:
            self.cancel_tree(run)
            self.ended(run, "cancelled")

    @precondition(lambda self: self.runs)
    @rule(i=PICK)
    def retry(self, i: int) -> None:
        run = self._run(i)
        done = self.store.retry_run(run.id)
        assert done == (run.status in ("failed", "cancelled") and run.task is not None)
        if not done:
            return
        parent = self.runs.get(run.parent) if run.parent is not None else None
        if (parent is not None and parent.status == ALIVE and parent.joining
                and parent.task_id == run.join):  # fmt: skip
            parent.left += 1  # its parent waits for it again
        # B2: a lease the retry dropped holds the new generation back until it would expire
        due = max(self.now, run.expires) if run.lease is not None else self.now
        run.status, run.lease, run.due, run.ended_at = ALIVE, None, due, None
        run.waiting = run.joining = False

    @precondition(lambda self: self.runs)
    @rule(i=PICK)
    def signal(self, i: int) -> None:
        run = self._run(i)
        try:
            self.store.signal(run.id, "go", {})
        except RunOver:
            assert run.status != ALIVE
            return
        assert run.status == ALIVE
        if run.waiting and run.due > self.now:
            run.waiting, run.due = False, self.now
        else:
            run.kept += 1

    @rule(concurrency=st.integers(1, 4))
    def limits_set(self, concurrency: int) -> None:
        self.store.set_limit("g", concurrency=concurrency)
        self.cap = concurrency

    @rule()
    def prune(self) -> None:
        gone = self.store.prune(1.0)
        doomed = [r.id for r in self.runs.values() if self.prunable(r)]
        assert gone == len(doomed)
        for run_id in doomed:
            del self.runs[run_id]

    def prunable(self, run: MRun) -> bool:
        """Ended over a second ago, no live lease, no live parent (its join reads it)."""
        if run.status == ALIVE or run.ended_at is None or run.ended_at >= self.now - 1.0:
            return False
        parent = self.runs.get(run.parent) if run.parent is not None else None
        return not self.live(run) and (parent is None or parent.status != ALIVE)

    def _run(self, i: int) -> MRun:
        ids = sorted(self.runs)
        return self.runs[ids[-1 - i % len(ids)]]

    # -- after every step -------------------------------------------------------------------------
    @invariant()
    def counted(self) -> None:
        self.steps += 1
        waiting: dict[str, int] = {}
        for run in self.runs.values():
            if run.status == ALIVE and run.gates and not self.live(run):
                for gate in run.gates:
                    waiting[gate] = waiting.get(gate, 0) + 1
        seen = {}
        for info in self.store.limits(keys=10):
            if info.name == "g":
                seen["g"] = (info.in_use, info.waiting)
            for key in info.keys if info.name == "t" else ():
                seen[f"t{SEP}{key.key}"] = (key.live, key.waiting)
        for gate in self._gates():
            want = (self.in_use(gate), waiting.get(gate, 0))
            assert seen.get(gate, (0, 0)) == want, (gate, seen.get(gate), want)

    @invariant()
    def no_line_waits_for_ever(self) -> None:
        assert self.store.repair_lines() == []

    @invariant()
    def leases_and_work_agree(self) -> None:
        stats = self.store.stats()
        alive = [r for r in self.runs.values() if r.status == ALIVE]
        assert stats.leased == sum(1 for r in alive if self.live(r))
        assert stats.pending_work == sum(1 for r in alive if r.task is not None)

    # -- at the end -------------------------------------------------------------------------------
    def everything_ends(self) -> None:
        """The clock runs on; every run is claimed and finished in turn, none left waiting."""
        for _ in range(60):
            if not any(r.status == ALIVE for r in self.runs.values()):
                return
            self.clock.advance(WAIT + TTL)  # every wait over, every lease and pause ended
            while leases := self.store.claim("end", TTL, limit=50):  # all that may run now
                for lease in leases:
                    assert self._commit(lease, "finish", new_state={}) == "ok"
                    self.ended(self.runs[lease.run_id], "succeeded")
        stuck = [r for r in self.runs.values() if r.status == ALIVE]
        assert not stuck, f"runs never claimed again: {stuck}"


class PostgresLimitBookkeeping(LimitBookkeeping):
    """The same machine on PostgreSQL: one schema, emptied before every example."""

    url: str | None = None

    def open_store(self) -> Store:
        cls = PostgresLimitBookkeeping
        if cls.url is None:
            cls.url = pg_session.schema_url("lb")
            open_store(cls.url).close()  # creates the schema
        pg_session.truncate(cls.url)
        return open_store(cls.url, clock=self.clock)


EXAMPLES = int(os.environ.get("LK_LIMITS_STATEFUL_EXAMPLES", "10"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=int(os.environ.get("LK_LIMITS_STATEFUL_STEPS", "500")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LimitBookkeeping.TestCase.settings = SETTINGS
# a network round trip per call: fewer examples keep the suite's time in bounds
PG_EXAMPLES = max(1, EXAMPLES * 2 // 5)
PostgresLimitBookkeeping.TestCase.settings = settings(SETTINGS, max_examples=PG_EXAMPLES)
TestLimitBookkeeping = pytest.mark.timeout(600)(LimitBookkeeping.TestCase)
TestLimitBookkeepingPostgres = pytest.mark.timeout(600)(PostgresLimitBookkeeping.TestCase)


# -- a regression the machine found -----------------------------------------------------------
def test_a_pruned_task_id_is_never_given_again(s: Store, clock: FakeClock) -> None:
    """A lease outlives its run's prune in its holder's hands; the store never hands its task
    id out again (SQLite numbered a new row one past the largest left), so the stale lease
    never matches the fence (R2) of another run's task, even its own owner's next claim at the
    same attempt: every write under it is refused and the new lease holds on."""
    s.register_tasks({"a": TaskOptions(limits=("t",))})
    assert s.declare_limits({"t": LimitSpec.declare("t", concurrency=1, per="tenant")},
                            by="test") == []  # fmt: skip
    first = s.start_run("a", {"tenant": "x"})
    (stale,) = s.claim("w1", TTL, limit=1)
    assert s.cancel_run(first)
    clock.advance(TTL + 1)  # the lease expires under its holder, who still has it
    assert s.prune(1.0) == 1 and s.get_tasks(first) == []
    second = s.start_run("a", {"tenant": "x"})
    (fresh,) = s.claim("w1", TTL, limit=1)
    assert (fresh.run_id, fresh.attempt) == (second, stale.attempt)
    assert fresh.task_id > stale.task_id  # a new id, never the pruned one's
    for kind, kw in [("handback", {}), ("release", {}), ("retry_after", {"delay": 1.0}),
                     ("finish", {"new_state": {}}), ("fail", {"reason": "boom"})]:  # fmt: skip
        last_word = Commit(stale, kind, expected_revision=stale.revision, **kw)  # type: ignore[arg-type]
        assert s.commit_many([last_word]).results[0].value == "lease_lost", kind
    assert s.renew_each([stale], TTL)[0].expires_at is None
    # the new holder's lease is untouched: its slot is still counted, nobody else admitted
    (gate,) = [info for info in s.limits(keys=10) if info.name == "t"]
    assert [(k.key, k.live, k.waiting) for k in gate.keys] == [("x", 1, 0)]
    assert s.stats().leased == 1
    assert s.renew_each([fresh], TTL)[0].expires_at == clock.now + TTL
    # an advance's next task is numbered past the pruned ones too
    done = Commit(fresh, "advance", expected_revision=fresh.revision, new_state={},
                  next_task="a", next_payload={"tenant": "x"})  # fmt: skip
    assert s.commit_many([done]).results[0].value == "ok"
    assert [t.id for t in s.get_tasks(second)] == [fresh.task_id, fresh.task_id + 1]
