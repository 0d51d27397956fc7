"""A worker's memory is what its supervisor had loaded when it forked, and what it loads itself:
a pool of plain handlers without --chaos, --pidfile, schedules, paid calls, webhook deliveries
or exported traces loads none of the modules only those need (``apps.lazy_app.HEAVY``: each
costs from 0.4 to 9 MB of RSS in every process), and a worker never imports ``supervisor``.
Counted in real processes, so nothing another test imported hides it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sv_harness import Supervisor

from workerproc import exitcodes
from workerproc.store import open_store


def test_a_standalone_worker_loads_no_heavy_module_and_never_the_supervisor(
    tmp_path: Path,
) -> None:
    from procs import spawn_worker  # noqa: PLC0415 - the process helpers

    db = str(tmp_path / "lazy.db")
    with open_store(db) as store:  # migrated here: the worker finds the schema current
        run = store.start_run("heavy")
        worker = spawn_worker(db, tmp_path, "--app", "apps.lazy_app:app", "--max-tasks", "1")
        assert worker.wait(60) == exitcodes.RECYCLE, worker.output()
        result = store.get_run(run)
    assert result is not None and result.result == [], result


def driver_modules() -> set[str]:
    """What PostgreSQL's driver loads itself (psycopg imports asyncio, and ssl with it)."""
    probe = "import json, sys, psycopg; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    return set(json.loads(out.stdout))


def test_a_forked_worker_of_a_plain_pool_loads_no_heavy_module(sv_each: Supervisor) -> None:
    """On each backend: the supervisor imports neither chaos mode, nor the pidfile's lock, nor
    what schedules, paid calls, signatures or tracing need before it forks (on PostgreSQL,
    beside what its driver loads)."""
    driver = driver_modules() if sv_each.db.startswith("postgresql") else set()
    with open_store(sv_each.db) as store:
        run = store.start_run("heavy")
    sv_each.start("--drain", n=1, app="apps.lazy_app:app", pidfile=False)
    assert sv_each.wait_exit(60) == 0, sv_each.text()
    with open_store(sv_each.db) as store:
        result = store.get_run(run)
    assert result is not None and result.status == "succeeded", result
    forked = [m for m in result.result if m not in driver and (
              m.split(".")[0] != "supervisor" or m.startswith("supervisor.chaos"))]  # fmt: skip
    assert forked == [], forked
