"""leasekeeper vs huey on the same machine, in one run, interleaved (see scripts/bench).

Throughput (--parts noop): M no-op runs drained by `supervisor start -n W --drain` vs M no-op
huey tasks with `huey_consumer -k process -w W`, both at synchronous FULL (plus a NORMAL row for
ours), timed from process start until the last one is done (ours: the last run's finished_at in
the database; huey: the last of one datagram per task), beside the raw fused one-transaction loop
(complete the previous task + claim the next in one transaction) as the ceiling. Slots (--parts
slots, scripts/bench_slots.py): ours at -n 2 --concurrency 16 and -n 8 --concurrency 4 and the
raw batched ceiling join the widest round. I/O-bound (--parts io): sync and async handlers at
-n 2 --concurrency 250 vs huey's thread workers, with the workers' peak RSS. Medians of --rounds
rounds; the order alternates per round. Then (--parts latency) idle pickup, takeover after
SIGKILL, write-lock wait and peak RSS; last, the goals the slots must meet (scripts/bench_goals.py).
Then the PostgreSQL rows (scripts/bench_pg.py, unless --postgres ''): ours from one and from two
supervisors beside procrastinate on the same server, idle pickup, takeover, and the claim beside
a million finished runs. Last (--parts limits, scripts/bench limits): flow control's cost,
no-op throughput behind a limit that never binds and the claim beside 10,000 keys of one limit.
And (--parts waits, scripts/bench waits) the claim's latency beside
100,000 runs that wait for a signal and beside none, on both backends; (--parts
webhooks, scripts/bench webhooks) webhook delivery's rate and its commit-to-receipt latency.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import bench_args
import bench_before
import bench_goals
import bench_pg
import bench_slots
import bench_waits
from bench_procs import (
    ENV,
    HERE,
    PY,
    Inbox,
    drain,
    huey_consumer,
    huey_drain,
    huey_enqueue,
    huey_env,
    stop,
)
from bench_raw import raw
from bench_slots import Side, rate, ratio, value
from bench_store import bulk_runs, hammer, new_db, pct

from workerproc.store import open_store


# -- throughput ------------------------------------------------------------------------------------
def ours(tmp: str, m: int, w: int, sync: str, rss: dict[str, float] | None = None) -> float:
    db = new_db(tmp, f"ours-{w}-{sync}-{time.monotonic_ns()}")
    bulk_runs(db, m, time.time() - 1)
    return m / drain(db, m, f"sqlite:///{db}?synchronous={sync}", ["-n", str(w)], rss)


def huey(tmp: str, m: int, w: int) -> float:
    env, inbox = huey_env(tmp, f"tp{w}")
    huey_enqueue(env, "noop", m)
    return m / huey_drain(env, inbox, m, w)


# -- latency -----------------------------------------------------------------------------------
def gaps(n: int) -> list[float]:
    import random  # noqa: PLC0415 - only here

    rng = random.Random(7)
    return [rng.uniform(0.2, 2.0) for _ in range(n)]


def ours_pickup(tmp: str, samples: int, options: Sequence[str] = ("-n", "8")) -> list[float]:
    db = new_db(tmp, f"pickup-{time.monotonic_ns()}")
    cmd = [PY, "-m", "supervisor", "start", *options, "--db", db, "--app", "benchapp:app"]
    proc = subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
    store = open_store(db)
    out = []
    try:
        time.sleep(3)  # up, then idle
        for gap in gaps(samples):
            time.sleep(gap)
            t0 = time.time()
            run_id = store.start_run("stamp")
            while (run := store.get_run(run_id)) is None or run.status != "succeeded":
                time.sleep(0.0005)
            out.append((float(run.result) - t0) * 1000)
    finally:
        stop(proc)
        store.close()
    return out


def huey_pickup(env: dict[str, str], inbox: Inbox, samples: int, idle: float) -> list[float]:
    proc = huey_consumer(env, 8)
    out = []
    try:
        time.sleep(idle)  # "after it has been idle a minute": its polling delay has grown
        inbox.keep = True
        for gap in gaps(samples):
            time.sleep(gap)
            before = len(inbox.messages)
            t0 = time.time()
            huey_enqueue(env, "stamp", 1)
            deadline = time.monotonic() + 30
            while len(inbox.messages) == before and time.monotonic() < deadline:
                time.sleep(0.0005)
            out.append((float(inbox.messages[-1][1]) - t0) * 1000)
    finally:
        stop(proc)
    return out


def huey_kill(env: dict[str, str], inbox: Inbox) -> tuple[int, int]:
    """SIGKILL the huey worker running a task: is the task ever run again?"""
    proc = huey_consumer(env, 2)
    lost = trials = 0
    try:
        inbox.keep = True
        for _ in range(2):
            trials += 1
            before = len(inbox.messages)
            huey_enqueue(env, "hold", 1, 3.0)
            deadline = time.monotonic() + 30
            while len(inbox.messages) == before and time.monotonic() < deadline:
                time.sleep(0.001)
            pid = int(inbox.messages[-1][1].split()[1])
            os.kill(pid, signal.SIGKILL)
            time.sleep(6.0)  # twice the task's length: a re-run would have started and ended
            rerun = [m for _, m in inbox.messages[before + 1 :] if m.startswith(b"start")]
            lost += not rerun
    finally:
        stop(proc)
    return lost, trials


def takeover(fast: bool, trials: int) -> list[float]:
    from measure_fast_release import measure  # noqa: PLC0415 - its own script, reused

    return measure(trials, 30.0 if fast else 2.0, fast, False)  # milliseconds


@dataclass
class Latency:
    """Idle pickup (ms; with default options and with slots), takeover after SIGKILL (ms),
    write-lock wait (s); huey's sides are None with --no-huey."""

    ours: list[float]
    slots: list[float]
    huey: list[float] | None
    fast: list[float]
    slow: list[float]
    huey_lost: tuple[int, int] | None
    waits: list[float]
    worst: float
    before: bench_before.Before | None = None  # pickup and takeover beside --before, same run


