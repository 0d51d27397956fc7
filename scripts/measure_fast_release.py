"""Measure takeover after a worker's SIGKILL, with and without the supervisor's fast release.

Runs ``supervisor start -n 2 --lease-ttl 30`` on a scratch database, then repeatedly: enqueue a
task that blocks until released, wait until a worker holds it, SIGKILL that worker, and time
the new claim (attempt 2). The claim time comes from the database: a claim sets
``lease_expires_at = now + ttl``, so ``claimed_at = expires_at - ttl`` (no polling error).

    .venv/bin/python scripts/measure_fast_release.py [--trials 20] [--ttl-path]

``--ttl-path`` adds ``--no-fast-release`` with a 2 s ttl to show the path it replaces.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from supervisor.config import Timing  # noqa: E402
from workerproc.identity import parse_owner  # noqa: E402
from workerproc.store import Store, TaskInfo, open_store  # noqa: E402

CRASH_WINDOW = Timing().crash_window


def wait(predicate, timeout=60.0, what=""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.002)


def attempt(store: Store, run_id: int, n: int) -> TaskInfo | None:
    """The run's task once it is leased with attempt ``n``."""
    return next((t for t in store.get_tasks(run_id) if t.lease_owner and t.attempts == n), None)


def finished(store: Store, run_id: int) -> bool:
    run = store.get_run(run_id)
    return run is not None and run.status == "succeeded"


def measure(
    trials: int, ttl: float, fast: bool, verbose: bool, db: str | None = None
) -> list[float]:
    """Takeover times (ms); ``db``: a database URL (PostgreSQL, say) instead of a new file."""
    work = Path(tempfile.mkdtemp(prefix="lk-takeover-"))
    if verbose:
        print(f"work directory: {work}", file=sys.stderr)
    db = db or str(work / "lk.db")
    open_store(db).close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", "4", "--db", db]
    cmd += ["--app", "apps.sv_app:app", "--lease-ttl", str(ttl), "--log-format", "json"]
    if not fast:
        cmd.append("--no-fast-release")
    log = open(work / "supervisor.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stderr=log, env=env, start_new_session=True)
    store = open_store(db)
    results: list[float] = []
    try:
        for i in range(trials):
            release = work / f"release-{i}"
            run_id: int = store.start_run("wait_file", {"release": str(release)})
            task = wait(lambda r=run_id: attempt(store, r, 1), what="the first claim")
            owner = parse_owner(task.lease_owner or "")
            assert owner is not None
            # A worker killed within 5 s of its start counts as a boot crash and the supervisor
            # backs off before replacing it: only kill holders older than that.
            age = time.time() - psutil.Process(owner.pid).create_time()
            time.sleep(max(0.05, CRASH_WINDOW + 1.5 - age))  # create_time is +-1 s
            killed_at = time.time()
            os.kill(owner.pid, signal.SIGKILL)
            taken = wait(lambda r=run_id: attempt(store, r, 2), ttl * 3 + 30, "the takeover")
            seen_at = time.time()
            claimed_at = taken.lease_expires_at - ttl
            if verbose:
                db_ms, seen_ms = (claimed_at - killed_at) * 1000, (seen_at - killed_at) * 1000
                print(f"trial {i}: claim {db_ms:.1f} ms, seen {seen_ms:.1f} ms", file=sys.stderr)
            results.append((claimed_at - killed_at) * 1000)
            release.touch()
            wait(lambda r=run_id: finished(store, r), what="the run to finish")
    finally:
        store.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    return results


def report(name: str, values: list[float]) -> None:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(
        f"{name}: n={len(values)} p50={statistics.median(values):.1f} ms "
        f"p99={p99:.1f} ms max={ordered[-1]:.1f} ms min={ordered[0]:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--ttl-path", action="store_true", help="also measure --no-fast-release")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every trial")
    args = parser.parse_args()
    fast = measure(args.trials, 30.0, True, args.verbose)
    report("fast release (ttl 30 s)", fast)
    if args.ttl_path:
        slow = measure(max(3, args.trials // 4), 2.0, False, args.verbose)
        report("ttl path (ttl 2 s, --no-fast-release)", slow)


if __name__ == "__main__":
    main()
