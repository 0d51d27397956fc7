"""Supervisor decisions without processes: reap and backoff with fake waitpid results and a
fake clock, the loop's steps against a fake pool, signals, config, pidfile and logs."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import FakeClock
from supervisor_fakes import FakeProcs, exited, killed, make_arbiter, make_pool

from supervisor import exitcodes, logs
from supervisor.config import StartConfig
from supervisor.errors import ConfigError, NotRunning, PidfileLocked
from supervisor.loop.arbiter import Phase, Step
from supervisor.loop.pidfile import Pidfile, live_pid, read_state
from supervisor.loop.pool import ExitKind, WorkerProcess, classify
from supervisor.loop.signals import SignalInbox, blocked
from workerproc import exitcodes as wexit
from workerproc.config import WorkerConfig
from workerproc.status import HANDLER, IDLE


# -- classification and backoff ------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "retiring", "kind"),
    [
        (wexit.OK, None, ExitKind.STOPPED),
        (wexit.RECYCLE, None, ExitKind.RECYCLED),
        (wexit.BOOT_FAILURE, None, ExitKind.BOOT_FAILURE),
        (wexit.BOOT_FAILURE, "stop", ExitKind.BOOT_FAILURE),
        (wexit.TASK_TIMEOUT, None, ExitKind.CRASHED),
        (1, None, ExitKind.CRASHED),
        (None, None, ExitKind.CRASHED),  # killed by a signal
        (None, "memory", ExitKind.RETIRED),
        (wexit.OK, "scale down", ExitKind.RETIRED),
    ],
)
def test_classify(code: int | None, retiring: str | None, kind: ExitKind) -> None:
    worker = WorkerProcess(1, 0, "o", 0, 0.0, retiring=retiring)
    assert classify(code, worker, 1.0) is kind


def test_crash_loop_backoff_doubles_caps_and_resets(clock: FakeClock) -> None:
    procs = FakeProcs()
    pool = make_pool(clock, procs, target=1)
    delays = []
    for _ in range(8):
        worker = pool.spawn()
        assert worker is not None
        clock.advance(0.1)  # dies right after start
        procs.exits = [(worker.pid, killed(signal.SIGSEGV))]
        (ex,) = pool.reap()
        assert ex.kind is ExitKind.CRASHED and ex.signal == signal.SIGSEGV
        delays.append(ex.backoff)
        assert pool.backoff_remaining() == pytest.approx(ex.backoff)
        clock.advance(ex.backoff)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    worker = pool.spawn()
    assert worker is not None
    clock.advance(60)  # ran a while, then crashed: not a boot crash loop
    procs.exits = [(worker.pid, exited(1))]
    (ex,) = pool.reap()
    assert ex.backoff == 0 and pool.crash_streak == 0 and pool.backoff_remaining() == 0


def test_recycle_and_clean_exit_never_back_off(clock: FakeClock) -> None:
    procs = FakeProcs()
    pool = make_pool(clock, procs)
    a, b = pool.spawn(), pool.spawn()
    assert a and b
    procs.exits = [(a.pid, exited(wexit.RECYCLE)), (b.pid, exited(wexit.OK)), (999, exited(0))]
    kinds = sorted(str(e.kind) for e in pool.reap())
    assert kinds == ["recycled", "stopped"]  # pid 999 is not ours: ignored
    assert pool.backoff_remaining() == 0 and not pool.workers


def test_reap_stops_when_there_are_no_children(clock: FakeClock) -> None:
    def no_children(pid: int, options: int) -> tuple[int, int]:
        raise ChildProcessError

    pool = make_pool(clock, FakeProcs())
    pool.waitpid = no_children
    assert pool.reap() == []


def test_slots_are_reused(clock: FakeClock) -> None:
    procs = FakeProcs()
    pool = make_pool(clock, procs)
    a, b = pool.spawn(), pool.spawn()
    assert a and b and (a.slot, b.slot) == (0, 1)
    procs.exits = [(a.pid, exited(0))]
    pool.reap()
    c = pool.spawn()
    assert c and c.slot == 0


# -- the loop's steps --------------------------------------------------------------------------
def test_maintain_spawns_to_target_and_respects_backoff(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=3)
    arb.turn()
    assert len(procs.spawned) == 3
    victim = next(iter(arb.pool.workers.values()))
    clock.advance(0.2)
    procs.exits = [(victim.pid, exited(1))]
    arb.turn()
    assert len(procs.spawned) == 3  # backing off 0.5 s
    assert arb.gate.released == [victim.owner]  # type: ignore[attr-defined]
    clock.advance(0.6)
    arb.turn()
    assert len(procs.spawned) == 4 and len(arb.pool.active()) == 3


def test_every_exit_is_released_and_one_that_left_a_lease_is_a_crash(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=3)
    arb.turn()
    a, b, c = list(arb.pool.workers.values())
    arb.gate.held[b.owner] = 1  # type: ignore[attr-defined]
    clock.advance(10)  # long-lived: a crash, but no crash-loop backoff
    procs.exits = [(a.pid, exited(wexit.OK)), (b.pid, exited(wexit.OK)),
                   (c.pid, killed(signal.SIGKILL))]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="supervisor"):
        arb.turn()
    assert arb.gate.released == [a.owner, b.owner, c.owner]  # type: ignore[attr-defined]
    kinds = {r.fields["worker"]: r.fields["kind"] for r in caplog.records  # type: ignore[attr-defined]
             if getattr(r, "event", "") == "worker_exited"}  # fmt: skip
    assert kinds == {a.pid: "stopped", b.pid: "crashed", c.pid: "crashed"}
    (line,) = [r.getMessage() for r in caplog.records if str(b.pid) in r.getMessage()
               and getattr(r, "event", "") == "worker_exited"]  # fmt: skip
    assert "exited with code 0" in line and "holding 1 lease(s): crashed" in line
    assert len(procs.spawned) == 6  # replaced at once


def test_no_fast_release_counts_a_dead_workers_leases_but_leaves_them_to_the_ttl(
    clock: FakeClock,
) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=2, fast_release=False)
    arb.turn()
    a, b = list(arb.pool.workers.values())
    arb.gate.held[a.owner] = 2  # type: ignore[attr-defined]
    procs.exits = [(a.pid, exited(wexit.OK)), (b.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert arb.gate.released == []  # type: ignore[attr-defined]
    assert arb.gate.counted == [a.owner, b.owner]  # type: ignore[attr-defined]
    assert arb.pool.crash_streak == 2  # an early exit 0 holding leases is a boot crash too
    clock.advance(5)
    arb.turn()
    arb.pool.kill_now(c := next(iter(arb.pool.workers.values())), "fast stop")
    procs.exits = [(c.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert arb.gate.released == [c.owner]  # type: ignore[attr-defined]  # we killed it


def test_failed_release_is_retried(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=1)
    arb.turn()
    (a,) = arb.pool.workers.values()
    arb.gate.fail = True  # type: ignore[attr-defined]
    procs.exits = [(a.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert arb.pending_release == {a.owner: pytest.approx(clock.now + 60)}
    arb.gate.fail = False  # type: ignore[attr-defined]
    arb.turn()
    assert arb.gate.released == [a.owner] and not arb.pending_release  # type: ignore[attr-defined]


def test_scale_down_retires_an_idle_worker_first(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=2)
    arb.turn()
    older, younger = sorted(arb.pool.workers.values(), key=lambda w: w.pid)
    arb.board.slot(older.slot).publish(older.pid, IDLE)
    arb.board.slot(younger.slot).publish(younger.pid, HANDLER, 7, 1)
    arb.inbox.queue.append(signal.SIGTTOU)
    arb.turn()
    assert (older.pid, signal.SIGTERM) in procs.sent and older.retiring == "scale down"
    assert younger.active
    for _ in range(3):  # never below one
        arb.inbox.queue.append(signal.SIGTTOU)
        arb.turn()
    assert arb.pool.target == 1


def test_graceful_stop_escalates_to_kill_then_finishes(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=2, graceful_timeout=5)
    arb.turn()
    a, b = list(arb.pool.workers.values())
    arb.inbox.queue.append(signal.SIGTERM)
    arb.turn()
    assert arb.phase is Phase.STOPPING
    assert sorted(procs.sent) == sorted([(a.pid, signal.SIGTERM), (b.pid, signal.SIGTERM)])
    procs.exits = [(a.pid, exited(0))]
    clock.advance(1)
    arb.turn()
    assert arb.gate.released == [a.owner]  # type: ignore[attr-defined]  # it held none
    clock.advance(5)
    arb.turn()
    assert (b.pid, signal.SIGKILL) in procs.sent
    procs.exits = [(b.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert arb.gate.released == [a.owner, b.owner]  # type: ignore[attr-defined]
    assert arb.phase is Phase.DONE and arb.exit_code == 0


def test_second_term_is_a_fast_stop(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=2)
    arb.turn()
    arb.inbox.queue.extend([signal.SIGTERM, signal.SIGTERM])
    arb.turn()
    assert arb.phase is Phase.FAST_STOPPING
    assert sum(1 for _, s in procs.sent if s == signal.SIGKILL) == 2


def test_boot_failure_stops_with_its_exit_code(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=2)
    arb.turn()
    a, b = list(arb.pool.workers.values())
    procs.exits = [(a.pid, exited(wexit.BOOT_FAILURE))]
    arb.turn()
    assert arb.phase is Phase.STOPPING and arb.exit_code == exitcodes.WORKER_BOOT
    procs.exits = [(b.pid, exited(0))]
    arb.turn()
    assert arb.phase is Phase.DONE and len(procs.spawned) == 2  # never replaced


def test_add_step_hook_runs_in_order(clock: FakeClock) -> None:
    seen: list[str] = []
    arb = make_arbiter(clock, FakeProcs(), workers=2)
    arb.add_step(Step("probe", lambda a: seen.append(f"{len(a.pool.workers)}")), before="maintain")
    arb.events.on("worker_started", lambda worker: seen.append("started"))
    arb.turn()
    assert seen[0] == "0" and seen.count("started") == 2


def test_max_tasks_jitter_stays_within_ten_percent() -> None:
    cfg = StartConfig(WorkerConfig(db="x", app="m:a"), max_tasks_per_worker=100).validate()
    values = {cfg.max_tasks_for_new_worker(random.Random(i)) for i in range(200)}
    assert min(values) >= 90 and max(values) <= 110 and len(values) > 5  # type: ignore[operator]


# -- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("workers", 0, "-n/--workers"),
        ("lease_ttl", 0, "--lease-ttl"),
        ("poll_interval", -1, "--poll-interval"),
        ("max_attempts", 0, "--max-attempts"),
        ("task_timeout", 0, "--task-timeout"),
        ("graceful_timeout", -1, "--graceful-timeout"),
        ("max_worker_memory", 0, "--max-worker-memory"),
        ("max_tasks_per_worker", 0, "--max-tasks-per-worker"),
        ("heartbeat_interval", 90, "--heartbeat-interval"),
        ("app", "nocolon", "--app"),
        ("log_format", "xml", "--log-format"),
    ],
)
def test_config_validate_names_the_option(field: str, value: Any, words: str) -> None:
    worker = WorkerConfig(db="x.db", app="m:app")
    if field in {f.name for f in dataclasses.fields(WorkerConfig)}:
        worker = dataclasses.replace(worker, **{field: value})
    config = StartConfig(worker)
    if worker == WorkerConfig(db="x.db", app="m:app"):
        setattr(config, field, value)
    with pytest.raises(ConfigError, match=words):
        config.validate()


# -- signals -----------------------------------------------------------------------------------
def test_inbox_records_and_wakes() -> None:
    inbox = SignalInbox()
    inbox.install()
    try:
        started = time.monotonic()
        os.kill(os.getpid(), signal.SIGTTIN)
        inbox.wait(5.0)
        assert time.monotonic() - started < 2.0
        assert inbox.pop_all() == [signal.SIGTTIN]
        with blocked():
            # aimed at this thread: a process-wide kill may be taken by another thread of the
            # test process (pytest-xdist's), which does not block it
            signal.pthread_kill(threading.get_ident(), signal.SIGTTOU)
            assert inbox.pop_all() == []  # blocked: pending, not delivered
        inbox.wait(1.0)
        assert inbox.pop_all() == [signal.SIGTTOU]
    finally:
        inbox.uninstall()
        inbox.close()
    assert signal.getsignal(signal.SIGTTIN) is signal.SIG_DFL


# -- pidfile -----------------------------------------------------------------------------------
def test_pidfile_lock_refusal_stale_and_reused_pid(tmp_path: Path) -> None:
    path = str(tmp_path / "s.pid")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"""
