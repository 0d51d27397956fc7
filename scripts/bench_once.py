"""A paid call's keep latency (p99 <= 10 ms at load <= 2): from fn's return to
``ctx.once``'s return (the answer kept in the database), on SQLite and PostgreSQL, under a real
supervisor (``supervisor start -n N --drain``) draining runs of one paid call each whose fn
returns at once (scripts/benchapp_once.py). Each run's handler times its own call and splits
it in three: fn's return -> the keep begins (checks, the hand-off to the thread that keeps),
the keep (the database's transaction; on SQLite its wait for the write lock and its COMMIT
apart), the keep's end -> ``once`` returns (the hand-back).

    scripts/bench once [--runs 2000] [--backends sqlite,postgres] [--work-ms 10]
                       [--configs "2x1,4x1,2x2"]

``--configs``: pools of WORKERSxCONCURRENCY (concurrency 1: the handler runs on the worker's
main thread and its calls go to the paid-call thread; more: each slot thread keeps on its own
connection). ``--work-ms``: what each handler does after its call (a sleep), so the pool is
not claim-bound and the load stays low; the CPU's busy share and the load (the processes
runnable, sampled while the pool runs) are printed beside the figures, and in brackets the same
for the 2 s (``--before``) before the pool starts (what else runs on the machine). PostgreSQL:
``LEASEKEEPER_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/test), in a schema
of its own, dropped after.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from workerproc.store import open_store

HERE = Path(__file__).resolve().parent
ADMIN = os.environ.get("LEASEKEEPER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_P99_MS = 10.0


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class RunQueue:
    """The machine's load while a pool runs: the processes runnable (``procs_running`` of
    /proc/stat, this sampler left out), sampled every 50 ms; a 1-minute load average would
    still carry what ran before."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("procs_running"):
                        self.samples.append(max(0, int(line.split()[1]) - 1))

    def __enter__(self) -> RunQueue:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


def measure(
    db: str, runs: int, workers: int, concurrency: int, work: float, before: float
) -> dict[str, object]:
    with open_store(db) as store:
        ids = store.start_runs([{"task": "paid_call", "payload": work}] * runs)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", str(workers), "--db", db,
           "--app", "benchapp_once:app", "--drain", "--concurrency", str(concurrency),
           "--poll-interval", "0.1"]  # fmt: skip
    with RunQueue() as others:  # what else runs on the machine (a shared one, say)
        idle = psutil.cpu_percent(interval=before)
    psutil.cpu_percent(interval=None)
    began = time.monotonic()
    with RunQueue() as queue:
        done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
    seconds = time.monotonic() - began
    busy = psutil.cpu_percent(interval=None)
    load = queue.mean
    if done.returncode != 0:
        raise SystemExit(f"supervisor exited {done.returncode}:\n{done.stderr[-3000:]}")
    figures: list[list[float]] = []
    with open_store(db) as store:
        for run_id in ids:
            run = store.get_run(run_id)
            assert run is not None and run.status == "succeeded", run
            assert isinstance(run.result, list)
            figures.append([v / 1000 for v in run.result])
        totals = store.paid_call_totals()
    assert totals.kept == runs and totals.paid_again == 0, totals
    parts = list(zip(*figures, strict=True))
    return {
        "seconds": seconds,
        "busy": busy,
        "load": load,
        "idle": idle,
        "idle_load": others.mean,
        "total": list(parts[0]),
        "to_keep": list(parts[1]),
        "keep": list(parts[2]),
        "back": list(parts[3]),
        "lock": list(parts[4]),
        "commit": list(parts[5]),
    }


def row(name: str, m: dict[str, object]) -> str:
    def q(key: str) -> str:
        v = m[key]
        assert isinstance(v, list)
        return f"{pct(v, 50):.2f} / {pct(v, 90):.2f} / {pct(v, 99):.2f} / {max(v):.1f}"

    lock, commit = (q("lock"), q("commit")) if name.startswith("SQLite") else ("-", "-")
    return (f"| {name} | {q('total')} | {q('to_keep')} | {q('keep')} | {lock} | {commit} | "
            f"{q('back')} | {m['busy']:.0f} % ({m['idle']:.0f} %) | {m['load']:.2f} "
            f"({m['idle_load']:.2f}) | {m['seconds']:.1f} |")  # fmt: skip


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench once``."""
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--work-ms", type=float, default=10.0)
    ap.add_argument("--configs", default="2x1,4x1,2x2")
    ap.add_argument(
        "--before", type=float, default=2.0, help="seconds of looking at the load first"
    )


def run(args: argparse.Namespace) -> int:
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory(prefix="lk-bench-once-") as tmp:
        for backend in args.backends.split(","):
            for workers, concurrency in configs:
                name = f"{'SQLite' if backend == 'sqlite' else 'PostgreSQL'} -n {workers}" + (
                    f" --concurrency {concurrency}" if concurrency > 1 else "")  # fmt: skip
                if backend == "sqlite":
                    db = os.path.join(tmp, f"once-{workers}x{concurrency}.db")
                    m = measure(
                        db, args.runs, workers, concurrency, args.work_ms / 1000, args.before
                    )
                else:
                    import psycopg  # noqa: PLC0415 - only this part needs it

                    schema = f"lk_bench_once_{secrets.token_hex(4)}"
                    db = f"{ADMIN}{'&' if '?' in ADMIN else '?'}schema={schema}"
                    try:
                        m = measure(
                            db, args.runs, workers, concurrency, args.work_ms / 1000, args.before
                        )
                    finally:
                        with psycopg.connect(ADMIN, autocommit=True) as conn:
                            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                rows.append(row(name, m))
                print(rows[-1], file=sys.stderr, flush=True)
                total = m["total"]
                assert isinstance(total, list)
                worst = max(worst, pct(total, 99))
    print(
        f"| {args.runs:,} runs x one paid call, fn returns at once, {args.work_ms:g} ms of work "
        "after it (ms: p50 / p90 / p99 / max) | fn's return -> once returns | -> keep begins "
        "| keep (database) | of which the write lock | of which COMMIT "
        "| keep's end -> once returns | CPU busy (before) | load (before) | seconds |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    for line in rows:
        print(line)
    verdict = "met" if worst <= TARGET_P99_MS else "NOT met"
    print(f"\ntarget p99 <= {TARGET_P99_MS:g} ms: {verdict} (worst p99 {worst:.2f} ms)")
    return 0
