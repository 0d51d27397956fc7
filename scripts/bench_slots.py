"""scripts/bench's slot rows: what the sides of a round are, and their tables.

- No-op runs/s with slots (`-n 2 --concurrency 16`, `-n 8 --concurrency 4`) join the round of
  the widest `-n W` (huey `-w W` is their reference); the raw batched ceiling (a bare loop that
  completes the previous k tasks and claims k new ones per write transaction) joins every
  width's round. Each ceiling is the best of its widths.
- I/O-bound: RUNS runs of a SECONDS call, a plain handler (`time.sleep`, on threads) and an async
  one (`asyncio.sleep`, on the event loop), at `-n 2 --concurrency 250`, beside huey with thread
  workers at the same total concurrency (`huey_consumer -k thread -w 500`); seconds from start
  until the last run finished (ideal: RUNS x SECONDS / 500). The workers' RSS is sampled with
  psutil while the I/O runs go: the peak of one worker is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench_procs import drain, huey_drain, huey_enqueue, huey_env
from bench_raw import raw
from bench_store import bulk_runs, new_db

from workerproc.store import open_store

SHAPES = ((2, 16), (8, 4))  # no-op: -n N --concurrency C
BATCH = 8  # the raw batched ceiling: tasks completed and claimed per write transaction
IO_SHAPE = (2, 250)  # I/O-bound: -n 2 --concurrency 250
MODES = ("sync", "async")  # benchapp's io_sync and io_async

Side = tuple[str, Callable[[], float]]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--io-runs", type=int, default=1000, help="I/O-bound runs per side")
    ap.add_argument("--io-seconds", type=float, default=0.5, help="each I/O-bound call's length")


def shape_key(n: int, c: int) -> str:
    return f"ours -n {n} -c {c}"


def batched_key(w: int) -> str:
    return f"raw batched {w}"


def io_key(mode: str) -> str:
    return f"ours io {mode}"


HUEY_IO = "huey io thread"


# -- no-op runs/s with slots ---------------------------------------------------------------------
def ours_slots(tmp: str, m: int, n: int, c: int) -> float:
    db = new_db(tmp, f"slots-{n}x{c}-{time.monotonic_ns()}")
    bulk_runs(db, m, time.time() - 1)
    return m / drain(db, m, f"sqlite:///{db}", ["-n", str(n), "--concurrency", str(c)])


def noop_sides(tmp: str, m: int, w: int, shapes: bool) -> list[Side]:
    """The raw batched ceiling with ``w`` processes; with ``shapes``, ours with slots at each
    shape first."""
    sides: list[Side] = []
    if shapes:
        sides += [(shape_key(n, c), lambda n=n, c=c: ours_slots(tmp, m, n, c)) for n, c in SHAPES]
    sides.append((batched_key(w), lambda: raw(tmp, m, w, k=BATCH)))
    return sides


# -- I/O-bound -----------------------------------------------------------------------------------
def ours_io(tmp: str, runs: int, seconds: float, mode: str, rss: dict[str, float]) -> float:
    db = new_db(tmp, f"io-{mode}-{time.monotonic_ns()}")
    store = open_store(db)
    store.start_runs([{"task": f"io_{mode}", "payload": seconds}] * runs)
    store.close()
    n, c = IO_SHAPE
    return drain(db, runs, f"sqlite:///{db}", ["-n", str(n), "--concurrency", str(c)], rss)


def huey_io(tmp: str, runs: int, seconds: float) -> float:
    env, inbox = huey_env(tmp, "io")
    huey_enqueue(env, "io", runs, seconds)
    return huey_drain(env, inbox, runs, IO_SHAPE[0] * IO_SHAPE[1], "thread")


def io_sides(tmp: str, args: Any, rss: dict[str, dict[str, float]], huey: bool) -> list[Side]:
    """One round of the I/O-bound sides; ``rss[mode]`` collects each mode's peaks."""
    sides: list[Side] = [
        (io_key(mode), lambda mode=mode: ours_io(
            tmp, args.io_runs, args.io_seconds, mode, rss.setdefault(mode, {})))
        for mode in MODES
    ]  # fmt: skip
    if huey:
        sides.append((HUEY_IO, lambda: huey_io(tmp, args.io_runs, args.io_seconds)))
    return sides


# -- the tables ----------------------------------------------------------------------------------
def value(results: dict[str, list[float]], key: str) -> float | None:
    """The median of ``key``'s rounds, or None when it was not measured."""
    return statistics.median(results[key]) if results.get(key) else None


def ratio(a: float | None, b: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if a is None or b is None else fmt.format(a / b)


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def fused_ceiling(results: dict[str, list[float]], widths: list[int]) -> float | None:
    """The one-transaction raw ceiling: the best raw fused loop of any width."""
    values = [v for w in widths if (v := value(results, f"raw fused {w}")) is not None]
    return max(values) if values else None


def batched_ceiling(results: dict[str, list[float]], widths: list[int]) -> float | None:
    """The raw batched ceiling: the best batched loop of any width."""
    values = [v for w in widths if (v := value(results, batched_key(w))) is not None]
    return max(values) if values else None


def best_shape(results: dict[str, list[float]]) -> tuple[str, float] | None:
    measured = [(f"-n {n} --concurrency {c}", value(results, shape_key(n, c))) for n, c in SHAPES]
    found = [(label, v) for label, v in measured if v is not None]
    return max(found, key=lambda x: x[1]) if found else None


def print_tables(args: Any, widths: list[int], results: dict[str, list[float]],
                 rss: dict[str, dict[str, float]]) -> None:  # fmt: skip
    top = max(widths)
    huey = value(results, f"huey -w {top}")
    fused, batched = fused_ceiling(results, widths), batched_ceiling(results, widths)
    print(f"\n| no-op runs/s, FULL | ours | huey -w {top} | raw fused ceiling, best W "
          f"| raw batched ceiling (k={BATCH}), best W | ours / huey | ours / fused "
          "| ours / batched |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [(f"-n {top}, one slot each", f"ours -n {top}")]
    rows += [(f"-n {n} --concurrency {c}", shape_key(n, c)) for n, c in SHAPES]
    for label, key in rows:
        o = value(results, key)
        ratios = f"{ratio(o, huey)} | {ratio(o, fused)} | {ratio(o, batched, '{:.0%}')}"
        print(f"| {label} | {rate(o)} | {rate(huey)} | {rate(fused)} | {rate(batched)} "
              f"| {ratios} |")  # fmt: skip
    n, c = IO_SHAPE
    ideal = args.io_runs * args.io_seconds / (n * c)
    h = value(results, HUEY_IO)
    print(f"\n| I/O-bound: {args.io_runs:,} runs x {args.io_seconds:g} s (seconds; ideal "
          f"{ideal:.2f}) | ours -n {n} --concurrency {c} | huey -k thread -w {n * c} "
          "| ours / huey | peak RSS of one worker (MB) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode, call in zip(MODES, ("time.sleep", "asyncio.sleep"), strict=True):
        o = value(results, io_key(mode))
        worker = rss.get(mode, {}).get("worker")
        shown = "-" if worker is None else f"{worker:.1f}"
        print(f"| {mode} handler ({call}) | {secs(o)} | {secs(h)} | {ratio(o, h)} | {shown} |")
