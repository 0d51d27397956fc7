"""The supervisor's signals with real forks: TERM/INT graceful, graceful timeout, a second
TERM or QUIT fast, HUP rolling restart with a re-imported app, TTIN/TTOU, and SIGKILL of the
supervisor leaving no worker behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests, gone, marker_lines

from workerproc.store import open_store

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_term_and_int_let_the_running_task_finish(sv: Supervisor, signum: int) -> None:
    run = sv.enqueue("hold", {"marker": str(sv.workdir / "m"), "s": 1.0})
    sv.start(n=2)
    wait_for(lambda: marker_lines(sv.workdir / "m"), what="the task to start")
    workers = sv.workers()
    sv.signal(signum)
    assert sv.wait_exit() == 0
    assert sv.run_status(run) == "succeeded"  # finished, not abandoned
    assert gone(workers)
    assert sv.stats().leased == 0
    assert sv.events("stopping")


def test_graceful_timeout_kills_leftovers_and_releases_their_leases(sv: Supervisor) -> None:
    run = sv.enqueue("hold", {"marker": str(sv.workdir / "m"), "s": 60})
    sv.start("--graceful-timeout", "0.5", n=1)
    wait_for(lambda: marker_lines(sv.workdir / "m"), what="the task to start")
    started = time.monotonic()
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0
    assert time.monotonic() - started < 20
    assert sv.events("worker_killed")
    stats = sv.stats()
    assert (stats.leased, stats.ready + stats.expired) == (0, 1)  # handed back, not stuck
    assert sv.run_status(run) == "pending"  # nothing leases it: claimable, not "running"


@pytest.mark.parametrize("how", ["second TERM", "QUIT"])
def test_second_term_or_quit_stops_fast(sv: Supervisor, how: str) -> None:
    sv.enqueue("hold", {"marker": str(sv.workdir / "m"), "s": 60})
    sv.start(n=2)  # graceful timeout 30 s: a fast stop must not wait for it
    wait_for(lambda: marker_lines(sv.workdir / "m"), what="the task to start")
    workers = sv.workers()
    started = time.monotonic()
    if how == "QUIT":
        sv.signal(signal.SIGQUIT)
    else:
        sv.signal(signal.SIGTERM)
        sv.wait_event("stopping")
        sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0
    assert time.monotonic() - started < 15
    assert sv.events("fast_stop")
    assert gone(workers)
    stats = sv.stats()
    assert stats.leased == 0 and stats.ready + stats.expired == 1


APP_V1 = """
from workerproc import App
app = App()

@app.task("version")
def version(ctx):
    return {"version": VERSION}

VERSION = "v1"
"""


def test_hup_reimports_the_app_and_rolls_workers_without_dropping_below_n(
    sv: Supervisor, tmp_path: Path
) -> None:
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    module = code_dir / "hupapp.py"
    module.write_text(APP_V1)
    sv.extra_path = str(code_dir)
    sv.start(n=2, app="hupapp:app")
    sv.wait_event("ready")
    before = set(sv.workers())
    assert len(before) == 2

    module.write_text(APP_V1.replace('"v1"', '"v2-reloaded"'))
    sv.signal(signal.SIGHUP)
    sv.wait_event("reloaded")
    after = set(sv.wait_workers(2))
    assert not before & after  # every worker replaced

    # never fewer than 2 workers alive: replay starts and exits from the log
    alive, lowest = 0, 99
    for e in sv.events():
        if e["event"] == "worker_started":
            alive += 1
        elif e["event"] == "worker_exited":
            alive -= 1
            lowest = min(lowest, alive)
    assert lowest >= 2

    run = sv.enqueue("version")
    wait_for(lambda: sv.run_status(run) == "succeeded", what="the run on the new code")
    store_result = _result(sv, run)
    assert store_result == {"version": "v2-reloaded"}

    module.write_text("raise SyntaxError('broken on purpose')\n")
    sv.signal(signal.SIGHUP)
    sv.wait_event("reload_failed")
    assert set(sv.workers()) == after  # a broken reload keeps the running workers
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0


def _result(sv: Supervisor, run_id: int) -> object:
    store = open_store(sv.db)
    try:
        run = store.get_run(run_id)
        assert run is not None
        return run.result
    finally:
        store.close()


def test_ttin_ttou_and_scale_command(sv: Supervisor) -> None:
    sv.start(n=1)
    sv.wait_event("ready")
    sv.signal(signal.SIGTTIN)
    sv.wait_workers(2)
    for _ in range(3):  # never below one
        sv.signal(signal.SIGTTOU)
        sv.wait_event("signal", count=2 + _)
    sv.wait_workers(1)
    scale = [sys.executable, "-m", "supervisor", "scale", "--pidfile", sv.pidfile]
    out = subprocess.run([*scale, "+2"], capture_output=True, text=True, env=env_with_tests())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "workers: 1 -> 3"
    sv.wait_workers(3)
    out = subprocess.run([*scale, "2"], capture_output=True, text=True, env=env_with_tests())
    assert out.stdout.strip() == "workers: 3 -> 2"
    sv.wait_workers(2)
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0


def test_sigkill_of_the_supervisor_leaves_no_worker(sv: Supervisor) -> None:
    sv.enqueue("hold", {"marker": str(sv.workdir / "m"), "s": 60})
    sv.start(n=3)
    workers = sv.wait_workers(3)
    wait_for(lambda: marker_lines(sv.workdir / "m"), what="a worker inside a task")
    sv.signal(signal.SIGKILL)
    started = time.monotonic()
    wait_for(lambda: gone(workers), timeout=10, what="orphaned workers to die")
    assert time.monotonic() - started <= 3.0
