"""A real supervisor with slots: `status` and the metrics show busy slots, a SIGKILLed worker's
every lease is released at once and taken over, and recycling by task count still works."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests

from workerproc.store import open_store

pytestmark = pytest.mark.slow


def status_json(sv: Supervisor) -> dict[str, object]:
    cmd = [sys.executable, "-m", "supervisor", "status", "--db", sv.db, "--pidfile", sv.pidfile,
           "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env_with_tests())
    assert out.returncode == 0, out.stderr
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


def test_status_and_metrics_show_busy_slots_and_a_killed_worker_loses_every_lease(
    sv: Supervisor,
) -> None:
    release = sv.workdir / "release"
    runs = [sv.enqueue("wait_file", {"release": str(release)}) for _ in range(8)]
    sv.start("--concurrency", "4", "--metrics-port", "0", n=2)
    wait_for(lambda: sv.stats().leased == 8, timeout=60, what="eight leases on two workers")

    def busy_rows() -> list[dict[str, object]] | None:
        rows = status_json(sv)["workers"]
        assert isinstance(rows, list)
        return rows if sum(int(r["busy"]) for r in rows) == 8 else None

    rows = wait_for(busy_rows, timeout=30, what="status to show 8 busy slots")
    assert {(r["busy"], r["slots"], r["leases"]) for r in rows} == {(4, 4, 4)}

    (listening,) = sv.wait_event("metrics_listening")
    url = f"http://127.0.0.1:{listening['port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    assert re.search(r'leasekeeper_slots\{state="busy"\} 8(\.0)?\n', text), text

    victim = int(rows[0]["pid"])  # type: ignore[call-overload]
    os.kill(victim, signal.SIGKILL)
    (released,) = sv.wait_event("leases_released")
    assert released["count"] == 4  # every lease of the dead worker, at once
    wait_for(lambda: (sv.stats().leased == 8 and victim not in sv.workers()) or None,
             timeout=60, what="its four tasks taken over")  # fmt: skip
    release.touch()
    wait_for(lambda: sv.stats().runs.get("succeeded") == 8, timeout=60, what="all done")
    with open_store(sv.db) as store:
        attempts = sorted(t.attempts for r in runs for t in store.get_tasks(r))
    assert attempts == [1] * 4 + [2] * 4  # the victim's four ran again, the others once


def test_recycling_by_task_count_with_slots(sv: Supervisor) -> None:
    runs = [sv.enqueue("noop") for _ in range(40)]
    sv.start("--drain", "--concurrency", "4", "--max-tasks-per-worker", "10", n=1)
    assert sv.wait_exit(60) == 0
    assert {sv.run_status(r) for r in runs} == {"succeeded"}
    recycled = [e for e in sv.events("worker_exited") if e["kind"] == "recycled"]
    assert len(recycled) >= 2
    assert not sv.events("restart_backoff")


def test_worker_log_lines_are_events_with_fields(sv: Supervisor) -> None:
    """--log-format json: a worker's line names its event and carries its fields, like the
    supervisor's (one event() for both sides)."""
    run_id = sv.enqueue("fails")
    sv.start("--drain", "--max-attempts", "1", n=1)
    assert sv.wait_exit(60) == 0
    (failed,) = [e for e in sv.events("task_failed") if e.get("run_id") == run_id]
    assert failed["logger"].startswith("workerproc")
    assert (failed["task"], failed["attempt"], failed["error"]) == ("fails", 1, "ValueError")
    (running,) = sv.events("worker_running")[:1]
    assert running["concurrency"] == 1 and running["owner"]
