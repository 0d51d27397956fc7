"""Idle pickup latency and takeover after SIGKILL for standalone workers (no supervisor).

    scripts/bench worker [--workers 8] [--samples 200] [--quick]

Pickup: one task at a time into an idle pool with default settings (poll interval 1 s), from
enqueue (wall clock) to the handler's first line (wall clock, same host). Takeover: SIGKILL the
holder of a long task; time until another worker claims it (the ttl path: no supervisor here
to release the dead owner's lease).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_args

from workerproc.store import Store, open_store

HERE = Path(__file__).resolve().parent


def spawn(db: str, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "workerproc", "--db", db, "--app", "benchapp:app", *args]
    return subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_run(store: Store, run_id: int, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = store.get_run(run_id)
        if run is not None and run.status == "succeeded":
            return run.result
        time.sleep(0.001)
    raise TimeoutError(f"run {run_id} not done in {timeout} s")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def pickup(db: str, workers: int, samples: int) -> list[float]:
    procs = [spawn(db) for _ in range(workers)]
    store = open_store(db)
    try:
        wait_run(store, store.start_run("noop"))  # everyone is up
        time.sleep(2.0)  # and idle
        latencies = []
        for _ in range(samples):
            t0 = time.time()
            started = wait_run(store, store.start_run("stamp"))
            assert isinstance(started, float)
            latencies.append((started - t0) * 1000)
            time.sleep(random.uniform(0.05, 0.3))  # idle gaps of varying length
        return latencies
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        store.close()


def takeover(db: str, ttl: float, rounds: int) -> list[float]:
    store = open_store(db)
    procs = [spawn(db, "--lease-ttl", str(ttl)) for _ in range(2)]
    times = []
    try:
        for _ in range(rounds):
            run_id = store.start_run("hold", 3 * ttl)
            deadline = time.monotonic() + 30
            while not store.stats().leases and time.monotonic() < deadline:
                time.sleep(0.001)
            (lease,) = store.stats().leases
            pid = int(lease.owner.split(":")[1])
            os.kill(pid, signal.SIGKILL)
            killed = time.time()
            while store.get_tasks(run_id)[0].attempts < 2:
                time.sleep(0.001)
            times.append(time.time() - killed)
            procs = [p for p in procs if p.pid != pid] + [spawn(db, "--lease-ttl", str(ttl))]
            wait_run(store, run_id)
        return times
    finally:
        for p in procs:
            p.kill()
            p.wait()
        store.close()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench worker``."""
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--ttl", type=float, default=2.0)
    bench_args.add_quick(ap)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.workers, args.samples = 2, 20
    with tempfile.TemporaryDirectory() as tmp:
        lat = pickup(os.path.join(tmp, "pickup.db"), args.workers, args.samples)
        tk = takeover(os.path.join(tmp, "takeover.db"), args.ttl, 2 if args.quick else 5)
    print(f"| measure ({args.workers} idle workers, defaults) | p50 | p99 | max |")
    print("| --- | --- | --- | --- |")
    print(f"| idle pickup, enqueue -> handler (ms) | {statistics.median(lat):.1f} | "
          f"{pct(lat, 99):.1f} | {max(lat):.1f} |")  # fmt: skip
    print(f"| takeover after SIGKILL, ttl path, ttl {args.ttl:g} s (s) | "
          f"{statistics.median(tk):.2f} | {pct(tk, 99):.2f} | {max(tk):.2f} |")  # fmt: skip
    return 0
