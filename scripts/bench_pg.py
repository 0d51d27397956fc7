"""scripts/bench's PostgreSQL rows (not a test): ours from one and from two supervisors, idle
pickup, takeover after SIGKILL, the claim beside a million finished runs and their prune, the
claim (one task, a batch of 16) from all, one and several queues with a million pending runs in
10 queues, and procrastinate (the peer, in the bench extra) on the same server with the same no-op
workload.

Everything happens in one database made for the run (``lk_bench_<pid>``) and dropped after it,
each measurement in its own schema: other people's databases on the server are never touched.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import bench_args
import psycopg
from bench_pg_floor import raw_pickup

from workerproc.store import Commit, open_store

HERE = Path(__file__).resolve().parent
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
DEFAULT_SERVER = bench_args.SERVER


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextmanager
def bench_database(server: str) -> Iterator[str]:
    """A database for this run on ``server`` (a URL naming any database we may connect to)."""
    name = f"lk_bench_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server)._replace(path=f"/{name}", query=""))
    finally:
        with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schema_url(database: str, tag: str) -> str:
    return f"{database}?schema={tag}_{secrets.token_hex(3)}"


def bulk_noop_runs(url: str, n: int, *, finished: bool = False) -> None:
    """``n`` runs of one no-op task each, in two statements, written with their claim columns
    (the head: since schema v3 no trigger fills them); ``finished``: runs that succeeded a day
    ago."""
    store = open_store(url)  # creates the schema
    store.close()
    base, schema = url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"SET search_path = {schema}")
        if finished:
            conn.execute("SET session_replication_role = replica")  # no triggers: NULL is exact
            conn.execute(
                "INSERT INTO runs (status, created_at, updated_at, finished_at) "
                "SELECT 'succeeded', t, t, t FROM (SELECT extract(epoch FROM now()) - 86400 "
                "AS t) AS c, generate_series(1, %s)", (n,),
            )  # fmt: skip
            conn.execute(
                "INSERT INTO tasks (run_id, name, available_at, created_at, done_at, attempts, "
                "done_attempt) SELECT id, 'noop', created_at, created_at, created_at, 1, 1 "
                "FROM runs WHERE status = 'succeeded'"
            )
            conn.execute("VACUUM (ANALYZE) runs, tasks")  # as autovacuum would leave them
            return
        conn.execute(
            "INSERT INTO runs (id, created_at, updated_at, task, head_at, head_created, head_id) "
            "SELECT g, t, t, 'noop', t, t, g FROM (SELECT extract(epoch FROM now()) - 1 AS t) "
            "AS c, generate_series(1, %s) AS g", (n,),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO tasks (id, run_id, name, available_at, created_at) "
            "SELECT id, id, 'noop', created_at, created_at FROM runs WHERE status = 'pending'"
        )
        for table in ("runs", "tasks"):
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", (n + 1,))
        conn.execute("VACUUM (ANALYZE) runs, tasks")


def succeeded(url: str) -> int:
    store = open_store(url)
    try:
        return store.stats().runs.get("succeeded", 0)
    finally:
        store.close()


# -- ours --------------------------------------------------------------------------------------
def ours(database: str, m: int, w: int, supervisors: int) -> float:
    """Throughput: ``supervisors`` x ``supervisor start -n w --drain`` on one database."""
    url = schema_url(database, f"ours{supervisors}x{w}")
    bulk_noop_runs(url, m)
    cmd = [PY, "-m", "supervisor", "start", "-n", str(w), "--db", url, "--app", "benchapp:app",
           "--drain"]  # fmt: skip
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
             for _ in range(supervisors)]  # fmt: skip
    codes = [p.wait(1800) for p in procs]
    elapsed = time.monotonic() - started
    done = succeeded(url)
    if codes != [0] * supervisors or done != m:
        raise SystemExit(f"ours on PostgreSQL: exits {codes}, {done} of {m} runs succeeded")
    return m / elapsed


def pickup(database: str, samples: int, gaps: list[float]) -> tuple[list[float], list[float]]:
    """Idle pickup into an idle pool of 8: (``start_run``'s own ms, ms until the handler
    starts), both from just before ``start_run``."""
    url = schema_url(database, "pickup")
    open_store(url).close()
    cmd = [PY, "-m", "supervisor", "start", "-n", "8", "--db", url, "--app", "benchapp:app"]
    proc = subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
    store = open_store(url)
    enqueues: list[float] = []
    out: list[float] = []
    try:
        time.sleep(3)  # up, then idle
        for gap in gaps[:samples]:
            time.sleep(gap)
            t0 = time.time()
            run_id = store.start_run("stamp")
            enqueues.append((time.time() - t0) * 1000)
            while (run := store.get_run(run_id)) is None or run.status != "succeeded":
                time.sleep(0.0005)
            out.append((float(run.result) - t0) * 1000)
    finally:
        proc.terminate()
        proc.wait(30)
        store.close()
    return enqueues, out


def takeover(database: str, trials: int) -> list[float]:
    from measure_fast_release import measure  # noqa: PLC0415 - its own script, reused

    return measure(trials, 30.0, True, False, db=schema_url(database, "takeover"))


def claim_beside_finished(database: str, finished: int, samples: int) -> dict[str, float]:
    """Claim latency (ms) with and without ``finished`` old runs in the tables, ``stats()`` and
    the dashboard's chart read (ms, p50) beside them, then how long ``prune`` takes to delete
    them (s)."""
    out: dict[str, float] = {}
    for label, n in (("empty", 0), ("full", finished)):
        url = schema_url(database, f"fin{label}")
        if n:
            bulk_noop_runs(url, n, finished=True)
        store = open_store(url)
        for _ in range(samples):
            store.start_run("noop")
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            lease = store.claim("bench", 60)
            times.append((time.perf_counter() - t0) * 1000)
            assert lease is not None and store.ack(lease)
        out[f"{label}_p50"], out[f"{label}_p99"] = statistics.median(times), pct(times, 0.99)
        for read, fn in (("stats", store.stats), ("chart", lambda s=store: s.finished_since(
                s.now() - 3600, 60, newest=200_000))):  # fmt: skip
            times = []
            for _ in range(max(20, samples // 20)):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1000)
            out[f"{label}_{read}"] = statistics.median(times)
        if n:
            t0 = time.perf_counter()
            out["pruned"] = store.prune(3600.0, batch=5000)
            out["prune_s"] = time.perf_counter() - t0
        store.close()
    return out


def bulk_pending_in_queues(url: str, n: int, queues: int = 10) -> None:
    """``n`` pending one-task runs over ``queues`` queues (``q0``...): 1 in 10 delayed by an
    hour, 1 in 50 at priority 5 or -5, written with their claim columns in two statements (no
    per-row trigger work: the columns are what the triggers would have written)."""
    store = open_store(url)  # creates the schema
    store.close()
    base, schema = url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"SET search_path = {schema}")
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            """INSERT INTO runs (id, state, created_at, updated_at, queue, priority, task,
                                 head_at, head_created, head_id)
            SELECT g, '{}', c.t, c.t, 'q' || (g %% %(queues)s),
                CASE g %% 100 WHEN 0 THEN 5 WHEN 1 THEN -5 ELSE 0 END, 'noop',
                c.t + g * 1e-6 + CASE WHEN g %% 10 = 3 THEN 3600 ELSE 0 END, c.t, g
            FROM (SELECT extract(epoch FROM now()) - 600 AS t) AS c,
                generate_series(1, %(n)s) AS g""",
            {"n": n, "queues": queues},
        )
        conn.execute(
            "INSERT INTO tasks (id, run_id, name, payload, available_at, created_at) "
            "SELECT id, id, 'noop', '{}', head_at, head_created FROM runs"
        )
        for table in ("runs", "tasks"):
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", (n + 1,))
        # as autovacuum would leave them: the first claims do not set every row's hint bits
        conn.execute("VACUUM (ANALYZE) runs, tasks")


CLAIMS = [
    ("all queues", None, 1),
    ("1 queue", ["q1"], 1),
    ("all queues", None, 16),
    ("2 queues", ["q1", "q2"], 16),
    ("10 queues", [f"q{i}" for i in range(10)], 16),
]


def claim_at_depth(database: str, pending: int, samples: int) -> dict[str, float]:
    """Claim latency (ms, p50) of one task and of a batch of 16, from all, one, two and ten
    named queues, with 100 pending runs and with ``pending`` runs in 10 queues; each claim's
    leases are handed back (the tables stay as they were)."""
    out: dict[str, float] = {}
    for label, n in (("small", 100), ("deep", pending)):
        url = schema_url(database, f"depth{label}")
        bulk_pending_in_queues(url, n)
        store = open_store(url)
        for what, queues, k in CLAIMS:
            times = []
            for _ in range(samples):
                t0 = time.perf_counter()
                leases = store.claim("bench", 60, limit=k, queues=queues)
                times.append((time.perf_counter() - t0) * 1000)
                store.commit_many([Commit(lease, "handback") for lease in leases])
            out[f"{label} {what} {k}"] = statistics.median(times)
        store.close()
    return out


# -- procrastinate -----------------------------------------------------------------------------
def procrastinate(database: str, m: int, w: int, concurrency: int = 1) -> float:
    """The peer: ``w`` procrastinate worker processes (``concurrency`` jobs at once each,
    LISTEN/NOTIFY on) drain ``m`` no-op jobs deferred beforehand; timed from worker start to
    the last success."""
    schema = f"proc_{secrets.token_hex(3)}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = f"{database}?options=-csearch_path%3D{schema}"
    env = {**ENV, "LK_PROCRASTINATE_URL": url}
    setup = (
        "import bench_procrastinate as b\n"
        "with b.app.open():\n"
        "    b.app.schema_manager.apply_schema()\n"
        f"    d = b.app.configure_task(name='noop')\n"
        f"    d.batch_defer(*[{{}} for _ in range({m})])\n"
    )
    subprocess.run([PY, "-c", setup], cwd=HERE, env=env, check=True)
    cmd = [str(Path(PY).with_name("procrastinate")), "--app", "bench_procrastinate.worker_app",
           "worker", "--concurrency", str(concurrency), "--one-shot"]  # fmt: skip
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(w)]  # fmt: skip
    for p in procs:
        p.wait(1800)
    elapsed = time.monotonic() - started
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
    done = int(row[0]) if row else 0
    if done != m:
        raise SystemExit(f"procrastinate {w}x{concurrency}: {done} of {m} jobs succeeded")
    return m / elapsed


def procrastinate_version() -> str:
    import procrastinate as p  # noqa: PLC0415 - the bench extra

    return str(getattr(p, "__version__", "?"))


PEER_CONCURRENCY = 4  # procrastinate's other shape: each process runs 4 jobs at once


def throughput_sides(database: str, m: int, w: int) -> list[tuple[str, Any]]:
    """One round's throughput sides at ``w`` worker processes in all: ours from one
    supervisor (``-n w``) and from two (``-n w/2`` each, stand-ins for two hosts; the same
    number of processes), procrastinate's ``w`` processes one job at a time and
    ``PEER_CONCURRENCY`` at a time (its better shape counts)."""
    sides: list[tuple[str, Any]] = [(f"pg ours 1x{w}", lambda: ours(database, m, w, 1))]
    if w >= 2 and w % 2 == 0:
        sides.append((f"pg ours 2x{w // 2}", lambda: ours(database, m, w // 2, 2)))
    sides.append((f"procrastinate {w}x1", lambda: procrastinate(database, m, w)))
    sides.append((f"procrastinate {w}x{PEER_CONCURRENCY}",
                  lambda: procrastinate(database, m, w, PEER_CONCURRENCY)))  # fmt: skip
    return sides


def throughput_rows(results: dict[str, list[float]], widths: list[int]) -> list[str]:
    """At equal footing: the same number of worker processes on both sides, ours at its better
    shape (one supervisor or two) against procrastinate at its better one."""
    med = statistics.median
    out = [
        "| throughput (tasks/s) | worker processes | ours, 1 supervisor | ours, 2 supervisors "
        f"| procrastinate, 1 job each | procrastinate, {PEER_CONCURRENCY} jobs each "
        "| ours / procrastinate, best of each | goal |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for w in widths:
        one = med(results[f"pg ours 1x{w}"])
        two = med(results[f"pg ours 2x{w // 2}"]) if f"pg ours 2x{w // 2}" in results else None
        peer1 = med(results[f"procrastinate {w}x1"])
        peer_c = med(results[f"procrastinate {w}x{PEER_CONCURRENCY}"])
        best = max(one, two or 0.0) / max(peer1, peer_c)
        shown = "-" if two is None or w < 2 else f"{two:,.0f}"
        out.append(f"| no-op | {w} | {one:,.0f} | {shown} | {peer1:,.0f} | {peer_c:,.0f} "
                   f"| {best:.1f}x | >= 10x |")  # fmt: skip
    return out


def cost_rows(database: str, m: int) -> list[str]:
    """The server's CPU per run and the dead row versions per run and per task
    (scripts/bench pg-cost), one-step no-op runs drained by ``-n 2 --concurrency 8``."""
    from bench_pg_cost import measure  # noqa: PLC0415 - it imports this module

    r = measure(database, m, 2, 8)
    return [
        f"| server CPU per run, drain, -n 2 --concurrency 8 (us) | {r['drain_us']:.0f} "
        f"({r['drain_rate']:,.0f} runs/s, {r['xacts']:.2f} transactions per run) "
        "| <= 175 (half of 300-350) |",
        f"| server CPU per run, enqueue by start_runs (us) | {r['enqueue_us']:.0f} | - |",
        f"| dead row versions per run (runs), drain | {r.get('runs_dead', 0):.2f} "
        f"(HOT {r.get('runs_hot', 0):.0%}) | <= 1 |",
        f"| dead row versions per task (tasks), drain | {r.get('tasks_dead', 0):.2f} "
        f"(HOT {r.get('tasks_hot', 0):.0%}) | <= 1 |",
    ]


def rows(database: str, args: Any, widths: list[int], gaps: list[float]) -> list[str]:
    """Measure and return the markdown lines of the PostgreSQL tables."""
    m = args.tasks
    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for w in widths:
            sides = throughput_sides(database, m, w)
            for key, fn in sides if r % 2 == 0 else reversed(sides):
                value = fn()
                results.setdefault(key, []).append(value)
                print(f"  round {r + 1}: {key:<22} {value:8.0f} /s", file=sys.stderr, flush=True)
    print("  PostgreSQL cost per run, idle pickup, takeover, finished runs ...", file=sys.stderr,
          flush=True)  # fmt: skip
    cost = cost_rows(database, m)
    enq, lat = pickup(database, args.samples, gaps)
    floor_enq, floor = raw_pickup(database, gaps[: args.samples])
    fast = takeover(database, 3 if args.quick else 10)
    fin = claim_beside_finished(database, 20_000 if args.quick else 1_000_000,
                                200 if args.quick else 2_000)  # fmt: skip
    depth = 20_000 if args.quick else 1_000_000
    claims = claim_at_depth(database, depth, 20 if args.quick else 200)
    med = statistics.median
    out = [
        f"\nPostgreSQL ({server_version(database)}), procrastinate {procrastinate_version()}, "
        f"same server, same {m:,} no-op tasks, median of {args.rounds} rounds\n",
        *throughput_rows(results, widths),
        "\n| measure (PostgreSQL) | ours | goal |",
        "| --- | --- | --- |",
        *cost,
        f"| idle pickup p50 / p99 (ms), {len(lat)} samples | {med(lat):.1f} / "
        f"{pct(lat, 0.99):.1f} | p50 <= 10 |",
        f"| ... of which `start_run` itself (its commit) p50 / p99 (ms) | {med(enq):.1f} / "
        f"{pct(enq, 0.99):.1f} | - |",
        f"| raw floor (bench_pg_floor): bare INSERT + NOTIFY, LISTEN, one-statement claim, "
        f"p50 / p99 (ms) | {med(floor):.1f} / {pct(floor, 0.99):.1f} (commit p50 "
        f"{med(floor_enq):.1f}) | - |",
        f"| takeover after SIGKILL, fast release p50 / p99 (ms) | {med(fast):.1f} / "
        f"{pct(fast, 0.99):.1f} | p99 <= 50 |",
        f"| claim+ack p50 / p99 (ms): empty tables | {fin['empty_p50']:.2f} / "
        f"{fin['empty_p99']:.2f} | - |",
        f"| claim+ack p50 / p99 (ms): beside {int(fin['pruned']):,} finished runs | "
        f"{fin['full_p50']:.2f} / {fin['full_p99']:.2f} | ~ empty |",
        f"| stats() p50 (ms): empty tables / beside {int(fin['pruned']):,} finished runs | "
        f"{fin['empty_stats']:.2f} / {fin['full_stats']:.2f} | ~ empty |",
        f"| the dashboard's chart read p50 (ms): empty tables / beside those runs | "
        f"{fin['empty_chart']:.2f} / {fin['full_chart']:.2f} | ~ empty |",
        f"| prune --older-than 1h of those runs (s) | {fin['prune_s']:.1f} | - |",
        f"\n| claim p50 (ms), then handed back | 100 pending | {depth:,} pending in 10 queues "
        "| goal |",
        "| --- | ---: | ---: | --- |",
    ]
    for what, _, k in CLAIMS:
        goal = "< 10" if (what, k) == ("10 queues", 16) else "-"
        out.append(f"| {k} from {what} | {claims[f'small {what} {k}']:.2f} | "
                   f"{claims[f'deep {what} {k}']:.2f} | {goal} |")  # fmt: skip
    return out


def server_version(database: str) -> str:
    with psycopg.connect(database, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return f"PostgreSQL {row[0] if row else '?'}"
