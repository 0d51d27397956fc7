"""The reload state machine without processes: a fake pool (no fork), a fake import probe whose
answer the test writes, and a fake clock. RELOADING first, the loop turning while the probe
imports, the roll, and every way a reload fails — with the old workers left serving."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from helpers import FakeClock
from supervisor_fakes import FakeGate, FakeProcs, exited, killed, make_pool

from supervisor.config import StartConfig, Timing
from supervisor.integrations.notify import status_line
from supervisor.integrations.probe import StatsProbe
from supervisor.loop.arbiter import Arbiter, Phase
from supervisor.loop.pool import WorkerProcess
from supervisor.loop.reload import Reloads, ReloadStatus
from supervisor.loop.report import snapshot
from supervisor.loop.signals import SignalInbox
from supervisor.loop.steps import default_steps
from workerproc import App
from workerproc import exitcodes as wexit
from workerproc.config import WorkerConfig
from workerproc.status import IDLE, StatusBoard


class FakeProbe:
    """An import probe that answers when the test says so."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = 10_000 + pid  # only ever handed to select() by Arbiter.run, never here
        self.answer: str | None = None  # written by the test; "" = closed without a word
        self.eof = False
        self.closed = False

    def read(self) -> bool:
        self.eof = self.answer is not None
        return self.eof

    @property
    def message(self) -> str:
        return self.answer or ""

    def close(self) -> None:
        self.closed = True


class Probes:
    def __init__(self, procs: FakeProcs) -> None:
        self.procs = procs
        self.started: list[FakeProbe] = []

    def start(self) -> FakeProbe:
        self.procs.next_pid += 1
        probe = FakeProbe(self.procs.next_pid)
        self.started.append(probe)
        return probe

    @property
    def last(self) -> FakeProbe:
        return self.started[-1]


class Recorder:
    def __init__(self, arb: Arbiter) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        for name in ("reloading", "ready", "reload_failed"):
            arb.events.on(name, lambda _n=name, **data: self.seen.append((_n, data)))

    def names(self) -> list[str]:
        return [n for n, _ in self.seen]


def make(clock: FakeClock, workers: int = 2) -> tuple[Arbiter, FakeProcs, Probes, Recorder]:
    procs = FakeProcs()
    probes = Probes(procs)
    cfg = StartConfig(WorkerConfig(db="x.db", app="m:app"), workers=workers).validate()
    arb = Arbiter(
        config=cfg,
        app=App(),
        pool=make_pool(clock, procs, workers),
        inbox=SignalInbox(),
        gate=FakeGate(),  # type: ignore[arg-type]
        board=StatusBoard(8),
        reloads=Reloads(start_probe=probes.start),
        clock=clock,
        steps=default_steps(),
    )
    recorder = Recorder(arb)
    arb.turn()
    bring_up(arb)
    arb.turn()
    return arb, procs, probes, recorder


def bring_up(arb: Arbiter, generation: int | None = None) -> None:
    """Each worker (of ``generation``, or all) publishes its phase: it entered its claim loop."""
    for w in arb.pool.workers.values():
        if generation is None or w.generation == generation:
            arb.board.slot(w.slot).publish(w.pid, IDLE)


def hup(arb: Arbiter) -> None:
    arb.inbox.queue.append(signal.SIGHUP)
    arb.turn()


def roll_to_the_end(arb: Arbiter, generation: int, turns: int = 20) -> None:
    for _ in range(turns):
        bring_up(arb, generation)
        arb.turn()


def by_generation(arb: Arbiter) -> dict[int, int]:
    counts: dict[int, int] = {}
    for w in arb.pool.active():
        counts[w.generation] = counts.get(w.generation, 0) + 1
    return counts


