"""Cancel in flight (B15), end to end with a real supervisor, on every backend:
``supervisor cancel RUN`` (or ``store.cancel_run``) reaches the worker holding the run's lease at
its next renewal. A plain handler on a slot thread gets ``RunCancelled`` at its next ctx call, one
in the inline executor (one slot) at once, an async one is cancelled; nothing of the run is
written after the cancel (the worker ends its lease under the fence), and the worker goes on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests

from workerproc.store import open_store

pytestmark = pytest.mark.slow

APP = "apps.cancel_app:app"
TTL = 4.5  # a renewal every 1.5 s: "within one heartbeat"
INTERVAL = TTL / 3
MARGIN = 5.0  # a loaded machine's scheduling, the CLI's own start-up
MODES = {  # mode: (concurrency, task, payload extras, how it is cancelled)
    "thread": (2, "spin", {"calls": True}, "cli"),
    "inline": (1, "spin", {}, "cli"),
    "async": (2, "spin_async", {}, "store"),
}


def notes(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except OSError:
        return []


def note_of(path: Path, ev: str, run_id: int) -> dict[str, Any] | None:
    return next((n for n in notes(path) if n["ev"] == ev and n["run"] == run_id), None)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_cancel_reaches_the_running_handler_within_one_heartbeat(
    tmp_path: Path, db: str, mode: str
) -> None:
    concurrency, task, extra, how = MODES[mode]
    log = tmp_path / "handlers.jsonl"
    sv = Supervisor(tmp_path)
    sv.db = db
    with open_store(db) as store:
        run_id = store.start_run(task, {"log": str(log), **extra}, state={"step": 1})
    sv.start("--lease-ttl", str(TTL), "--concurrency", str(concurrency), app=APP, n=1)
    try:
        started = wait_for(lambda: note_of(log, "start", run_id), timeout=60, what="the start")
        before = time.time()
        if how == "cli":
            cmd = [sys.executable, "-m", "supervisor", "cancel", str(run_id), "--db", db]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                 env=env_with_tests())  # fmt: skip
            assert out.returncode == 0 and out.stdout.strip() == f"run {run_id} cancelled", out
        else:
            with open_store(db) as store:
                assert store.cancel_run(run_id)
        heard = wait_for(lambda: note_of(log, "cancelled", run_id), timeout=30,
                         what=f"the {mode} handler to hear the cancel")  # fmt: skip
        latency = heard["t"] - before
        print(f"{mode} on {'postgres' if '://' in db else 'sqlite'}: cancel -> handler "
              f"interrupted in {latency:.3f}s (renewal interval {INTERVAL:g}s)")  # fmt: skip
        assert latency < INTERVAL + MARGIN, latency
        assert heard["pid"] == started["pid"]
        if task == "spin":
            # its late finish raised (noted just after "cancelled": waited for, not read at once)
            wait_for(lambda: note_of(log, "finish_refused", run_id), timeout=30,
                     what="the handler's late finish to be refused")  # fmt: skip

        def released() -> bool:
            with open_store(db) as store:
                (only,) = store.get_tasks(run_id)
                return only.lease_owner is None

        wait_for(released, timeout=30, what="the cancelled run's lease released")
        with open_store(db) as store:
            run = store.get_run(run_id)
            assert run is not None
            assert (run.status, run.state, run.revision, run.result, run.last_error) == (
                "cancelled", {"step": 1}, 0, None, None,
            )  # fmt: skip
            (task_row,) = store.get_tasks(run_id)  # no next task; this one kept for a retry
            assert task_row.done_at is None and (task_row.last_error or "").startswith("RunCancel")
            (ended,) = store.attempt_history(run_id)
            assert (ended.outcome, ended.attempt) == ("released", 1)
            assert store.run_rejections(run_id) == []  # no write was sent that the fence refused
            # the same worker goes on claiming other work
            after = store.start_run("quick_async" if mode == "async" else "quick")
            done = store.wait(after, timeout=60)
            assert done.status == "succeeded" and done.result == {"pid": started["pid"]}
            assert store.get_run(run_id) == run  # and nothing of the cancelled run moved since
        said = [e for e in sv.events("run_cancelled") if e.get("run_id") == run_id]
        assert len(said) == 1, sv.text()[-3000:]
        assert f"run {run_id} cancelled in flight" in said[0]["msg"]
    finally:
        sv.kill_all()


def test_a_cancel_stops_only_its_own_slot(tmp_path: Path, db: str) -> None:
    """Two runs on two slot threads of one worker: cancelling one leaves the other running (its
    lease renewed, its handler never told), until it is cancelled in turn."""
    log = tmp_path / "handlers.jsonl"
    sv = Supervisor(tmp_path)
    sv.db = db
    with open_store(db) as store:
        first, second = store.start_runs(
            [{"task": "spin", "payload": {"log": str(log), "calls": True}}] * 2
        )
    sv.start("--lease-ttl", str(TTL), "--concurrency", "2", app=APP, n=1)
    try:
        for run_id in (first, second):
            wait_for(lambda r=run_id: note_of(log, "start", r), timeout=60, what="both starts")
        with open_store(db) as store:
            assert store.cancel_run(first)
            wait_for(lambda: note_of(log, "cancelled", first), timeout=30, what="the cancel")
            renewed = store.get_tasks(second)[0].lease_expires_at
            # two more renewals of the neighbour, and it never heard a word
            wait_for(lambda: (store.get_tasks(second)[0].lease_expires_at or 0) > (renewed or 0)
                     + INTERVAL, timeout=30, what="the neighbour renewed on")  # fmt: skip
            assert note_of(log, "cancelled", second) is None
            run = store.get_run(second)
            assert run is not None and run.status == "running"
            assert store.cancel_run(second)
            wait_for(lambda: note_of(log, "cancelled", second), timeout=30, what="the second")
            assert store.fence_rejections() == []
    finally:
        sv.kill_all()
