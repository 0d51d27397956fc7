"""Recovery with real forks: fast release vs the ttl path, crash-loop backoff, boot failure,
recycling by task count and by memory, --drain, the pidfile, and leases left by a previous
supervisor's dead workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests, marker_lines

from supervisor import exitcodes
from workerproc.store import open_store

pytestmark = pytest.mark.slow


def _kill_holder_and_time_takeover(sv: Supervisor) -> float:
    marker = sv.workdir / "m"
    wait_for(lambda: marker_lines(marker), what="a worker to take the task")
    holder, attempt = marker_lines(marker)[0]
    assert attempt == 1
    os.kill(holder, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: len(marker_lines(marker)) >= 2, timeout=30, what="the takeover")
    took = time.monotonic() - killed_at
    new_holder, new_attempt = marker_lines(marker)[1]
    assert new_holder != holder and new_attempt == 2
    return took


def test_fast_release_hands_a_dead_workers_task_over_at_once(sv: Supervisor) -> None:
    sv.enqueue("hold", {"marker": str(sv.workdir / "m"), "s": 60})
    sv.start("--lease-ttl", "30", n=2)
    took = _kill_holder_and_time_takeover(sv)
    assert took < 5.0  # bounded generously here; scripts/measure_fast_release.py measures it
    assert sv.events("leases_released")


def test_no_fast_release_waits_for_the_ttl(sv: Supervisor) -> None:
    sv.enqueue("hold", {"marker": str(sv.workdir / "m"), "s": 60})
    sv.start("--lease-ttl", "2", "--no-fast-release", n=2)
    took = _kill_holder_and_time_takeover(sv)
    # heartbeats renew every ttl/3, so at least 2/3 of the ttl was left at the kill
    assert took >= 1.2
    assert not sv.events("leases_released")


def test_crash_loop_backs_off_exponentially(sv: Supervisor) -> None:
    sv.enqueue("crash")
    sv.start("--max-attempts", "100", n=1)
    backoffs = [e["backoff"] for e in sv.wait_event("restart_backoff", count=3)]
    assert backoffs[:3] == [0.5, 1.0, 2.0]
    exits = sv.events("worker_exited")
    assert all(e["kind"] == "crashed" and e["code"] == 9 for e in exits)
    # the backoff is real: starts are spaced by at least the announced delays
    starts = [e["ts"] for e in sv.events("worker_started")]
    assert len(starts) >= 3 and starts[2] - starts[1] >= 0.9
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0


def test_a_worker_that_cannot_boot_stops_the_supervisor(sv: Supervisor) -> None:
    sv.enqueue("boot_fail")
    sv.start(n=2)
    assert sv.wait_exit() == exitcodes.WORKER_BOOT
    assert sv.events("boot_failure")
    assert not sv.workers()


def test_drain_processes_everything_then_exits_0(sv: Supervisor) -> None:
    runs = [sv.enqueue("chain", {"left": 2}) for _ in range(15)]
    runs += [sv.enqueue("noop") for _ in range(15)]
    sv.start("--drain", n=2)
    assert sv.wait_exit(60) == 0
    assert {sv.run_status(r) for r in runs} == {"succeeded"}
    assert sv.events("drain_finished")
    assert sv.stats().pending_work == 0


def test_recycle_by_task_count(sv: Supervisor) -> None:
    runs = [sv.enqueue("noop") for _ in range(12)]
    sv.start("--drain", "--max-tasks-per-worker", "3", n=1)
    assert sv.wait_exit(60) == 0
    assert {sv.run_status(r) for r in runs} == {"succeeded"}
    recycled = [e for e in sv.events("worker_exited") if e["kind"] == "recycled"]
    assert len(recycled) >= 3
    assert not sv.events("restart_backoff")  # a planned replacement is not a crash


def test_recycle_by_memory(sv: Supervisor) -> None:
    run = sv.enqueue("grow", {"mb": 120})
    sv.start("--max-worker-memory", "80", n=1)
    wait_for(lambda: sv.run_status(run) == "succeeded", what="the growing task")
    event = sv.wait_event("worker_recycle_memory")[0]
    assert event["rss_mb"] > 80
    exited = sv.wait_event("worker_exited")[0]
    assert exited["worker"] == event["worker"] and exited["kind"] == "retired"
    assert exited["code"] == 0  # graceful: it finished its task first
    sv.wait_event("worker_started", count=2)  # replaced
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0


def test_pidfile_refuses_a_second_supervisor_and_survives_a_stale_file(
    sv: Supervisor, tmp_path: Path
) -> None:
    sv.start(n=1)
    sv.wait_event("ready")
    workers = sv.workers()
    lock = sv.pidfile + ".lock"
    for pid in workers:  # workers do not keep the pidfile lock open
        fds = os.listdir(f"/proc/{pid}/fd")
        assert all(os.path.realpath(f"/proc/{pid}/fd/{fd}") != lock for fd in fds)

    second = Supervisor(tmp_path, name="sv")  # the same pidfile
    second.log_path = tmp_path / "second.log"
    second.start(n=1)
    try:
        assert second.wait_exit() == exitcodes.PIDFILE_LOCKED
    finally:
        second.kill_all()
    lines = second.text().strip().splitlines()
    assert len(lines) == 1 and "another supervisor" in lines[0] and "Traceback" not in lines[0]

    sv.signal(signal.SIGKILL)  # leaves a stale pidfile behind
    sv.wait_exit()
    wait_for(lambda: not sv.workers(), what="the orphaned worker to die")
    assert os.path.exists(sv.pidfile)
    cmd = [sys.executable, "-m", "supervisor", "stop", "--pidfile", sv.pidfile]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env_with_tests())
    assert out.returncode == exitcodes.NOT_RUNNING and "stale" in out.stderr

    third = Supervisor(tmp_path, name="sv")
    third.log_path = tmp_path / "third.log"
    third.start(n=1)
    try:
        third.wait_event("ready")
        cmd = [sys.executable, "-m", "supervisor", "health", "--pidfile", sv.pidfile]
        out = wait_for(
            lambda: (
                r
                if (r := subprocess.run(cmd, capture_output=True, text=True)).returncode == 0
                else None
            ),
            what="health to pass",
        )
        assert "healthy" in out.stdout
        third.signal(signal.SIGTERM)
        assert third.wait_exit() == 0
        assert not os.path.exists(sv.pidfile)  # removed on a clean exit
    finally:
        third.kill_all()


def test_start_releases_leases_of_dead_workers_on_this_host(sv: Supervisor) -> None:
    run = sv.enqueue("noop")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    start = f"{psutil.Process(dead.pid).create_time():.2f}"
    dead.wait()
    owner = f"{socket.gethostname()}:{dead.pid}:{start}:deadbeef"
    store = open_store(sv.db)
    try:
        assert store.claim(owner, ttl=600) is not None
    finally:
        store.close()
    sv.start("--drain", n=1)
    assert sv.wait_exit(60) == 0  # without the release, the lease would hold for 600 s
    released = sv.events("leases_released")
    assert released and released[0]["owner"] == owner
    assert sv.run_status(run) == "succeeded"


def test_operator_reads_never_hide_worker_commits(sv: Supervisor) -> None:
    """An operator's `status` opens and closes a connection while workers run. If a worker's
    process had lost its SQLite locks (POSIX locks drop when any descriptor of the file closes),
    that close would checkpoint and delete the WAL under the workers' feet and every later
    commit would be invisible to other processes — and lost."""
    sv.start(n=1)
    first = sv.enqueue("noop")
    wait_for(lambda: sv.run_status(first) == "succeeded", what="the first run")
    status = [sys.executable, "-m", "supervisor", "status", "--db", sv.db]
    for _ in range(3):
        out = subprocess.run(status, capture_output=True, text=True, env=env_with_tests())
        assert out.returncode == 0, out.stderr
    assert os.path.exists(sv.db + "-wal")  # nobody deleted the WAL while workers use it
    second = sv.enqueue("noop")
    wait_for(lambda: sv.run_status(second) == "succeeded", timeout=15, what="the second run")
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0
