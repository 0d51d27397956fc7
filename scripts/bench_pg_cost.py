"""What one run costs the PostgreSQL server (not a test; a row of scripts/bench): its CPU per run
and the dead row versions it leaves per run and per task.

M one-step no-op runs are enqueued with ``start_runs`` (as producers do), then drained by
``supervisor start -n W --concurrency C --drain``. The server's CPU is the sum of user + system
time of the backends connected to the benchmark's database, read with psutil every 50 ms (other
databases on the server do not count); dead row versions are the updates and
deletes of ``runs`` and ``tasks`` in ``pg_stat_user_tables`` (a HOT update is one too, but it is
pruned on its page without an index write: the HOT share is shown beside).

    scripts/bench pg-cost [--runs 20000] [-n 2] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil
import psycopg
from bench_pg import DEFAULT_SERVER, ENV, HERE, PY, bench_database, schema_url, succeeded

from workerproc.store import open_store


class ServerCpu:
    """CPU seconds (user + system) that the server spends on ``database`` while it watches:
    the backends connected to it (their process title names the database; the server's own
    background processes, shared with other databases, are left out), sampled every 50 ms per
    process, so backends that end meanwhile (a pool's, when its drain ends) are counted up to
    their last sample."""

    def __init__(self, database: str) -> None:
        self.tag = f" {database.rsplit('/', 1)[-1]} "
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _sample(self) -> None:
        for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
            times, title = proc.info["cpu_times"], " ".join(proc.info["cmdline"] or ())
            if proc.info["name"] == "postgres" and self.tag in title and times is not None:
                self.first.setdefault(proc.pid, 0.0 if self._thread.is_alive() else
                                      times.user + times.system)  # fmt: skip
                self.last[proc.pid] = times.user + times.system

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def __enter__(self) -> ServerCpu:
        self._sample()  # what the processes already running had spent before
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def seconds(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


@dataclass
class TableStats:
    updates: int
    hot: int
    deletes: int


def table_stats(url: str) -> dict[str, TableStats]:
    """Each table's updates, HOT updates and deletes so far; ``"xacts"``: the database's
    committed transactions (in ``updates``)."""
    base, schema = url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        time.sleep(1.2)  # backends flush their counters at most once a second (PG 15)
        rows = conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
            "WHERE schemaname = %s",
            (schema,),
        ).fetchall()
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    found = {name: TableStats(upd, hot, dels) for name, upd, hot, dels in rows}
    found["xacts"] = TableStats(int(row[0]) if row else 0, 0, 0)
    return found


def enqueue(url: str, m: int) -> float:
    store = open_store(url)
    began = time.monotonic()
    for i in range(0, m, 1000):
        store.start_runs([{"task": "noop"}] * min(1000, m - i))
    store.close()
    return time.monotonic() - began


def drain(url: str, m: int, workers: int, concurrency: int) -> float:
    cmd = [PY, "-m", "supervisor", "start", "-n", str(workers), "--concurrency",
           str(concurrency), "--db", url, "--app", "benchapp:app", "--drain"]  # fmt: skip
    began = time.monotonic()
    code = subprocess.run(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL, check=False).returncode
    elapsed = time.monotonic() - began
    done = succeeded(url)
    if code != 0 or done != m:
        raise SystemExit(f"drain: exit {code}, {done} of {m} runs succeeded")
    return elapsed


def measure(database: str, m: int, workers: int, concurrency: int) -> dict[str, Any]:
    url = schema_url(database, "cost")
    open_store(url).close()  # the schema, before anything is counted
    with ServerCpu(database) as enqueue_cpu:
        enqueue_s = enqueue(url, m)
    before = table_stats(url)
    with ServerCpu(database) as drain_cpu:
        drain_s = drain(url, m, workers, concurrency)
    after = table_stats(url)
    out: dict[str, Any] = {
        "runs": m,
        "enqueue_us": enqueue_cpu.seconds / m * 1e6,
        "drain_us": drain_cpu.seconds / m * 1e6,
        "drain_rate": m / drain_s,
        "enqueue_rate": m / enqueue_s,
    }
    out["xacts"] = (after["xacts"].updates - before["xacts"].updates) / m
    for table in ("runs", "tasks"):
        a, b = after.get(table), before.get(table)
        if a is None or b is None:
            continue
        dead = (a.updates - b.updates) + (a.deletes - b.deletes)
        out[f"{table}_dead"] = dead / m
        out[f"{table}_hot"] = (a.hot - b.hot) / max(1, a.updates - b.updates)
        out[f"{table}_enqueue_dead"] = (b.updates + b.deletes) / m
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench pg-cost``."""
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("-n", type=int, default=2, help="worker processes")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--server", default=DEFAULT_SERVER)


def run(args: argparse.Namespace) -> int:
    with bench_database(args.server) as database:
        r = measure(database, args.runs, args.n, args.concurrency)
    print(
        f"server CPU per run: enqueue {r['enqueue_us']:.0f} us, drain {r['drain_us']:.0f} us "
        f"(drain {r['drain_rate']:.0f} runs/s, -n {args.n} --concurrency {args.concurrency}, "
        f"{r['xacts']:.2f} transactions per run); "
        f"dead row versions per run: runs {r.get('runs_dead', 0):.2f} "
        f"(HOT {r.get('runs_hot', 0):.0%}, +{r.get('runs_enqueue_dead', 0):.2f} at enqueue), "
        f"tasks {r.get('tasks_dead', 0):.2f} (HOT {r.get('tasks_hot', 0):.0%}, "
        f"+{r.get('tasks_enqueue_dead', 0):.2f} at enqueue)"
    )
    return 0
