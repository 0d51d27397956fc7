"""Benchmark the SQLite lease store (not a test): throughput, claim latency at scale, a hot run,
and the wait for the write lock under eight hammering processes. Prints a markdown table.

    scripts/bench store          # the full run: a few minutes on 2 cores
    scripts/bench store --quick  # a smoke run: seconds

Every process opens its own store after fork(). Large tables are bulk-inserted with executemany
through a plain sqlite3 connection into the store's own schema, so the schema's triggers fill
each run's head columns and ready_at exactly as start_run would (checked before measuring).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bench_args

from workerproc.store import Commit, StoreUnavailable, open_store
from workerproc.store.sqlite.dialect import SQLiteDialect

NEVER = 10**9  # max_attempts for benchmarks that cycle claim -> release on the same tasks


@dataclass(frozen=True)
class Sizes:
    duration: float  # seconds per throughput / lock-wait phase
    pool: int  # runs ready for the throughput phases
    small: int  # "1,000 pending"
    large: int  # "1,000,000 pending"
    hot: int  # tasks in the hot run
    others: int  # ordinary runs next to the hot run
    samples: int  # timed claims per latency measurement
    produce: float  # seconds the producers enqueue while the pool drains
    repeats: int  # timed start_runs calls (the median counts)


FULL = Sizes(duration=5.0, pool=60_000, small=1_000, large=1_000_000, hot=100_000,
             others=1_000, samples=3_000, produce=10.0, repeats=3)  # fmt: skip
QUICK = Sizes(duration=0.5, pool=3_000, small=1_000, large=20_000, hot=5_000, others=500,
              samples=300, produce=1.5, repeats=1)  # fmt: skip


# -- set-up ------------------------------------------------------------------------------------
def new_db(directory: str, name: str) -> str:
    path = os.path.join(directory, f"{name}.db")
    open_store(path).close()  # the store creates the schema (and WAL, permissions)
    return path


def bulk_runs(path: str, n: int, at: float, chunk: int = 100_000, queues: int = 0) -> None:
    """``n`` single-task runs, all claimable at ``at``: one transaction per chunk, triggers on.

    ``queues``: spread the runs over that many queues (``q0``...), 1 in 50 at priority 5 or -5
    and 1 in 10 delayed by an hour (as scripts/bench_pg.py does on PostgreSQL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    done = 0
    while done < n:
        k = min(chunk, n - done)
        conn.execute("BEGIN IMMEDIATE")
        first = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM runs").fetchone()[0]
        ids = range(first, first + k)
        conn.executemany(
            "INSERT INTO runs (id, state, created_at, updated_at, queue, priority)"
            " VALUES (?, 'null', ?, ?, ?, ?)",
            ((i, at, at, *_queue_priority(i, queues)) for i in ids),
        )
        conn.executemany(
            "INSERT INTO tasks (run_id, name, payload, available_at, created_at)"
            " VALUES (?, 'bench', '{}', ?, ?)",
            ((i, at + 3600 * (queues > 0 and i % 10 == 3), at) for i in ids),
        )
        conn.execute("COMMIT")
        done += k
    conn.close()


def _queue_priority(i: int, queues: int) -> tuple[str, int]:
    if not queues:
        return "default", 0
    return f"q{i % queues}", {0: 5, 1: -5}.get(i % 100, 0)


def bulk_tasks(path: str, run_id: int, n: int, at: float) -> None:
    """``n`` more pending tasks in one run (the API keeps one at a time; the schema allows more)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO tasks (run_id, name, payload, available_at, created_at)"
        " VALUES (?, 'hot', '{}', ?, ?)",
        ((run_id, at, at) for _ in range(n)),
    )
    conn.execute("COMMIT")
    conn.close()


def verify_heads(path: str) -> None:
    """Every alive run with pending work has its head and ready_at set by the triggers."""
    conn = sqlite3.connect(path)
    bad = conn.execute(
        """SELECT count(*) FROM runs r WHERE status IN ('pending', 'running')
           AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.done_at IS NULL)
           AND (ready_at IS NULL OR head_at IS NULL OR head_id IS NULL)"""
    ).fetchone()[0]
    conn.close()
    if bad:
        raise SystemExit(f"{path}: {bad} runs without head/ready_at: the triggers did not run")


# -- measurements --------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def claim_latencies(paths: list[str], samples: int, limit: int | None = None) -> list[list[float]]:
    """Time ``samples`` claims (``limit``: batched claims of that many) on each database,
    interleaved (drift hits both alike); release each lease again so the pending count stays
    the same."""
    stores = [open_store(f"sqlite:///{p}?synchronous=normal") for p in paths]
    out: list[list[float]] = [[] for _ in paths]
    for i in range(samples):
        for store, times in zip(stores, out, strict=True):
            started = time.perf_counter()
            got = store.claim(f"lat-{i % 8}", 600, max_attempts=NEVER, limit=limit)
            times.append(time.perf_counter() - started)
            leases = got if isinstance(got, list) else [got]
            assert all(leases) and len(leases) == (limit or 1), "a claim came back short"
            store.commit_many([Commit(lease, "release") for lease in leases if lease])
    for store in stores:
        store.close()
    return [times[samples // 10 :] for times in out]  # drop the warm-up (cold cache)


def _hammer(url: str, k: int, duration: float, barrier: Any, out: Any, lock_probe: bool) -> None:
    store = open_store(url)  # this process's own connection, opened after fork
    assert isinstance(store.dialect, SQLiteDialect)
    done, waits, errors = 0, [], 0
    barrier.wait(60)
    started = time.perf_counter()
    deadline = started + duration
    while time.perf_counter() < deadline:
        try:
            if lock_probe:  # BEGIN IMMEDIATE (with the store's retries) + COMMIT, nothing else
                t0 = time.perf_counter()
                store.dialect.write(lambda tx: None)
                waits.append(time.perf_counter() - t0)
            lease = store.claim(f"p{k}", 600)
            if lease is None:
                break
            store.ack(lease)
            done += 1
        except StoreUnavailable:
            errors += 1
    out.put((k, done, time.perf_counter() - started, waits, errors))
    store.close()


def hammer(url: str, procs: int, duration: float, lock_probe: bool = False) -> list[Any]:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    args = [(url, k, duration, barrier, out, lock_probe) for k in range(procs)]
    workers = [ctx.Process(target=_hammer, args=a) for a in args]
    for w in workers:
        w.start()
    results = [out.get(timeout=duration + 120) for _ in workers]
    for w in workers:
        w.join(30)
        if w.exitcode != 0:
            raise SystemExit(f"benchmark process exited with {w.exitcode}")
    return sorted(results)


Row = tuple[str, str, str, str]


def throughput(d: str, sz: Sizes, procs: int, sync: str) -> Row:
    path = new_db(d, f"tp{procs}{sync}")
    bulk_runs(path, sz.pool, time.time() - 60)
    verify_heads(path)
    results = hammer(f"sqlite:///{path}?synchronous={sync}", procs, sz.duration)
    total = sum(r[1] for r in results)
    rate = total / max(r[2] for r in results)
    rate_s = f"{rate:,.0f} /s" + (" (pool exhausted: more)" if total >= sz.pool else "")
    spread = f"per process {min(r[1] for r in results):,}-{max(r[1] for r in results):,}"
    label = f"claim+ack throughput, {procs} process{'es' * (procs > 1)} (synchronous={sync})"
    return (label, rate_s, "", spread if procs > 1 else f"{total:,} in {sz.duration:g} s")


def latency_at_scale(d: str, sz: Sizes) -> list[Row]:
    paths, rows = [], []
    for n in (sz.small, sz.large):
        paths.append(new_db(d, f"lat{n}"))
        t0 = time.perf_counter()
        bulk_runs(paths[-1], n, time.time() - 3600)
        rows.append(f"bulk insert {time.perf_counter() - t0:.1f} s, triggers checked")
        verify_heads(paths[-1])
    small, large = claim_latencies(paths, sz.samples)
    for path in paths:
        os.remove(path)
    ratio = statistics.median(large) / statistics.median(small)
    return [
        (f"claim latency, {sz.small:,} pending tasks", p50_p99(small), "", rows[0]),
        (f"claim latency, {sz.large:,} pending tasks", p50_p99(large), "", rows[1]),
        (f"latency ratio {sz.large:,} / {sz.small:,} (p50)", f"{ratio:.2f}x", "<= 1.5",
         ok(ratio <= 1.5)),
    ]  # fmt: skip


def queue_latency(d: str, sz: Sizes, queues: int = 10, batch: int = 8) -> list[Row]:
    """Claim latency vs depth with the pending runs in ``queues`` queues at three priorities,
    served all at once (the claim walks every queue's priority levels): one task per claim, and
    ``batch`` tasks per claim (``claim(limit=batch)``)."""
    paths, notes = [], []
    for n in (sz.small, sz.large):
        paths.append(new_db(d, f"queues{n}"))
        t0 = time.perf_counter()
        bulk_runs(paths[-1], n, time.time() - 3600, queues=queues)
        notes.append(f"bulk insert {time.perf_counter() - t0:.1f} s; 1 in 10 delayed")
        verify_heads(paths[-1])
    single = claim_latencies(paths, sz.samples)
    batched = claim_latencies(paths, sz.samples, limit=batch)
    for path in paths:
        os.remove(path)
    where = f"pending tasks in {queues} queues"
    rows: list[Row] = []
    for what, (small, large), per_lease in (
        ("claim latency", single, ""),
        (f"batched claim (limit={batch}) latency", batched,
         f"; per lease p50 {ms(pct(batched[1], 0.5) / batch)}"),
    ):  # fmt: skip
        ratio = statistics.median(large) / statistics.median(small)
        rows += [
            (f"{what}, {sz.small:,} {where}", p50_p99(small), "", notes[0]),
            (f"{what}, {sz.large:,} {where}", p50_p99(large), "", notes[1] + per_lease),
            (f"{what} ratio {sz.large:,} / {sz.small:,} in {queues} queues (p50)",
             f"{ratio:.2f}x", "<= 1.5", ok(ratio <= 1.5)),
        ]  # fmt: skip
    return rows


def hot_run(d: str, sz: Sizes) -> list[Row]:
    plain, hot = new_db(d, "plain"), new_db(d, "hot")
    # the hot database: one old run, a live lease on its head, sz.hot - 1 tasks queued behind it
    store = open_store(hot, clock=lambda: time.time() - 7200)
    run_id = store.start_run("hot")
    lease = store.claim("holder", 36_000)  # live for the whole benchmark
    assert lease is not None and lease.run_id == run_id
    store.close()
    bulk_tasks(hot, run_id, sz.hot - 1, time.time() - 7200)
    for path in (plain, hot):
        bulk_runs(path, sz.others, time.time() - 3600)
        verify_heads(path)
    base, behind = claim_latencies([plain, hot], sz.samples)
    check = open_store(hot)
    tasks = check.get_tasks(run_id)
    check.close()
    assert len(tasks) == sz.hot and [t.attempts for t in tasks[:2]] == [1, 0], "hot run touched"
    for path in (plain, hot):
        os.remove(path)
    ratio = statistics.median(behind) / statistics.median(base)
    return [
        (f"claim latency, {sz.others:,} runs", p50_p99(base), "", ""),
        (f"... plus an older hot run of {sz.hot:,} tasks behind a live lease", p50_p99(behind),
         "", "same claims, same runs"),
        ("hot-run slowdown (p50)", f"{ratio:.2f}x", "<= 2", ok(ratio <= 2)),
    ]  # fmt: skip


def lock_wait(d: str, sz: Sizes, procs: int = 8) -> tuple[list[Row], list[str]]:
    path = new_db(d, f"lock{procs}")
    bulk_runs(path, sz.pool, time.time() - 60)
    results = hammer(f"sqlite:///{path}", procs, sz.duration, lock_probe=True)
    every = [w for r in results for w in r[3]]
    p99s = [pct(r[3], 0.99) for r in results]
    mean_ops = statistics.mean(r[1] for r in results)
    starved = [r[0] for r in results if r[1] < 0.5 * mean_ops or r[4]]
    detail = ["| process | claim+ack done | lock wait p50 | p99 | max | busy errors |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for k, done, _, waits, errors in results:
        detail.append(
            f"| {k} | {done:,} | {ms(pct(waits, 0.5))} | {ms(pct(waits, 0.99))} "
            f"| {ms(max(waits, default=0))} | {errors} |"
        )
    rows = [
        (f"write-lock wait, {procs} processes hammering (all)",
         f"p50 {ms(pct(every, 0.5))}, p99 {ms(pct(every, 0.99))}, max {ms(max(every))}",
         "p99 <= 50 ms", ok(pct(every, 0.99) <= 0.050)),
        (f"write-lock wait p99, worst of {procs} processes", ms(max(p99s)), "<= 50 ms",
         ok(max(p99s) <= 0.050)),
        ("starved processes (< half the mean ops, or busy errors)", str(len(starved)), "0",
         ok(not starved)),
    ]  # fmt: skip
    return rows, detail


def p50_p99(values: list[float]) -> str:
    return f"p50 {ms(pct(values, 0.5))}, p99 {ms(pct(values, 0.99))}"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench store``."""
    bench_args.add_quick(parser, "small sizes: a smoke run")
    bench_args.add_dir(parser, "where to put the databases (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    sz = QUICK if args.quick else FULL
    d = tempfile.mkdtemp(prefix="lk-bench-", dir=args.dir)
    started = time.perf_counter()
    rows: list[Row] = []
    import bench_producers  # noqa: PLC0415 - it imports this module's helpers

    steps: list[Callable[[], list[Row]]] = [
        lambda: [throughput(d, sz, 1, "full"), throughput(d, sz, 8, "full")],
        lambda: [throughput(d, sz, 1, "normal"), throughput(d, sz, 8, "normal")],
        lambda: latency_at_scale(d, sz),
        lambda: queue_latency(d, sz),
        lambda: hot_run(d, sz),
        lambda: bench_producers.start_runs_rows(d, sz),
        lambda: bench_producers.enqueue_rows(d, sz),
        lambda: bench_producers.enqueue_rows(d, sz, ["--prefetch", "8"]),
    ]
    try:
        for step in steps:
            rows += step()
            print(f"... {rows[-1][0]}: {rows[-1][1]}", file=sys.stderr, flush=True)
        lock_rows, detail = lock_wait(d, sz, 8)
        rows += lock_rows
        rows += lock_wait(d, sz, 2)[0][:1]  # the same with no more processes than CPUs
    finally:
        shutil.rmtree(d, ignore_errors=True)
    kind, took = "quick" if args.quick else "full", time.perf_counter() - started
    print(f"\n### leasekeeper store benchmark ({kind} run, {os.cpu_count()} CPUs, "
          f"SQLite {sqlite3.sqlite_version}, {took:.0f} s)\n")  # fmt: skip
    print("| measurement | result | goal | notes |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nLatencies use synchronous=normal (no fsync per commit: the query's own cost); the")
    print("lock-wait phase uses the default synchronous=full. Per process, write-lock wait:\n")
    print("\n".join(detail))
    return 0
