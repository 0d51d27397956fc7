"""Runs' streams (B21): emit -> readable latency (target p99 <= 100 ms) and the chunks one
worker writes per second (target >= 10,000), on SQLite and PostgreSQL, under a real supervisor
(``supervisor start --drain``) running scripts/benchapp_streams.py:

- latency: ``--runs`` runs at once (``-n 1 --concurrency RUNS``), each emitting ``--chunks``
  chunks every ``--every-ms`` (each chunk carries the moment it was emitted), followed live
  by this process (``AsyncStore.follow_stream``, one per run): the moment a chunk was read
  minus the moment it was emitted, p50 / p90 / p99 / max;
- chunks/s: one run emitting ``--flood`` short chunks as fast as it can (``-n 1``), from its
  first emit to its flush's return (every chunk in the database);
- the other slots: ``--noops`` no-op runs drained on one slot of ``-n 1 --concurrency 2``
  while the other slot emits 10,000 chunks a second, against the same while it runs the same
  loop without emitting (their drain time, and how much slower streaming made it).

    scripts/bench streams [--backends sqlite,postgres] [--runs 8] [--chunks 500]
                          [--every-ms 5] [--flood 100000] [--noops 2000] [--steady 10]
                          [--quick]

PostgreSQL: ``LEASEKEEPER_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/test),
in a schema of its own, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench_args import add_quick, fill_sizes
from bench_once import ADMIN, pct

from workerproc.store import open_async_store, open_store

HERE = Path(__file__).resolve().parent
TARGET_P99_MS, TARGET_RATE = 100.0, 10_000.0


def pool(db: str, workers: int, concurrency: int) -> subprocess.Popen[str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", str(workers), "--db", db,
           "--app", "benchapp_streams:app", "--drain", "--concurrency", str(concurrency),
           "--poll-interval", "0.05", "--prefetch", "0"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def drained(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"supervisor exited {proc.returncode}:\n{err[-3000:]}")


async def follow_all(db: str, runs: list[int]) -> list[float]:
    """Follow every run's stream live; each chunk's read time minus its emit time, in ms."""
    store = await open_async_store(db)
    lags: list[float] = []
    try:

        async def one(run_id: int) -> None:
            async for chunk in store.follow_stream(run_id, poll=1.0):
                assert isinstance(chunk.data, dict)
                lags.append((time.time() - float(chunk.data["t"])) * 1000)  # type: ignore[arg-type]

        await asyncio.gather(*(one(r) for r in runs))
    finally:
        await store.close()
    return lags


def latency(db: str, runs: int, chunks: int, every: float) -> list[float]:
    with open_store(db) as store:
        ids = store.start_runs([{"task": "paced", "payload": {"chunks": chunks, "every": every}}
                                for _ in range(runs)])  # fmt: skip
    proc = pool(db, 1, runs)
    lags = asyncio.run(follow_all(db, ids))
    drained(proc)
    assert len(lags) == runs * chunks, (len(lags), runs * chunks)
    return lags


def flood(db: str, chunks: int) -> float:
    with open_store(db) as store:
        (run_id,) = store.start_runs([{"task": "flood", "payload": {"chunks": chunks}}])
    drained(pool(db, 1, 1))
    with open_store(db) as store:
        run = store.get_run(run_id)
        assert run is not None and run.status == "succeeded", run
        assert len(store.stream(run_id, chunks - 1, 10)) == 1  # every chunk written
        return chunks / float(run.result)  # type: ignore[arg-type]


def others(db: str, noops: int, emit: bool, steady: float) -> float:
    """Seconds the no-op runs took to drain on one slot (``-n 1 --concurrency 2``) while the
    other one runs ``steady`` at ``TARGET_RATE`` chunks a second, emitting or not."""
    with open_store(db) as store:
        store.start_runs([{"task": "steady", "payload": {"rate": TARGET_RATE, "emit": emit,
                                                          "seconds": steady}}])  # fmt: skip
        ids = store.start_runs([{"task": "noop"}] * noops)
    drained(pool(db, 1, 2))
    with open_store(db) as store:
        tasks = [t for r in ids for t in store.get_tasks(r)]
    assert all(t.done_at is not None for t in tasks)
    return max(t.done_at or 0 for t in tasks) - min(t.claimed_at or 1e18 for t in tasks)


@contextmanager
def database(backend: str, tmp: str, name: str) -> Iterator[str]:
    if backend == "sqlite":
        yield os.path.join(tmp, f"{name}.db")
        return
    import psycopg  # noqa: PLC0415 - only this part needs it

    schema = f"lk_bench_streams_{secrets.token_hex(4)}"
    try:
        yield f"{ADMIN}{'&' if '?' in ADMIN else '?'}schema={schema}"
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench streams``."""
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--runs", type=int, help="runs streaming at once (latency; default 8)")
    ap.add_argument("--chunks", type=int, help="chunks per run (latency; default 500)")
    ap.add_argument("--every-ms", type=float, default=5.0, help="ms between two chunks")
    ap.add_argument("--flood", type=int, help="chunks of the flood (default 100,000)")
    ap.add_argument("--noops", type=int, help="no-op runs beside a stream (default 2,000)")
    ap.add_argument(
        "--steady",
        type=float,
        help="seconds the stream beside them lasts (default 10: longer than they take)",
    )
    add_quick(ap)


def run(args: argparse.Namespace) -> int:
    fill_sizes(args, [("runs", 8, 2), ("chunks", 500, 50), ("flood", 100_000, 5_000),
                      ("noops", 2000, 100), ("steady", 10.0, 1.0)])  # fmt: skip
    rows, verdicts = [], []
    with tempfile.TemporaryDirectory(prefix="lk-bench-streams-") as tmp:
        for backend in args.backends.split(","):
            name = "SQLite" if backend == "sqlite" else "PostgreSQL"
            with database(backend, tmp, "latency") as db:
                lags = latency(db, args.runs, args.chunks, args.every_ms / 1000)
            with database(backend, tmp, "flood") as db:
                rate = flood(db, args.flood)
            with database(backend, tmp, "alone") as db:
                alone = others(db, args.noops, False, args.steady)
            with database(backend, tmp, "beside") as db:
                beside = others(db, args.noops, True, args.steady)
            p99 = pct(lags, 99)
            rows.append(f"| {name} | {pct(lags, 50):.1f} / {pct(lags, 90):.1f} / {p99:.1f} / "
                        f"{max(lags):.1f} | {rate:,.0f} | {alone:.2f} s / {beside:.2f} s "
                        f"({(beside / alone - 1) * 100:+.0f} %) |")  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
            verdicts.append((name, p99, rate))
    print(f"| {args.runs} runs x {args.chunks} chunks every {args.every_ms:g} ms, followed live; "
          f"a flood of {args.flood:,} chunks; {args.noops:,} no-op runs beside a slot "
          f"emitting {TARGET_RATE:,.0f} chunks/s "
          "| emit -> readable (ms: p50 / p90 / p99 / max) | chunks/s, one worker "
          "| the no-op runs beside it, not emitting / emitting |")  # fmt: skip
    print("| --- | --- | ---: | --- |")
    for line in rows:
        print(line)
    for name, p99, rate in verdicts:
        ok = p99 <= TARGET_P99_MS and rate >= TARGET_RATE
        print(f"{name}: target p99 <= {TARGET_P99_MS:g} ms and >= {TARGET_RATE:,.0f} chunks/s: "
              f"{'met' if ok else 'NOT met'} (p99 {p99:.1f} ms, {rate:,.0f} chunks/s)")  # fmt: skip
    return 0
