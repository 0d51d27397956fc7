"""Batch steps' throughput: runs/s of an embeddings-shaped no-op batch step at ``batch=64``
against the same step at ``batch=1``, under a real supervisor (``supervisor start -n N
--drain``) draining the runs, on SQLite and PostgreSQL (scripts/benchapp_batch.py). A batch of
64 costs one handler call and one gathering for 64 items; each item is still claimed, renewed
and committed on its own, so the gain is the per-call overhead, not the per-item writes.

    scripts/bench batch [--runs 5000] [--workers 2] [--backends sqlite,postgres] [--rounds 1]

``--rounds R`` measures both sizes R times, alternated (1, 64, 1, 64, ...: a shared machine's load
falls on both alike), and prints the medians. Each figure comes with the CPU the pool spent per
run (the supervisor and its workers, user + system, from ``RUSAGE_CHILDREN``).

PostgreSQL: ``LEASEKEEPER_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/test), in
a schema of its own, dropped after.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workerproc.store import open_store

HERE = Path(__file__).resolve().parent
ADMIN = os.environ.get("LEASEKEEPER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SIZES = (1, 64)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(db: str, runs: int, workers: int, size: int) -> tuple[float, float]:
    """Runs per second of ``runs`` runs of the step at batch ``size``, drained by a pool, and
    the pool's CPU milliseconds per run."""
    with open_store(db) as store:
        ids = store.start_runs([{"task": f"embed_{size}", "payload": {"text": f"doc {i}"}}
                                for i in range(runs)])  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", str(workers), "--db", db,
           "--app", "benchapp_batch:app", "--drain", "--poll-interval", "0.1"]  # fmt: skip
    began, cpu = time.monotonic(), _children_cpu()
    done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=1800)
    seconds, cpu = time.monotonic() - began, _children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"supervisor exited {done.returncode}:\n{done.stderr[-3000:]}")
    with open_store(db) as store:
        statuses = store.stats().runs
    assert statuses.get("succeeded") == len(ids), statuses
    return runs / seconds, cpu * 1000 / runs


def database(backend: str, tmp: str, label: str) -> tuple[str, str | None]:
    """A fresh database for one measurement (its PostgreSQL schema, to drop after)."""
    if backend == "sqlite":
        return os.path.join(tmp, f"batch-{label}.db"), None
    schema = f"lk_bench_batch_{secrets.token_hex(4)}"
    return f"{ADMIN}{'&' if '?' in ADMIN else '?'}schema={schema}", schema


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench batch``."""
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--rounds", type=int, default=1, help="alternated rounds (medians)")


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise SystemExit("scripts/bench batch: --rounds takes a whole number from 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lk-bench-batch-") as tmp:
        for backend in args.backends.split(","):
            rates: dict[int, list[float]] = {size: [] for size in SIZES}
            cpus: dict[int, list[float]] = {size: [] for size in SIZES}
            for r in range(args.rounds):
                for size in SIZES:  # alternated: both sizes see the same load
                    db, schema = database(backend, tmp, f"{size}-{r}")
                    try:
                        rate, cpu = measure(db, args.runs, args.workers, size)
                    finally:
                        if schema is not None:
                            import psycopg  # noqa: PLC0415 - only this part needs it

                            with psycopg.connect(ADMIN, autocommit=True) as conn:
                                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                    rates[size].append(rate)
                    cpus[size].append(cpu)
            one, many = (statistics.median(rates[size]) for size in SIZES)
            cpu_one, cpu_many = (statistics.median(cpus[size]) for size in SIZES)
            name = "SQLite" if backend == "sqlite" else "PostgreSQL"
            rows.append(f"| {name} -n {args.workers} | {one:,.0f} ({cpu_one:.2f} ms CPU) | "
                        f"{many:,.0f} ({cpu_many:.2f} ms CPU) | {many / one:.1f}x |")  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    rounds = "" if args.rounds == 1 else f", median of {args.rounds} alternated rounds"
    print(f"| {args.runs:,} runs of an embeddings-shaped no-op batch step{rounds} "
          "| runs/s at batch=1 (pool CPU per run) | runs/s at batch=64 "
          "| batch=64 / batch=1 |")  # fmt: skip
    print("| --- | ---: | ---: | ---: |")
    for line in rows:
        print(line)
    return 0