import sys, time
sys.path.insert(0, {os.getcwd()!r})
from supervisor.loop.pidfile import Pidfile
p = Pidfile({path!r}); p.acquire(); print("held", flush=True); time.sleep(60)
"""],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(PidfileLocked, match=f"pid {holder.pid}"):
            Pidfile(path).acquire()
        assert live_pid(path) == holder.pid
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(NotRunning, match="stale"):
        live_pid(path)
    mine = Pidfile(path)
    mine.acquire()  # the kernel dropped the dead holder's lock
    assert live_pid(path) == os.getpid()
    mine.write_state({"tick": time.time(), "target": 3})
    state = read_state(path)
    assert state is not None and state["target"] == 3 and state["pid"] == os.getpid()
    assert state["tick"] == pytest.approx(time.time(), abs=5)
    mine.release()
    assert not os.path.exists(path)

    Path(path).write_text(f"{os.getpid()}\n")  # our pid, but the file predates our start
    os.utime(path, (1_000_000, 1_000_000))
    with pytest.raises(NotRunning, match="reused"):
        live_pid(path)


# -- logs --------------------------------------------------------------------------------------
def test_json_logs_carry_the_event_and_no_timestamp_under_journald(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    logs.setup("json", stream)
    logs.event("worker_started", "worker 5 started", worker=5)
    doc = json.loads(stream.getvalue())
    assert doc["event"] == "worker_started" and doc["worker"] == 5 and "ts" not in doc
    assert doc["pid"] == os.getpid()

    stream = io.StringIO()
    monkeypatch.delenv("JOURNAL_STREAM")
    logs.setup("text", stream)
    logs.event("x", "hello")
    line = stream.getvalue()
    assert line[:4].isdigit() and "supervisor[" in line and line.rstrip().endswith("hello")
    logging.getLogger("supervisor").handlers.clear()


def test_progress_line_only_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain, tty = io.StringIO(), Tty()
    for stream in (plain, tty):
        progress = logs.Progress(stream)
        progress.show(logs.drain_progress(3, 10, 1, time.monotonic() - 2))
        progress.finish()
    assert plain.getvalue() == ""
    assert "3/10 runs done" in tty.getvalue() and "1 failed" in tty.getvalue()


def test_a_failing_fork_backs_off_instead_of_crashing_the_loop(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=1)

    def broken(slot: int, max_tasks: int | None) -> tuple[int, str]:
        raise OSError(11, "Resource temporarily unavailable")

    arb.pool.spawner = broken
    arb.turn()
    assert not arb.pool.workers and arb.pool.backoff_remaining() == 0.5
    arb.pool.spawner = procs.spawn
    arb.turn()
    assert not arb.pool.workers  # still backing off
    clock.advance(0.5)
    arb.turn()
    assert len(arb.pool.workers) == 1


def test_a_fault_injected_on_purpose_is_not_a_crash(clock: FakeClock) -> None:
    procs = FakeProcs()
    arb = make_arbiter(clock, procs, workers=1)
    arb.turn()
    (victim,) = arb.pool.workers.values()
    assert arb.pool.kill_on_purpose(victim)
    assert procs.sent == [(victim.pid, signal.SIGKILL)]
    procs.exits = [(victim.pid, killed(signal.SIGKILL))]
    arb.turn()
    assert arb.pool.backoff_remaining() == 0 and len(procs.spawned) == 2  # replaced at once
    assert arb.gate.released == [victim.owner]  # type: ignore[attr-defined]


def test_a_reaped_worker_is_never_signalled_again(clock: FakeClock) -> None:
    """Once reaped, a worker's pid may be another process's: a late signal for it (a chaos
    pause's SIGCONT) is not sent, and says the worker is gone."""
    procs = FakeProcs()
    pool = make_pool(clock, procs, target=1)
    worker = pool.spawn()
    assert worker is not None
    assert pool.send(worker, signal.SIGSTOP)  # alive, or dead and not reaped: ours to signal
    procs.exits = [(worker.pid, killed(signal.SIGKILL))]
    assert [e.worker for e in pool.reap()] == [worker]
    assert not pool.send(worker, signal.SIGCONT)
    assert not pool.kill_on_purpose(worker)
    assert procs.sent == [(worker.pid, signal.SIGSTOP)]


def test_the_chaos_report_counts_faults_per_process_and_leases_hit_apart() -> None:
    """A kill of a worker holding three leases (slots) is one fault that hit three leases."""
    from supervisor.chaos.report import summary_line  # noqa: PLC0415
    from supervisor.chaos.verifier import FaultEvent, Verifier  # noqa: PLC0415

    verifier = Verifier(ttl=1.0, poll_interval=0.1, fast_release=True)
    for task_id in (1, 2, 3):  # one victim, one moment, three leases
        verifier.record(FaultEvent("kill", 100, task_id, 1, 5.0, "handler", 2.0))
    verifier.record(FaultEvent("pause", 101, 4, 1, 6.0, "handler", 3.0))
    verifier.record(FaultEvent("kill", 102, 5, 1, 7.0, "handler", 2.0))
    report = verifier.report(spared=0)
    assert report["faults"] == {"kill": 2, "pause": 1}
    assert report["leases_hit"] == 5
    assert "3 faults (2 kill, 1 pause) on 5 leases" in summary_line(report)


def test_a_pause_cut_short_by_a_stop_is_no_zombie_write_but_one_past_the_ttl_is() -> None:
    """A stop resumes paused workers at once: one woken before its ttl ran out may still hold
    a live lease, so its commit is the fence's to judge; one woken after the ttl cannot."""
    from supervisor.chaos.verifier import FaultEvent, Verifier  # noqa: PLC0415

    class Done:  # the faulted attempt committed 0.6 s after the fault
        def get_task(self, task_id: int) -> Any:
            return type("T", (), {"attempts": 1, "claimed_at": 1.0, "done_at": 10.6,
                                  "done_attempt": 1, "run_id": 1})()  # fmt: skip

        def fence_rejections(self, after: int = 0) -> list[Any]:
            return []

        def integrity_violations(self) -> list[str]:
            return []

    verifier = Verifier(ttl=1.0, poll_interval=0.1, fast_release=False)
    early = FaultEvent("pause", 100, 1, 1, 10.0, "handler", 3.1, woke_at=10.55)
    late = FaultEvent("pause", 101, 1, 1, 10.0, "handler", 3.1, woke_at=11.2)
    for ev in (early, late):
        verifier.record(ev)
    verifier.observe(Done(), 12.0)  # type: ignore[arg-type]
    assert (early.outcome, late.outcome) == ("resumed_early", "committed_after_fault")
    assert len(verifier.violations) == 1 and "pid 101" in verifier.violations[0]