def latency(args: Any, tmp: str) -> Latency:
    print("  idle pickup, takeover, lock wait ...", file=sys.stderr, flush=True)
    ours_lat = ours_pickup(tmp, args.samples)
    n, c = bench_slots.SHAPES[0]
    slots_lat = ours_pickup(tmp, args.samples, ("-n", str(n), "--concurrency", str(c)))
    huey_lat = huey_lost = None
    if not args.no_huey:
        henv, hinbox = huey_env(tmp, "idle")
        huey_lat = huey_pickup(henv, hinbox, args.samples, args.idle)
    fast = takeover(True, 3 if args.quick else 10)
    slow = takeover(False, 2 if args.quick else 3)
    if not args.no_huey:
        kenv, kinbox = huey_env(tmp, "kill")
        huey_lost = huey_kill(kenv, kinbox)
    lock_path = new_db(tmp, "lock")
    bulk_runs(lock_path, 200_000 if not args.quick else 20_000, time.time() - 60)
    lock = hammer(f"sqlite:///{lock_path}", 8, 3.0 if args.quick else 8.0, lock_probe=True)
    waits = [x for res in lock for x in res[3]]
    worst = max(pct(res[3], 0.99) for res in lock)
    before = None
    if args.before and bench_before.exists(args.before):
        samples, trials, rounds = (10, 2, 1) if args.quick else (120, 12, 2)
        tasks = 1_500 if args.quick else 20_000
        before = bench_before.measure(args.before, samples, trials, rounds, tasks)
    elif args.before:
        print(f"  no commit {args.before} in this clone: no comparison with it", file=sys.stderr)
    return Latency(ours_lat, slots_lat, huey_lat, fast, slow, huey_lost, waits, worst, before)


def round_sides(
    tmp: str, m: int, w: int, rss: dict[str, float] | None
) -> list[tuple[str, Callable[[], float]]]:
    """One round's measurements at width ``w`` (the widest also runs ours at NORMAL)."""
    return [
        (f"ours -n {w}", lambda: ours(tmp, m, w, "full", rss)),
        (f"huey -w {w}", lambda: huey(tmp, m, w)),
        (f"raw fused {w}", lambda: raw(tmp, m, w)),
        (f"ours -n {w} NORMAL", lambda: ours(tmp, m, w, "normal")),
    ]


def noop_round(args: Any, tmp: str, parts: set[str], widths: list[int],
               rss: dict[str, float]) -> list[list[Side]]:  # fmt: skip
    """Each width's sides for one no-op round: ours, huey and the fused ceiling (the widest also
    runs ours at NORMAL); with slots, the raw batched ceiling at every width, and ours with
    slots in the widest round (huey -w W and the fused ceilings are their references)."""
    top, out = max(widths), []
    for w in widths:
        sides: list[Side] = []
        if "noop" in parts:
            sides = round_sides(tmp, args.tasks, w, rss if w == top else None)
            sides = sides if w == top else sides[:3]
        if "slots" in parts:
            if "noop" not in parts:  # the references: huey and the fused ceiling
                sides = round_sides(tmp, args.tasks, w, None)[1 if w == top else 2 : 3]
            sides += bench_slots.noop_sides(tmp, args.tasks, w, w == top)
        out.append([s for s in sides if not (args.no_huey and s[0].startswith("huey"))])
    return out