# -- the good path -------------------------------------------------------------------------
def test_reloading_is_said_first_and_the_loop_reaps_while_the_probe_imports(
    clock: FakeClock,
) -> None:
    arb, procs, probes, rec = make(clock)
    (ready,) = rec.seen
    assert ready == ("ready", {"reload": False})
    hup(arb)
    assert rec.names() == ["ready", "reloading"]  # before the probe said anything
    assert len(probes.started) == 1 and arb.pool.helper_running(probes.last.pid)
    assert arb.reloads.current is not None
    assert arb.reloads.current.status is ReloadStatus.IMPORTING
    assert len(procs.spawned) == 2 and arb.pool.generation == 0  # nothing rolled yet

    # the probe takes its time; a worker dies meanwhile: reaped and replaced (generation 0)
    victim = next(iter(arb.pool.workers.values()))
    clock.advance(30)
    procs.exits = [(victim.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert victim.pid not in arb.pool.workers and len(procs.spawned) == 3
    assert {w.generation for w in arb.pool.workers.values()} == {0}
    assert "importing the new code" in status_line(arb, StatsProbe())

    probes.last.answer = "ok 3 tasks"
    procs.exits = [(probes.last.pid, exited(0))]  # reaped as a helper, not as a worker
    arb.turn()
    assert arb.pool.generation == 1 and arb.rolling
    assert not arb.pool.helpers and probes.last.closed
    bring_up(arb, 0)
    roll_to_the_end(arb, 1)
    assert not arb.rolling and by_generation(arb) == {1: 2}
    assert rec.names() == ["ready", "reloading", "ready"]
    assert rec.seen[-1] == ("ready", {"reload": True})
    record = snapshot(arb)["reload"]
    assert record["status"] == "done" and record["generation"] == 1
    assert record["workers_on_generation"] == 2 and record["requested_monotonic"] <= clock.now


def test_several_hups_read_together_are_one_reload(clock: FakeClock) -> None:
    arb, _, probes, rec = make(clock)
    arb.inbox.queue.extend([signal.SIGHUP, signal.SIGHUP, signal.SIGHUP])
    arb.turn()
    assert len(probes.started) == 1 and rec.names().count("reloading") == 1


def test_a_hup_during_a_reload_starts_it_over(clock: FakeClock) -> None:
    arb, procs, probes, rec = make(clock)
    hup(arb)
    first = probes.last
    hup(arb)
    assert (first.pid, signal.SIGKILL) in procs.sent and first.closed  # the stale probe goes
    assert arb.reloads.current is not None and arb.reloads.current.id == 2
    procs.exits = [(first.pid, killed(signal.SIGKILL))]
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    assert first.pid not in arb.pool.helpers  # buried once reaped
    assert arb.pool.generation == 1
    roll_to_the_end(arb, 1)
    hup(arb)  # a third reload while generation 1 runs, then a fourth mid-roll
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    bring_up(arb, 2)
    arb.turn()
    assert 2 in by_generation(arb)
    hup(arb)
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    roll_to_the_end(arb, 3)
    assert by_generation(arb) == {3: 2} and not arb.reloads.in_progress
    assert rec.names().count("ready") == 3  # start, reload 2, reload 4


# -- failures ------------------------------------------------------------------------------
def test_an_import_error_fails_the_reload_and_keeps_the_workers(clock: FakeClock) -> None:
    arb, procs, probes, rec = make(clock)
    before = dict(arb.pool.workers)
    hup(arb)
    probes.last.answer = "error cannot import 'm': SyntaxError: invalid syntax (m.py, line 2)"
    arb.turn()
    assert arb.pool.workers == before and not procs.sent and len(procs.spawned) == 2
    assert arb.phase is Phase.RUNNING and arb.pool.generation == 0
    assert rec.seen[-1] == ("reload_failed", {"error": arb.reloads.failure})
    assert arb.reloads.failure is not None and "SyntaxError" in arb.reloads.failure
    line = status_line(arb, StatsProbe())
    assert line.startswith("reload failed: cannot import 'm': SyntaxError")
    assert "2/2 workers up" in line

    hup(arb)  # the next good reload clears it
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    roll_to_the_end(arb, 1)
    assert arb.reloads.failure is None
    assert not status_line(arb, StatsProbe()).startswith("reload failed")


def test_a_probe_that_dies_without_a_word_fails_the_reload(clock: FakeClock) -> None:
    arb, procs, probes, _ = make(clock)
    hup(arb)
    probes.last.answer = ""  # EOF, nothing written
    arb.turn()
    assert arb.reloads.in_progress  # waits for the exit status to say how it died
    procs.exits = [(probes.last.pid, killed(signal.SIGSEGV))]
    arb.turn()
    assert arb.reloads.failure == "the import probe was killed by SIGSEGV before it answered"
    assert not arb.pool.helpers


def test_an_import_past_the_bound_is_killed_and_fails(clock: FakeClock) -> None:
    arb, procs, probes, _ = make(clock)
    hup(arb)
    clock.advance(Timing().reload_import_timeout - 1)
    arb.turn()
    assert arb.reloads.in_progress and not procs.sent
    clock.advance(2)
    arb.turn()
    assert (probes.last.pid, signal.SIGKILL) in procs.sent
    assert arb.reloads.failure == "importing m:app took longer than 120s"
    assert arb.pool.helper_running(probes.last.pid)  # killed, not reaped yet: kept to reap
    procs.exits = [(probes.last.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert not arb.pool.helpers


@pytest.mark.parametrize("code", [wexit.BOOT_FAILURE, wexit.APP_IMPORT])
def test_a_new_worker_that_cannot_boot_fails_the_reload_not_the_supervisor(
    clock: FakeClock, code: int
) -> None:
    arb, procs, probes, rec = make(clock)
    old = set(arb.pool.workers)
    hup(arb)
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    surge = arb.pool.workers[procs.spawned[-1][0]]
    assert surge.generation == 1
    procs.exits = [(surge.pid, exited(code))]
    clock.advance(0.1)
    arb.turn()
    assert arb.phase is Phase.RUNNING and arb.exit_code == 0  # boot failure at start would stop
    assert arb.reloads.failure is not None and "cannot boot on the new code" in arb.reloads.failure
    assert f"exited with code {code}" in arb.reloads.failure
    assert set(arb.pool.workers) == old and all(w.active for w in arb.pool.workers.values())
    assert arb.pool.generation == 0 and rec.names()[-1] == "reload_failed"
    clock.advance(5)
    arb.turn()
    assert len(procs.spawned) == 3  # nothing more started: the pool is whole


def test_a_failure_mid_roll_rolls_back_to_the_previous_generation(clock: FakeClock) -> None:
    arb, procs, probes, _ = make(clock, workers=3)
    hup(arb)
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    bring_up(arb, 1)
    arb.turn()  # one old worker retired
    arb.turn()  # the second new worker starts
    second = arb.pool.workers[procs.spawned[-1][0]]
    first = next(w for w in arb.pool.active() if w.generation == 1 and w is not second)
    procs.exits = [(second.pid, exited(wexit.BOOT_FAILURE))]
    arb.turn()
    assert arb.reloads.failure is not None and arb.pool.generation == 0
    assert first.retiring == "reload failed"  # no mixed pool: old code everywhere again
    assert by_generation(arb) == {0: 3}  # a replacement runs what ran before
    assert arb.pool.workers[procs.spawned[-1][0]].generation == 0


def test_new_workers_crashing_at_start_back_off_then_fail_the_reload(clock: FakeClock) -> None:
    arb, procs, probes, _ = make(clock, workers=1)
    (old,) = arb.pool.workers.values()
    hup(arb)
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    delays = []
    for _ in range(Timing().reload_crash_limit):
        surge = arb.pool.workers[procs.spawned[-1][0]]
        procs.exits = [(surge.pid, exited(1))]  # the new code dies at boot
        clock.advance(0.1)
        arb.turn()
        assert old.active  # the old worker keeps serving
        delays.append(arb.pool.backoff_remaining())
        clock.advance(delays[-1])
        arb.turn()
    assert delays[:2] == [0.5, 1.0]  # the roll respects crash backoff
    assert arb.reloads.failure is not None and "3 new workers died at start" in arb.reloads.failure
    assert arb.phase is Phase.RUNNING and [w.pid for w in arb.pool.active()] == [old.pid]


def test_a_new_worker_that_never_claims_fails_the_reload(clock: FakeClock) -> None:
    arb, procs, probes, _ = make(clock, workers=1)
    hup(arb)
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    surge: WorkerProcess = arb.pool.workers[procs.spawned[-1][0]]
    clock.advance(Timing().reload_boot_timeout + 1)
    arb.turn()
    assert arb.reloads.failure is not None and "did not claim within 120s" in arb.reloads.failure
    assert surge.retiring == "reload failed" and (surge.pid, signal.SIGTERM) in procs.sent


def test_a_hup_while_stopping_is_refused_and_a_stop_ends_the_probe(clock: FakeClock) -> None:
    arb, procs, probes, rec = make(clock)
    hup(arb)
    arb.inbox.queue.append(signal.SIGTERM)
    arb.turn()
    assert (probes.last.pid, signal.SIGKILL) in procs.sent
    assert arb.reloads.failure == "the supervisor is stopping"
    assert "reload_failed" not in rec.names()  # STOPPING=1 ends systemd's reloading, not READY
    arb.inbox.queue.append(signal.SIGHUP)
    arb.turn()
    assert len(probes.started) == 1
    assert arb.reloads.current is not None and arb.reloads.current.id == 2
    assert arb.reloads.failure == "the supervisor is stopping"


def test_without_a_probe_a_reload_fails_cleanly(clock: FakeClock) -> None:
    arb, _, _, _ = make(clock)
    arb.reloads.start_probe = None
    hup(arb)
    assert arb.reloads.failure == "this supervisor cannot import the app afresh"


def test_done_only_once_every_worker_of_the_new_generation_claims(clock: FakeClock) -> None:
    arb, procs, probes, rec = make(clock, workers=1)
    hup(arb)
    probes.last.answer = "ok 1 tasks"
    arb.turn()
    (surge,) = [w for w in arb.pool.workers.values() if w.generation == 1]
    bring_up(arb, 1)
    arb.turn()  # the old worker is retired: only the new one is active
    assert [w.generation for w in arb.pool.active()] == [1]
    clock.advance(10)
    procs.exits = [(surge.pid, killed(signal.SIGKILL))]  # it dies before the loop says done
    arb.turn()
    assert arb.rolling and "ready" not in rec.names()[1:]  # its replacement is not up yet
    roll_to_the_end(arb, 1, turns=2)
    assert not arb.rolling and rec.names()[-1] == "ready"
