"""Waiting runs cost no claim time: the claim's latency beside N runs that wait for a
signal (each a pending task not due for a century, as ``ctx.wait_for`` stores it) and beside
none, interleaved, on SQLite and PostgreSQL.

    scripts/bench waits [--waiting 100000] [--samples 400] [--postgres URL]

``bulk_waiting`` writes what a wait commit writes (the run's wait, its not-due task) directly,
in large transactions: the claim then sees exactly what 100,000 handlers' waits would leave.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time

import bench_args

from workerproc.store import Commit, open_store
from workerproc.store.codec import WAIT_FOREVER

READY = 1_000  # ready runs in both databases: the claim's own work


def bulk_waiting_sqlite(path: str, n: int, at: float) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN IMMEDIATE")
    first = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM runs").fetchone()[0]
    ids = range(first, first + n)
    conn.executemany(
        "INSERT INTO runs (id, state, created_at, updated_at, wait_for, wait_until)"
        " VALUES (?, '{}', ?, ?, 'signal:go', ?)",
        ((i, at, at, at + WAIT_FOREVER) for i in ids),
    )
    conn.executemany(
        "INSERT INTO tasks (run_id, name, payload, available_at, created_at)"
        " VALUES (?, 'after', 'null', ?, ?)",
        ((i, at + WAIT_FOREVER, at) for i in ids),
    )
    conn.execute("UPDATE runs SET wait_task = (SELECT max(id) FROM tasks WHERE run_id = runs.id)"
                 " WHERE wait_for IS NOT NULL")  # fmt: skip
    conn.execute("COMMIT")
    conn.close()


def bulk_waiting_postgres(url: str, n: int) -> None:
    import psycopg  # noqa: PLC0415 - only for the PostgreSQL rows

    base, schema = url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"SET search_path = {schema}")
        conn.execute(
            """WITH r AS (INSERT INTO runs (state, created_at, updated_at, wait_for, wait_until)
                   SELECT '{}', c.t, c.t, 'signal:go', c.t + %(forever)s
                   FROM (SELECT extract(epoch FROM now()) AS t) AS c, generate_series(1, %(n)s)
                   RETURNING id, created_at),
               t AS (INSERT INTO tasks (run_id, name, payload, available_at, created_at)
                   SELECT id, 'after', 'null', created_at + %(forever)s, created_at FROM r
                   RETURNING id, run_id, available_at, created_at)
               UPDATE runs AS x SET wait_task = t.id, head_at = t.available_at,
                   head_created = t.created_at, head_id = t.id FROM t WHERE x.id = t.run_id""",
            {"n": n, "forever": WAIT_FOREVER},
        )
        conn.execute("ANALYZE")


def latencies(urls: list[str], samples: int) -> list[list[float]]:
    """Claims on each database in turn, each lease given back (the pending count stays)."""
    stores = [open_store(u) for u in urls]
    out: list[list[float]] = [[] for _ in urls]
    for i in range(samples):
        for store, times in zip(stores, out, strict=True):
            started = time.perf_counter()
            lease = store.claim(f"lat-{i % 8}", 600, max_attempts=10**9)
            times.append(time.perf_counter() - started)
            assert lease is not None and lease.task == "ready", "the claim took a waiting run"
            store.commit_many([Commit(lease, "release")])
    for store in stores:
        store.close()
    return [t[samples // 10 :] for t in out]


def rows(directory: str, waiting: int, samples: int, postgres: str | None) -> list[str]:
    out = []
    sqlite_urls = []
    for name in ("none", "waiting"):
        path = os.path.join(directory, f"waits-{name}.db")
        with open_store(path) as store:
            store.start_runs([{"task": "ready"}] * READY)
        if name == "waiting":
            bulk_waiting_sqlite(path, waiting, time.time())
        sqlite_urls.append(f"sqlite:///{path}?synchronous=normal")
    out.append(_row("SQLite", waiting, latencies(sqlite_urls, samples)))
    if postgres:
        import bench_pg  # noqa: PLC0415 - beside this script

        with bench_pg.bench_database(postgres) as database:
            urls = [bench_pg.schema_url(database, f"waits{i}") for i in range(2)]
            for i, url in enumerate(urls):
                with open_store(url) as store:
                    store.start_runs([{"task": "ready"}] * READY)
                if i == 1:
                    bulk_waiting_postgres(url, waiting)
            out.append(_row("PostgreSQL", waiting, latencies(urls, samples)))
    return out


def _row(engine: str, waiting: int, both: list[list[float]]) -> str:
    none, busy = (statistics.median(t) * 1000 for t in both)
    ratio = busy / none
    return (f"| claim latency beside {waiting:,} waiting runs ({engine}) | {busy:.3f} ms "
            f"(none: {none:.3f} ms, {ratio:.2f}x) | <= 1.10x | "
            f"{'met' if ratio <= 1.10 else 'NOT met'} |")  # fmt: skip


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench waits``."""
    ap.add_argument("--waiting", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=400)
    bench_args.add_postgres(
        ap,
        default=os.environ.get(bench_args.SERVER_VARIABLE, ""),
        help="a PostgreSQL server URL (none by default: SQLite only)",
    )


def run(args: argparse.Namespace) -> int:
    d = tempfile.mkdtemp(prefix="lk-bench-waits-")
    try:
        print("| measurement | result | goal | notes |\n| --- | --- | --- | --- |")
        for line in rows(d, args.waiting, args.samples, args.postgres or None):
            print(line, flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0