# -- the table ---------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values)


PARTS = ("noop", "slots", "io", "latency", "postgres", "limits", "waits", "webhooks")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench throughput``."""
    ap.add_argument("--tasks", type=int, help="no-op tasks per side (20,000; quick 1,500)")
    ap.add_argument("--rounds", type=int, help="rounds (3; quick 1)")
    ap.add_argument("--workers", default="1,2,8")
    ap.add_argument("--samples", type=int, help="idle pickup samples (30; quick 5)")
    ap.add_argument("--idle", type=float, help="huey's idle time before pickup (60 s; quick 3)")
    bench_args.add_quick(ap)
    bench_args.add_postgres(
        ap, help="a PostgreSQL server URL for the PostgreSQL rows ('' to skip them)"
    )
    ap.add_argument("--only-postgres", action="store_true", help="skip the SQLite rows")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    ap.add_argument("--no-huey", action="store_true", help="leave huey's sides out")
    ap.add_argument(
        "--before",
        default=bench_before.BASELINE,
        help="the commit 'no worse than today' compares with, measured beside this checkout in "
        f"the same run ({bench_before.BASELINE}; '' to skip)",
    )
    bench_args.add_dir(ap)
    bench_slots.add_arguments(ap)


def run(args: argparse.Namespace) -> int:
    bench_args.fill_sizes(args, (("tasks", 20_000, 1500), ("rounds", 3, 1), ("samples", 30, 5),
                                 ("idle", 60.0, 3.0)))  # fmt: skip
    widths = [int(w) for w in args.workers.split(",")]
    parts = set(args.parts.split(","))
    if not parts <= set(PARTS):
        args.parser.error(f"--parts: unknown {', '.join(sorted(parts - set(PARTS)))}")
    if args.only_postgres:
        return postgres_rows(args, widths)
    if parts == {"limits"}:  # flow control's rows alone (scripts/bench limits)
        return limits_rows(args)
    if parts == {"webhooks"}:  # webhook delivery's rows alone (scripts/bench webhooks)
        return webhooks_rows(args)
    tmp = tempfile.mkdtemp(prefix="lk-bench-", dir=args.dir)
    results: dict[str, list[float]] = {}
    rss: dict[str, float] = {}
    rss_io: dict[str, dict[str, float]] = {}
    started = time.monotonic()

    def side(r: int, key: str, fn: Callable[[], float], unit: str = "/s") -> None:
        value = fn()
        results.setdefault(key, []).append(value)
        shown = f"{value:8.2f} s" if unit == "s" else f"{value:8.0f} /s"
        print(f"  round {r + 1}: {key:<22} {shown}", file=sys.stderr, flush=True)

    try:
        for r in range(args.rounds):
            for sides in noop_round(args, tmp, parts, widths, rss):
                for key, fn in sides if r % 2 == 0 else reversed(sides):
                    side(r, key, fn)
        if "io" in parts:
            for r in range(args.rounds):
                sides = bench_slots.io_sides(tmp, args, rss_io, not args.no_huey)
                for key, fn in sides if r % 2 == 0 else reversed(sides):
                    side(r, key, fn, "s")
        lat = latency(args, tmp) if "latency" in parts else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if "waits" in parts:  # the claim beside 100,000 waiting runs, both backends
        waiting = 5_000 if args.quick else 100_000
        print("\n| measurement | result | goal | notes |\n| --- | --- | --- | --- |")
        with tempfile.TemporaryDirectory(prefix="lk-waits-", dir=args.dir) as scratch:
            for line in bench_waits.rows(scratch, waiting, 50 if args.quick else 400,
                                         args.postgres or None):  # fmt: skip
                print(line)
    print_table(args, widths, results, rss, lat, time.monotonic() - started)
    bench_slots.print_tables(args, widths, results, rss_io)
    bench_goals.print_goals(widths, results, rss_io, lat)
    code = postgres_rows(args, widths) if args.postgres and "postgres" in parts else 0
    code = code or (limits_rows(args) if "limits" in parts else 0)
    return code or (webhooks_rows(args) if "webhooks" in parts else 0)


def limits_rows(args: Any) -> int:
    """Flow control's cost, both backends (scripts/bench limits, its own sizes)."""
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "bench.py"), "limits",
           "--postgres", args.postgres or ""] + (["--quick"] if args.quick else [])  # fmt: skip
    if args.dir:
        cmd += ["--dir", args.dir]
    return subprocess.run(cmd, check=False).returncode


