"""leasekeeper vs huey on the same machine, in one run, interleaved (see scripts/bench).

Throughput: M no-op runs drained by `supervisor start -n W --drain` vs M no-op huey tasks with
`huey_consumer -k process -w W`, both at synchronous FULL (plus a NORMAL row for ours), timed from
process start until the last one is done (ours: the last run's finished_at in the database;
huey: the last of one datagram per task), beside the raw fused one-transaction loop (complete
the previous task + claim the next in one transaction) as the ceiling. Medians of --rounds
rounds; the order alternates per round. Then idle pickup, takeover after SIGKILL, write-lock
wait, and peak RSS.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

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


def ours_pickup(tmp: str, samples: int) -> list[float]:
    db = new_db(tmp, "pickup")
    cmd = [PY, "-m", "supervisor", "start", "-n", "8", "--db", db, "--app", "benchapp:app"]
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


# -- the table ---------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,8")
    ap.add_argument("--samples", type=int, default=30, help="idle pickup samples")
    ap.add_argument("--idle", type=float, default=60.0, help="huey's idle time before pickup")
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (not for figures)")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.rounds, args.samples, args.idle = 1500, 1, 5, 3.0
    widths = [int(w) for w in args.workers.split(",")]
    tmp = tempfile.mkdtemp(prefix="lk-bench-")
    results: dict[str, list[float]] = {}
    rss: dict[str, float] = {}
    started = time.monotonic()

    def run(key: str, fn: Callable[[], float]) -> None:
        value = fn()
        results.setdefault(key, []).append(value)
        print(f"  round {r + 1}: {key:<22} {value:8.0f} /s", file=sys.stderr, flush=True)

    for r in range(args.rounds):
        for w in widths:
            sides = round_sides(tmp, args.tasks, w, rss if w == max(widths) else None)
            if w != max(widths):
                sides = sides[:3]
            for key, fn in sides if r % 2 == 0 else reversed(sides):
                run(key, fn)

    print("  idle pickup, takeover, lock wait ...", file=sys.stderr, flush=True)
    henv, hinbox = huey_env(tmp, "idle")
    ours_lat = ours_pickup(tmp, args.samples)
    huey_lat = huey_pickup(henv, hinbox, args.samples, args.idle)
    fast = takeover(True, 3 if args.quick else 10)
    slow = takeover(False, 2 if args.quick else 3)
    kenv, kinbox = huey_env(tmp, "kill")
    lost, trials = huey_kill(kenv, kinbox)
    lock_path = new_db(tmp, "lock")
    bulk_runs(lock_path, 200_000 if not args.quick else 20_000, time.time() - 60)
    lock = hammer(f"sqlite:///{lock_path}", 8, 3.0 if args.quick else 8.0, lock_probe=True)
    waits = [x for res in lock for x in res[3]]
    worst = max(pct(res[3], 0.99) for res in lock)

    print_table(args, widths, results, rss, ours_lat, huey_lat, fast, slow, (lost, trials),
                waits, worst, time.monotonic() - started)  # fmt: skip
    return 0


def print_table(args: Any, widths: list[int], results: dict[str, list[float]],
                rss: dict[str, float], ours_lat: list[float], huey_lat: list[float],
                fast: list[float], slow: list[float], huey_lost: tuple[int, int],
                waits: list[float], worst: float, elapsed: float) -> None:  # fmt: skip
    cpu = platform.processor() or platform.machine()
    print(f"\nmachine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, huey {huey_version()}; {args.tasks:,} no-op tasks, "
          f"median of {args.rounds} rounds; {elapsed:.0f} s in all\n")  # fmt: skip
    print("| throughput (tasks/s) | W | ours | huey | raw fused ceiling | ours / huey "
          "| ours / ceiling |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in widths:
        o, h, c = (median(results[f"{k} {w}"]) for k in ("ours -n", "huey -w", "raw fused"))
        print(f"| FULL | {w} | {o:,.0f} | {h:,.0f} | {c:,.0f} | {o / h:.2f}x | {o / c:.0%} |")
    top = max(widths)
    if f"ours -n {top} NORMAL" in results:
        o = median(results[f"ours -n {top} NORMAL"])
        h, c = median(results[f"huey -w {top}"]), median(results[f"raw fused {top}"])
        print(f"| ours NORMAL vs FULL | {top} | {o:,.0f} | {h:,.0f} | {c:,.0f} | {o / h:.2f}x "
              f"| {o / c:.0%} |")  # fmt: skip
    print("\n| measure | ours | huey | goal |")
    print("| --- | --- | --- | --- |")
    print(f"| idle pickup p50 / p99 (ms), {args.samples} samples | "
          f"{median(ours_lat):.1f} / {pct(ours_lat, 0.99):.1f} | "
          f"{median(huey_lat):.0f} / {pct(huey_lat, 0.99):.0f} (idle {args.idle:g} s first) "
          "| p50 <= 20, p99 <= 100 |")  # fmt: skip
    print(f"| takeover after SIGKILL, fast release p50 / p99 (ms) | {median(fast):.1f} / "
          f"{pct(fast, 0.99):.1f} | task lost in {huey_lost[0]} of {huey_lost[1]} kills "
          "| p99 <= 200 |")  # fmt: skip
    print(f"| takeover after SIGKILL, ttl path (ttl 2 s) p50 (ms) | {median(slow):.0f} | "
          "- | ~ ttl |")  # fmt: skip
    print(f"| write-lock wait, 8 busy processes: p99 all / worst process (ms) | "
          f"{pct(waits, 0.99) * 1000:.1f} / {worst * 1000:.1f} | - | p99 <= 50 |")  # fmt: skip
    print(f"| peak RSS, supervisor / one worker (MB), -n 8 | {rss.get('supervisor', 0):.1f} / "
          f"{rss.get('worker', 0):.1f} | - | <= 30 / <= 25 |")  # fmt: skip


def huey_version() -> str:
    import huey as h  # noqa: PLC0415 - the bench extra

    return str(h.__version__)


if __name__ == "__main__":
    sys.exit(main())
