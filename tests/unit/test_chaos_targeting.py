"""Chaos mode's targeting without processes: a real database and real status slots, a fake
pool. A fault strikes only a worker that holds a lease inside its handler; a task's last allowed
attempt is never a victim, whether the slot shows it or only the database does; and a pause
never freezes a process that holds the write lock."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest
from helpers import FakeClock
from supervisor_fakes import FakeProcs, make_pool

from supervisor.chaos.targets import Targeting
from supervisor.loop.pool import Pool, WorkerProcess
from supervisor.loop.storegate import StoreGate
from workerproc.status import CLAIMING, COMMITTING, HANDLER, IDLE, StatusBoard
from workerproc.store import Lease, Store, open_store

MAX_ATTEMPTS = 3


class Arb:
    """What targeting reads from the arbiter: the pool, the status board, the store gate."""

    def __init__(self, db: str, pool: Pool) -> None:
        self.pool = pool
        self.board = StatusBoard(8)
        self.gate = StoreGate(db)

    def is_up(self, worker: WorkerProcess) -> bool:
        state = self.board.read(worker.slot)
        return state is not None and state.pid == worker.pid


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(time.time())


@pytest.fixture
def db(db_path: str, wall: FakeClock) -> Iterator[Store]:
    store = open_store(db_path, clock=wall)
    yield store
    store.close()


@pytest.fixture
def arb(db_path: str, clock: FakeClock) -> Arb:
    procs = FakeProcs()
    pool = make_pool(clock, procs, target=3)
    for _ in range(3):
        pool.spawn()
    return Arb(db_path, pool)


def lease_on_try(store: Store, wall: FakeClock, owner: str, tries: int) -> Lease:
    """A fresh run whose task is held by ``owner`` on its ``tries``-th attempt (the earlier
    holders' leases expired)."""
    store.start_run("t")
    lease = None
    for n in range(1, tries + 1):
        last = n == tries
        lease = store.claim(owner if last else f"gone-{n}", 3600 if last else 1, max_attempts=9)
        assert lease is not None and lease.tries == n
        if not last:
            wall.advance(2)
    assert lease is not None
    return lease


def workers(arb: Arb) -> list[WorkerProcess]:
    return sorted(arb.pool.workers.values(), key=lambda w: w.slot)


def in_handler(arb: Arb, worker: WorkerProcess, lease: Lease) -> None:
    arb.board.slot(worker.slot).publish(worker.pid, HANDLER, lease.task_id, lease.attempt)


def test_a_task_on_its_last_attempt_is_never_a_victim(arb: Arb, db: Store, wall: FakeClock):
    last, fresh, spare = workers(arb)
    in_handler(arb, last, lease_on_try(db, wall, last.owner, MAX_ATTEMPTS))
    fresh_lease = lease_on_try(db, wall, fresh.owner, 1)
    in_handler(arb, fresh, fresh_lease)
    in_handler(arb, spare, lease_on_try(db, wall, spare.owner, MAX_ATTEMPTS - 1))
    rule = Targeting(MAX_ATTEMPTS)
    candidates = rule.candidates(arb, exclude=lambda pid: False)
    assert candidates == [last, fresh, spare]
    assert rule.eligible(arb, candidates) == [fresh, spare]
    for fault in ("kill", "pause"):
        assert rule.judge_frozen(arb, last, fault)[0] == "last_attempt"
        assert rule.judge_frozen(arb, fresh, fault)[0] is None
        assert rule.judge_frozen(arb, spare, fault)[0] is None
    # the leases a struck victim held, from the database: each one an orphan to take over
    (held,) = rule.judge_frozen(arb, fresh, "kill")[1]
    assert (held.task_id, held.attempt, held.run_id) == (
        fresh_lease.task_id, fresh_lease.attempt, fresh_lease.run_id)  # fmt: skip
    assert held.expires_at == fresh_lease.expires_at  # the end the verifier's zombie rule needs
    # with one more attempt allowed, the same lease is no longer the last one
    assert Targeting(MAX_ATTEMPTS + 1).judge_frozen(arb, last, "kill")[0] is None


def test_a_lease_the_slot_does_not_show_yet_is_protected_too(arb: Arb, db: Store, wall: FakeClock):
    """In a handler (with slots: busy) for one task, and holding another lease on its last
    attempt that the slot does not show: only the database knows, and the frozen victim is
    judged by the database."""
    busy, _, _ = workers(arb)
    arb.board.slot(busy.slot).publish(busy.pid, HANDLER, busy=1)
    lease_on_try(db, wall, busy.owner, 1)
    lease_on_try(db, wall, busy.owner, MAX_ATTEMPTS)
    rule = Targeting(MAX_ATTEMPTS)
    assert rule.candidates(arb, exclude=lambda pid: False) == [busy]
    assert rule.eligible(arb, [busy]) == [busy]
    assert rule.judge_frozen(arb, busy, "kill")[0] == "last_attempt"


def test_a_fault_strikes_only_a_lease_holder_inside_its_handler(
    arb: Arb, db: Store, wall: FakeClock
) -> None:
    """While a pool starts (every worker claiming, or idle), no worker is a
    candidate, whatever the fault: killing new workers before their first claim starved the
    whole pool. Frozen, a victim is struck only if its slot still shows a handler and the
    database shows it holding a live lease."""
    claiming, idle, handler = workers(arb)
    arb.board.slot(claiming.slot).publish(claiming.pid, CLAIMING)
    arb.board.slot(idle.slot).publish(idle.pid, IDLE)
    rule = Targeting(MAX_ATTEMPTS)
    assert rule.candidates(arb, exclude=lambda pid: False) == []
    lease = lease_on_try(db, wall, handler.owner, 1)
    in_handler(arb, handler, lease)
    assert rule.candidates(arb, exclude=lambda pid: False) == [handler]
    # it left its handler between the choice and the freeze: let go
    arb.board.slot(handler.slot).publish(handler.pid, COMMITTING, lease.task_id, lease.attempt)
    assert rule.judge_frozen(arb, handler, "kill") == ("not_in_handler", [])
    # in its handler, but the database shows no lease of it (lapsed, or given back): let go
    in_handler(arb, handler, lease)
    assert db.release(lease)
    assert rule.judge_frozen(arb, handler, "kill") == ("no_lease", [])


def test_a_pause_never_freezes_the_holder_of_the_write_lock(
    arb: Arb, db: Store, wall: FakeClock, db_path: str
):
    victim, _, _ = workers(arb)
    in_handler(arb, victim, lease_on_try(db, wall, victim.owner, 1))
    rule = Targeting(MAX_ATTEMPTS)
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # as a worker frozen inside a transaction would
        assert rule.judge_frozen(arb, victim, "pause")[0] == "store_locked"
        assert rule.judge_frozen(arb, victim, "kill")[0] is None  # its lock dies with it
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert rule.judge_frozen(arb, victim, "pause")[0] is None
