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
  loop without emitting (their drain time, and how much slower streaming made it): ``--rounds``
  rounds, the two sides' order alternating, each round's line printed (the drains, the chunks a
  second the stream kept while they drained, the pool's CPU, the machine's run queue), then the
  medians and the median of the rounds' ratios with their least and greatest. ``--before TREE``
  (a worktree of main, say) drains that checkout's code too in each round, interleaved.

    scripts/bench streams [--backends sqlite,postgres] [--runs 8] [--chunks 500]
                          [--every-ms 5] [--flood 100000] [--noops 2000] [--steady 60]
                          [--rounds 7] [--before TREE] [--quick]

PostgreSQL: ``LEASEKEEPER_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/test),
in a schema of its own, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from bench_args import add_quick, fill_sizes
from bench_once import ADMIN, RunQueue, pct
from benchapp_streams import MARK

from workerproc.store import open_async_store, open_store

HERE = Path(__file__).resolve().parent
TARGET_P99_MS, TARGET_RATE, TARGET_SLOWER = 100.0, 10_000.0, 0.10
PACE = TARGET_RATE * 1.05  # the stream beside the other slots: surely at the target's rate


def pool(
    db: str, workers: int, concurrency: int, tree: Path | None = None
) -> subprocess.Popen[str]:
    code = os.environ.get("PYTHONPATH", "") if tree is None else str(tree)
    path = os.pathsep.join([code, str(HERE)] if tree else [str(HERE), code])
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


class Side(NamedTuple):
    """One drain of the no-op runs beside the steady loop: its seconds, the pool's CPU seconds,
    the chunks a second the loop kept while they drained, the machine's run queue."""

    drain: float
    cpu: float
    rate: float
    load: float


def kept(marks: list[float], start: float, end: float) -> float:
    """Chunks a second the steady loop went through between ``start`` and ``end`` (its result:
    the moment of every ``MARK``-th chunk)."""
    return sum(start <= m < end for m in marks) * MARK / max(end - start, 1e-9)


def others(db: str, noops: int, emit: bool, steady: float, tree: Path | None = None) -> Side:
    """The no-op runs drained on one slot (``-n 1 --concurrency 2``) while the other one runs
    at ``PACE`` chunks a second until they are done (``steady`` seconds at most),
    emitting or not; ``tree``: another checkout's code for the pool (this one's by default)."""
    with open_store(db) as store:
        (loop,) = store.start_runs([{"task": "steady", "payload": {
            "rate": PACE, "emit": emit, "seconds": steady, "until": noops}}])  # fmt: skip
        ids = store.start_runs([{"task": "noop"}] * noops)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    with RunQueue() as queue:
        drained(pool(db, 1, 2, tree))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open_store(db) as store:
        tasks = [t for r in ids for t in store.get_tasks(r)]
        run = store.get_run(loop)
    assert all(t.done_at is not None for t in tasks)
    assert run is not None and run.status == "succeeded" and isinstance(run.result, list), run
    start = min(t.claimed_at or 1e18 for t in tasks)
    end = max(t.done_at or 0 for t in tasks)
    used = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    return Side(end - start, used, kept(run.result, start, end), queue.mean)  # type: ignore[arg-type]


@contextmanager
def database(backend: str, tmp: str, name: str) -> Iterator[str]:
    if backend == "sqlite":
        path = os.path.join(tmp, f"{name}.db")
        try:
            yield path
        finally:  # gone at once: its dirty pages are never written back under a later round
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + suffix)
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
        help="seconds the stream beside them lasts at most (default 60: it ends with them)",
    )
    ap.add_argument("--rounds", type=int, help="rounds of the other slots' drains (default 7)")
    ap.add_argument(
        "--before",
        type=Path,
        help="another checkout (a worktree of main, say): its code's drains too, in each round",
    )
    add_quick(ap)


def spread(ratios: list[float]) -> str:
    """The median of the rounds' slowdowns, then their least and greatest, in %."""
    least, most = (f"{(r - 1) * 100:+.0f}" for r in (min(ratios), max(ratios)))
    return f"{(statistics.median(ratios) - 1) * 100:+.0f} % ({least} to {most})"


