"""Flow control's cost, on SQLite and PostgreSQL (scripts/bench throughput --parts limits):

(a) no-op throughput: M runs drained by ``supervisor start -n W --drain`` with the task behind a
    limit that never binds (scripts/benchapp_limited.py) vs the same task without limits
    (scripts/benchapp.py), medians of interleaved rounds; the goal is >= 0.8x;
(b) the claim's latency (p50/p99 of a claim of 1 and a batched claim of 16) with K keys of one
    ``per`` limit (concurrency 1 per key) and N runs waiting behind them, vs the same claim on
    N runs without limits. Each lease is finished again after it is timed (untimed), so the
    backlog stays about the same.

    scripts/bench limits [--quick] [--postgres URL|''] [--rounds R] [--tasks M]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import bench_args
import bench_pg
from bench_procs import ENV, HERE, PY

from workerproc.store import Commit, Store, TaskOptions, open_store
from workerproc.store.limits import LimitSpec

ROOMY = LimitSpec.declare("roomy", rate="1000000/s", burst=1_000_000, concurrency=1_000_000)
PER_KEY = LimitSpec.declare("per-tenant", concurrency=1, per="tenant")
CHUNK = 10_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@contextmanager
def databases(kind: str, tmp: str, server: str) -> Iterator[Callable[[str], str]]:
    """A maker of fresh databases (a file, or a database on the server), removed after."""
    made: list[Iterator[str]] = []

    def new(name: str) -> str:
        if kind == "sqlite":
            return os.path.join(tmp, f"{name}-{time.monotonic_ns()}.db")
        ctx = bench_pg.bench_database(server)
        made.append(ctx)
        return ctx.__enter__()  # type: ignore[attr-defined, no-any-return]

    try:
        yield new
    finally:
        for ctx in made:
            ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


def enqueue(url: str, m: int, limited: bool) -> None:
    with open_store(url) as s:
        if limited:  # what the worker writes when it starts, written first: runs join lines
            s.register_tasks({"noop": TaskOptions(limits=("roomy",))})
            s.declare_limits({"roomy": ROOMY}, by="bench")
        for i in range(0, m, CHUNK):
            s.start_runs([{"task": "noop"}] * min(CHUNK, m - i))


def drain(url: str, m: int, workers: int, limited: bool) -> float:
    """Runs per second of ``supervisor start -n W --drain`` from start to exit."""
    enqueue(url, m, limited)
    app = "benchapp_limited:app" if limited else "benchapp:app"
    cmd = [PY, "-m", "supervisor", "start", "-n", str(workers), "--db", url, "--app", app,
           "--drain"]  # fmt: skip
    started = time.monotonic()
    subprocess.run(cmd, cwd=HERE, env=ENV, check=True, timeout=900, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    elapsed = time.monotonic() - started
    with open_store(url) as s:
        done = s.stats().runs.get("succeeded", 0)
    if done != m:
        raise SystemExit(f"{url}: {done} of {m} runs succeeded")
    return m / elapsed


def backlog(url: str, keys: int, n: int, limited: bool) -> Store:
    s = open_store(url)
    if limited:
        s.register_tasks({"call": TaskOptions(limits=("per-tenant",))})
        s.declare_limits({"per-tenant": PER_KEY}, by="bench")
    for i in range(0, n, CHUNK):
        s.start_runs([{"task": "call", "payload": {"tenant": f"t{(i + j) % keys}"}}
                      for j in range(min(CHUNK, n - i))])  # fmt: skip
    return s


def claim_times(s: Store, samples: int, batch: int) -> list[float]:
    out = []
    for k in range(samples):
        started = time.perf_counter()
        leases = s.claim(f"bench:{k}", 60.0, limit=batch)
        out.append(time.perf_counter() - started)
        if not leases:
            raise SystemExit("the claim found nothing: the backlog is too small")
        s.commit_many([Commit(lease, "finish", expected_revision=lease.revision, new_state={})
                       for lease in leases])  # fmt: skip
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench limits``."""
    bench_args.add_quick(ap)
    ap.add_argument("--tasks", type=int, help="no-op runs per side (5,000; quick 300)")
    ap.add_argument("--rounds", type=int, help="rounds (3; quick 1)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keys", type=int, help="keys of the limit (10,000; quick 200)")
    ap.add_argument("--waiting", type=int, help="runs waiting (100,000; quick 2,000)")
    ap.add_argument("--samples", type=int, help="claims timed per row (200; quick 10)")
    bench_args.add_postgres(ap)
    ap.add_argument("--only", choices=("throughput", "claim"), help="one half only")
    bench_args.add_dir(ap)


def run(args: argparse.Namespace) -> int:
    bench_args.fill_sizes(args, (("tasks", 5000, 300), ("rounds", 3, 1), ("keys", 10_000, 200),
                                 ("waiting", 100_000, 2000), ("samples", 200, 10)))  # fmt: skip
    kinds = ["sqlite"] + (["postgres"] if args.postgres else [])
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lk-bench-limits-", dir=args.dir) as tmp:
        for kind in kinds:
            with databases(kind, tmp, args.postgres) as new:
                if args.only != "claim":
                    rows += throughput(kind, new, args)
                if args.only != "throughput":
                    rows += latency(kind, new, args)
    print("\n| flow control | without limits | with limits | ratio |")
    print("| --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


def throughput(kind: str, new: Callable[[str], str], args: argparse.Namespace) -> list[str]:
    got: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for limited in (False, True) if r % 2 == 0 else (True, False):
            rate = drain(new("tp"), args.tasks, args.workers, limited)
            got[limited].append(rate)
            print(f"  {kind} round {r + 1}: {'limited' if limited else 'plain':<8} {rate:8.0f} /s",
                  file=sys.stderr, flush=True)  # fmt: skip
    plain, gated = statistics.median(got[False]), statistics.median(got[True])
    return [f"| {kind}: no-op throughput, -n {args.workers}, {args.tasks:,} runs, a limit that "
            f"never binds | {plain:,.0f} /s | {gated:,.0f} /s | {gated / plain:.2f}x "
            f"(goal >= 0.8x) |"]  # fmt: skip


def latency(kind: str, new: Callable[[str], str], args: argparse.Namespace) -> list[str]:
    rows = []
    plain = backlog(new("plain"), args.keys, args.waiting, False)
    gated = backlog(new("gated"), args.keys, args.waiting, True)
    try:
        for batch in (1, 16):
            a = claim_times(plain, args.samples, batch)
            b = claim_times(gated, args.samples, batch)
            what = "a claim" if batch == 1 else f"a batched claim of {batch}"
            rows.append(
                f"| {kind}: {what}, {args.keys:,} keys of one limit, {args.waiting:,} runs "
                f"waiting (p50 / p99) | {pct(a, 0.5) * 1e3:.2f} / {pct(a, 0.99) * 1e3:.2f} ms "
                f"| {pct(b, 0.5) * 1e3:.2f} / {pct(b, 0.99) * 1e3:.2f} ms "
                f"| {pct(b, 0.5) / pct(a, 0.5):.2f}x (p50) |"
            )
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        plain.close()
        gated.close()
    return rows
