"""scripts/bench store's producer rows: ``start_runs`` of 10,000 runs in one
transaction, and the enqueue latency of producer processes that start one run per transaction
while ``supervisor start -n 8`` drains the same database (every process opens its own store
after fork; all at the default synchronous=full)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from bench_procs import ENV, HERE, PY, stop
from bench_store import Row, Sizes, bulk_runs, ms, new_db, ok, pct

from workerproc.store import StoreUnavailable, open_store

START_RUNS = 10_000
P99_TODAY = 0.030  # the enqueue p99 to keep: about 30 ms


def start_runs_rows(d: str, sz: Sizes, n: int = START_RUNS) -> list[Row]:
    """Seconds for one ``start_runs`` call of ``n`` runs into a fresh database (the median of
    ``sz.repeats``), without and with an idempotency key on every run."""
    rows: list[Row] = []
    for keyed in (False, True):
        took = []
        for i in range(sz.repeats):
            store = open_store(new_db(d, f"start-runs-{keyed:d}-{i}"))
            items = [{"task": "bench", "key": f"k{j}"} if keyed else {"task": "bench"}
                     for j in range(n)]  # fmt: skip
            started = time.perf_counter()
            ids = store.start_runs(items)
            took.append(time.perf_counter() - started)
            assert len(set(ids)) == n == store.stats().runs.get("pending"), "runs missing"
            store.close()
        seconds = statistics.median(took)
        what = f"start_runs of {n:,} runs, one transaction" + (", a key each" if keyed else "")
        rows.append((what, f"{seconds:.3f} s", "< 1 s", ok(seconds < 1)))
    return rows


def _produce(url: str, k: int, duration: float, barrier: Any, out: Any) -> None:
    store = open_store(url)  # this process's own connection, opened after fork
    latencies, errors = [], 0
    barrier.wait(60)
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        try:
            store.start_run("bench", {"producer": k})
        except StoreUnavailable:
            errors += 1
            continue
        latencies.append(time.perf_counter() - started)
    out.put((k, latencies, errors))
    store.close()


def _count(path: str, statuses: str) -> int:
    """Runs in ``statuses`` (an SQL list), read from a read-only connection."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        query = f"SELECT count(*) FROM runs WHERE status IN {statuses}"
        return int(conn.execute(query).fetchone()[0])
    finally:
        conn.close()


DONE, ALIVE = "('succeeded')", "('pending', 'running')"


def enqueue_rows(
    d: str, sz: Sizes, options: Sequence[str] = (), producers: int = 4, workers: int = 8
) -> list[Row]:
    """``producers`` processes start one run per transaction, as fast as they can, for
    ``sz.produce`` seconds, while ``workers`` workers (started with ``options``) drain a queue
    filled beforehand, deep enough that the pool never runs dry: the producers meet a pool
    that keeps the write lock busy the whole time."""
    path = new_db(d, "producers")
    pool = round(sz.produce * 30_000)  # more than the pool drains in that time
    bulk_runs(path, pool, time.time() - 60)  # work for the pool from the first moment
    cmd = [PY, "-m", "supervisor", "start", "-n", str(workers), "--db", path, "--app",
           "benchapp:app", *options]  # fmt: skip
    pool = subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while _count(path, DONE) == 0:  # the workers are up and draining
            if pool.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the pool did not start draining (exit {pool.poll()})")
            time.sleep(0.05)
        ctx = multiprocessing.get_context("fork")
        barrier, out = ctx.Barrier(producers), ctx.Queue()
        procs = [ctx.Process(target=_produce, args=(path, k, sz.produce, barrier, out))
                 for k in range(producers)]  # fmt: skip
        before = _count(path, DONE)
        for p in procs:
            p.start()
        results = [out.get(timeout=sz.produce + 120) for _ in procs]
        drained = _count(path, DONE) - before
        left = _count(path, ALIVE)
        for p in procs:
            p.join(30)
            if p.exitcode != 0:
                raise SystemExit(f"producer process exited with {p.exitcode}")
    finally:
        stop(pool)
    every = [x for r in results for x in r[1]]
    errors = sum(r[2] for r in results)
    worst = max(pct(r[1], 0.99) for r in results)
    p99 = pct(every, 0.99)
    pool_flags = " ".join(["-n", str(workers), *options])
    return [
        (f"enqueue latency, {producers} producers (one run per transaction) while {pool_flags} "
         f"drains", f"p50 {ms(pct(every, 0.5))}, p99 {ms(p99)}, max {ms(max(every))}",
         f"p99 <= {P99_TODAY * 1000:.0f} ms (today's)", ok(p99 <= P99_TODAY)),
        (f"enqueue p99, worst of {producers} producers", ms(worst), "", f"busy errors {errors}"),
        (f"... enqueued / drained meanwhile ({sz.produce:g} s)",
         f"{len(every):,} / {drained:,} runs", "",
         f"{left:,} still pending at the end" + (" (pool ran dry: more)" if left <= 0 else "")),
    ]  # fmt: skip