def webhooks_rows(args: Any) -> int:
    """Webhook delivery, both backends (scripts/bench webhooks, its own sizes)."""
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "bench.py"), "webhooks",
           "--postgres", args.postgres or ""] + (["--quick"] if args.quick else [])  # fmt: skip
    return subprocess.run(cmd, check=False).returncode


def postgres_rows(args: Any, widths: list[int]) -> int:
    if not args.postgres:
        raise SystemExit("--only-postgres needs --postgres URL")
    try:
        database = bench_pg.bench_database(args.postgres)
        url = database.__enter__()
    except Exception as exc:
        print(f"\nno PostgreSQL rows: cannot use {args.postgres}: {exc}", file=sys.stderr)
        return 1
    try:
        for line in bench_pg.rows(url, args, widths, gaps(args.samples)):
            print(line)
    finally:
        database.__exit__(None, None, None)
    return 0


def print_table(args: Any, widths: list[int], results: dict[str, list[float]],
                rss: dict[str, float], lat: Latency | None, elapsed: float) -> None:  # fmt: skip
    cpu = platform.processor() or platform.machine()
    print(f"\nmachine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, huey {huey_version()}; {args.tasks:,} no-op tasks, "
          f"median of {args.rounds} rounds; {elapsed:.0f} s in all\n")  # fmt: skip
    if f"ours -n {widths[0]}" in results:
        print("| throughput (tasks/s) | W | ours | huey | raw fused ceiling | ours / huey "
              "| ours / ceiling |")  # fmt: skip
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in widths:
        o, h, c = (value(results, f"{k} {w}") for k in ("ours -n", "huey -w", "raw fused"))
        if o is not None:
            print(f"| FULL | {w} | {rate(o)} | {rate(h)} | {rate(c)} | {ratio(o, h)} "
                  f"| {ratio(o, c, '{:.0%}')} |")  # fmt: skip
    top = max(widths)
    if f"ours -n {top} NORMAL" in results:
        o = value(results, f"ours -n {top} NORMAL")
        h, c = value(results, f"huey -w {top}"), value(results, f"raw fused {top}")
        print(f"| ours NORMAL vs FULL | {top} | {rate(o)} | {rate(h)} | {rate(c)} "
              f"| {ratio(o, h)} | {ratio(o, c, '{:.0%}')} |")  # fmt: skip
    if lat is not None:
        print_latency(args, lat, rss)


def print_latency(args: Any, lat: Latency, rss: dict[str, float]) -> None:
    n, c = bench_slots.SHAPES[0]
    huey_lat = (
        "-"
        if lat.huey is None
        else (f"{median(lat.huey):.0f} / {pct(lat.huey, 0.99):.0f} (idle {args.idle:g} s first)")
    )
    lost = "-" if lat.huey_lost is None else (
        f"task lost in {lat.huey_lost[0]} of {lat.huey_lost[1]} kills")  # fmt: skip
    print("\n| measure | ours | huey | goal |")
    print("| --- | --- | --- | --- |")
    print(f"| idle pickup p50 / p99 (ms), {args.samples} samples | "
          f"{median(lat.ours):.1f} / {pct(lat.ours, 0.99):.1f} | {huey_lat} "
          "| p50 <= 20, p99 <= 100 |")  # fmt: skip
    print(f"| idle pickup p50 / p99 (ms), -n {n} --concurrency {c} | {median(lat.slots):.1f} / "
          f"{pct(lat.slots, 0.99):.1f} | - | p50 <= 20, p99 <= 100 |")  # fmt: skip
    print(f"| takeover after SIGKILL, fast release p50 / p99 (ms) | {median(lat.fast):.1f} / "
          f"{pct(lat.fast, 0.99):.1f} | {lost} | p99 <= 200 |")  # fmt: skip
    print(f"| takeover after SIGKILL, ttl path (ttl 2 s) p50 (ms) | {median(lat.slow):.0f} | "
          "- | ~ ttl |")  # fmt: skip
    p99, worst = pct(lat.waits, 0.99) * 1000, lat.worst * 1000
    print(f"| write-lock wait, 8 busy processes: p99 all / worst process (ms) | {p99:.1f} / "
          f"{worst:.1f} | - | p99 <= 50 |")  # fmt: skip
    if rss:
        print(f"| peak RSS, supervisor / one worker (MB), -n 8 | {rss.get('supervisor', 0):.1f} "
              f"/ {rss.get('worker', 0):.1f} | - | <= 30 / <= 25 |")  # fmt: skip
    if lat.before is not None:
        print()
        print("\n".join(bench_before.table(args.before, lat.before)))


def huey_version() -> str:
    try:
        import huey as h  # noqa: PLC0415 - the bench extra
    except ImportError:
        return "not installed"
    return str(h.__version__)