def slots(args: argparse.Namespace, tmp: str, backend: str) -> dict[str, list[tuple[Side, Side]]]:
    """``args.rounds`` rounds of each tree's drains alone and beside the stream; the order of
    the sides alternates from one round to the next. Per tree: each round's (alone, beside)."""
    trees: list[tuple[str, Path | None]] = [("now", None)]
    if args.before:
        trees.append(("before", args.before.resolve()))
    sides = [(label, tree, emit) for label, tree in trees for emit in (False, True)]
    got: dict[tuple[str, bool], list[Side]] = {(label, e): [] for label, _, e in sides}
    for i in range(args.rounds):
        # each side first in turn (rotated: reversing a rotation of two kept one order)
        order = sides[i % len(sides) :] + sides[: i % len(sides)]
        for label, tree, emit in order:
            with database(backend, tmp, f"r{i}{label}{int(emit)}") as db:
                got[label, emit].append(others(db, args.noops, emit, args.steady, tree))
        line = [f"  {backend} round {i + 1}:"]
        for label, _ in trees:
            alone, beside = got[label, False][-1], got[label, True][-1]
            line.append(f"{label} {alone.drain:.2f} s / {beside.drain:.2f} s "
                        f"({(beside.drain / alone.drain - 1) * 100:+.0f} %, stream "
                        f"{beside.rate:,.0f} chunks/s, pool CPU {alone.cpu:.1f} / "
                        f"{beside.cpu:.1f} s, "
                        f"run queue {alone.load:.1f} / {beside.load:.1f});")  # fmt: skip
        print(" ".join(line), flush=True)
    return {label: list(zip(got[label, False], got[label, True], strict=True))
            for label, _ in trees}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    fill_sizes(args, [("runs", 8, 2), ("chunks", 500, 50), ("flood", 100_000, 5_000),
                      ("noops", 2000, 100), ("steady", 60.0, 5.0), ("rounds", 7, 2)])  # fmt: skip
    rows, verdicts = [], []
    with tempfile.TemporaryDirectory(prefix="lk-bench-streams-") as tmp:
        for backend in args.backends.split(","):
            name = "SQLite" if backend == "sqlite" else "PostgreSQL"
            with database(backend, tmp, "latency") as db:
                lags = latency(db, args.runs, args.chunks, args.every_ms / 1000)
            with database(backend, tmp, "flood") as db:
                rate = flood(db, args.flood)
            drains = slots(args, tmp, backend)
            p99 = pct(lags, 99)
            for label, pairs in drains.items():
                ratios = [b.drain / a.drain for a, b in pairs]
                alone = statistics.median(a.drain for a, _ in pairs)
                beside = statistics.median(b.drain for _, b in pairs)
                kept_rates = [b.rate for _, b in pairs]
                cpu = [statistics.median(a.cpu for a, _ in pairs),
                       statistics.median(b.cpu for _, b in pairs)]  # fmt: skip
                head = (f"| {name} | {pct(lags, 50):.1f} / {pct(lags, 90):.1f} / {p99:.1f} / "
                        f"{max(lags):.1f} | {rate:,.0f} |" if label == "now"
                        else f"| {name}, {label} | | |")  # fmt: skip
                rows.append(f"{head} {alone:.2f} s / {beside:.2f} s | {spread(ratios)} | "
                            f"{min(kept_rates):,.0f} to {max(kept_rates):,.0f} | "
                            f"{cpu[0]:.2f} s / {cpu[1]:.2f} s |")  # fmt: skip
                print(rows[-1], file=sys.stderr, flush=True)
                mine = label == "now"  # the latency and the flood: this tree's only
                verdicts.append((name if mine else f"{name}, {label}", p99, rate if mine else 0,
                                 statistics.median(ratios), min(kept_rates)))  # fmt: skip
    print(f"| {args.runs} runs x {args.chunks} chunks every {args.every_ms:g} ms, followed live; "
          f"a flood of {args.flood:,} chunks; {args.noops:,} no-op runs beside a slot "
          f"paced at {PACE:,.0f} chunks/s, {args.rounds} rounds "
          "| emit -> readable (ms: p50 / p90 / p99 / max) | chunks/s, one worker "
          "| the no-op runs' drain, not emitting / emitting beside (medians) "
          "| slower beside the stream (median of the rounds, least to greatest) "
          "| the stream's chunks/s while they drained "
          "| the pool's CPU, not emitting / emitting (medians) |")  # fmt: skip
    print("| --- | --- | ---: | --- | --- | ---: | --- |")
    for line in rows:
        print(line)
    for name, p99, rate, ratio, least in verdicts:
        if rate:  # this tree's row (an earlier tree's has only its drains)
            ok = p99 <= TARGET_P99_MS and rate >= TARGET_RATE
            print(f"{name}: target p99 <= {TARGET_P99_MS:g} ms and >= {TARGET_RATE:,.0f} "
                  f"chunks/s: {'met' if ok else 'NOT met'} (p99 {p99:.1f} ms, "
                  f"{rate:,.0f} chunks/s)")  # fmt: skip
        ok = ratio <= 1 + TARGET_SLOWER and least >= TARGET_RATE
        print(f"{name}: target the other slots <= {TARGET_SLOWER:.0%} slower beside "
              f"{TARGET_RATE:,.0f} chunks/s: {'met' if ok else 'NOT met'} (median "
              f"{(ratio - 1) * 100:+.0f} %, the stream at least "
              f"{least:,.0f} chunks/s)")  # fmt: skip
    return 0
