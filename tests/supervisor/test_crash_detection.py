"""Crash and fault detection without a running pool: zombies are dead owners, a clean exit that
still held a lease is a crash, the database file's identity, the stall watch, and corruption seen
by the loop."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
from helpers import FakeClock, wait_for
from supervisor_fakes import FakeGate, FakeProcs, exited, make_arbiter

from supervisor import exitcodes
from supervisor.loop.arbiter import Arbiter, Step
from supervisor.loop.guard import DbGuard
from supervisor.loop.progress import StallWatch
from supervisor.loop.report import snapshot
from supervisor.loop.storegate import StoreGate
from workerproc import exitcodes as wexit
from workerproc.identity import make_owner, owner_is_dead
from workerproc.status import HANDLER, IDLE, Counters
from workerproc.store import StoreCorrupt, StoreUnavailable, open_store


# -- a zombie is dead --------------------------------------------------------------------------
def test_a_zombie_owner_is_dead() -> None:
    """A SIGKILLed process that nobody reaped yet (its parent was killed too, and PID 1 has not
    come round) still has a start time; its leases must be released all the same."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = make_owner(pid=child.pid)
        assert not owner_is_dead(owner)
        child.send_signal(signal.SIGKILL)
        # Popen reaps only in wait()/poll(): until then the child is a zombie
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
                 what="the child to become a zombie")  # fmt: skip
        assert owner_is_dead(owner)
    finally:
        child.kill()
        child.wait()
    assert owner_is_dead(owner)  # reaped: gone for good


# -- corruption met by a worker or by the supervisor's own sessions ------------------------------
def test_a_worker_that_met_corruption_stops_the_supervisor_with_exit_1(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=2)
    arb.turn()
    victim = next(iter(arb.pool.workers.values()))
    procs.exits = [(victim.pid, exited(wexit.STORE_CORRUPT))]
    with caplog.at_level(logging.INFO, logger="supervisor"):
        arb.turn()
    assert arb.stopping and arb.exit_code == exitcodes.ERROR
    (line,) = [
        r.getMessage() for r in caplog.records if getattr(r, "event", "") == "database_corrupt"
    ]
    assert "restore the database from a backup" in line


def test_corruption_met_by_a_supervisor_session_stops_it(tmp_path: Path, clock: FakeClock) -> None:
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        for _ in range(100):
            store.start_run("noop", {"pad": "x" * 200})
    with open(db, "r+b") as fh:  # garbage in page 2
        fh.seek(4096)
        fh.write(random.Random(2).randbytes(4096))
    arb = make_arbiter(clock, FakeProcs(), workers=1)
    arb.gate = gate = StoreGate(db)
    with pytest.raises(StoreCorrupt), gate.session() as store:
        store.claim("someone", 5.0)
    DbGuard().step(arb)
    assert arb.stopping and arb.exit_code == exitcodes.ERROR


# -- the file the gate serves ----------------------------------------------------------------
def test_the_gate_notices_a_deleted_or_replaced_file_and_never_opens_the_path(
    tmp_path: Path, clock: FakeClock
) -> None:
    db = str(tmp_path / "lk.db")
    gate = StoreGate(db)
    with gate.session() as store:
        store.start_run("noop")
    gate.pin()
    assert gate.file_problem() is None
    worker = open_store(db)  # a worker's connection keeps the deleted inode from reuse
    worker.start_run("noop")
    os.remove(db)
    assert "deleted" in (gate.file_problem() or "")
    with pytest.raises(StoreUnavailable, match="deleted"), gate.session():
        pass
    assert not os.path.exists(db)  # the session did not create a new, empty one
    Path(db).write_bytes(b"")  # someone made a new file there (enqueue would refuse: the -wal)
    assert "replaced" in (gate.file_problem() or "")
    worker.close()
    arb = make_arbiter(clock, FakeProcs(), workers=1)
    arb.gate = gate
    DbGuard().step(arb)
    assert arb.stopping and arb.exit_code == exitcodes.ERROR


# -- the stall watch ---------------------------------------------------------------------------
class ReadyGate(FakeGate):
    def __init__(self) -> None:
        super().__init__()
        self.ready: bool | None = True  # None: the database does not answer
        self.reads = 0

    def ready_now(self, queues: Sequence[str] | None = None) -> bool:
        self.reads += 1
        if self.ready is None:
            raise StoreUnavailable("database is locked")
        return self.ready


def watched(clock: FakeClock, workers: int = 2) -> tuple[Arbiter, ReadyGate]:
    arb = make_arbiter(clock, FakeProcs(), workers=workers)
    arb.gate = gate = ReadyGate()  # type: ignore[assignment]
    arb.add_step(Step("progress", StallWatch(every=1.0).step), before="publish")
    arb.turn()
    return arb, gate


def publish(arb: Arbiter, phase: int, claims: int | None = None) -> None:
    for w in arb.pool.workers.values():
        slot = arb.board.slot(w.slot)
        slot.publish(w.pid, phase)
        if claims is not None:
            slot.publish_counters(w.pid, Counters(claims=claims))


def stalled_since(arb: Arbiter) -> object:
    return snapshot(arb)["progress"]["stalled_since"]


def test_free_workers_ready_work_and_no_claims_is_a_stall_until_a_claim(clock: FakeClock) -> None:
    arb, _ = watched(clock)
    publish(arb, IDLE, claims=5)
    clock.advance(1)
    arb.turn()  # the claims moved since the first look (0 -> 5): progress
    assert stalled_since(arb) is None
    for _ in range(3):
        clock.advance(1)
        arb.turn()
    since = stalled_since(arb)
    assert isinstance(since, float) and time.time() - since == pytest.approx(2, abs=0.5)
    assert snapshot(arb)["progress"]["free"] == 2
    publish(arb, IDLE, claims=6)
    clock.advance(1)
    arb.turn()
    assert stalled_since(arb) is None


def test_busy_workers_idle_queues_and_a_silent_database_are_not_stalls(clock: FakeClock) -> None:
    arb, gate = watched(clock)
    publish(arb, HANDLER, claims=1)  # long handlers: never a stall, and no database read
    reads = gate.reads
    for _ in range(5):
        clock.advance(1)
        arb.turn()
    assert stalled_since(arb) is None and gate.reads == reads
    publish(arb, IDLE)
    gate.ready = False  # nothing to do: idle, not stalled
    for _ in range(3):
        clock.advance(1)
        arb.turn()
    assert stalled_since(arb) is None and gate.reads > reads
    gate.ready = True
    clock.advance(1)
    arb.turn()
    since = stalled_since(arb)
    assert since is not None
    gate.ready = None  # unknown: keep what we knew
    clock.advance(1)
    arb.turn()
    assert stalled_since(arb) == since
