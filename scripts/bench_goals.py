"""scripts/bench's goals table: each goal, what this run measured, met or NOT met.

A goal whose numbers this run did not measure (a part left out with --parts, huey left out with
--no-huey) says "not measured". "No worse than today" compares idle pickup and takeover with the
commit before slots measured beside this checkout in the same run (scripts/bench before, the
bench's --before), allowing BEFORE_SLACK for the noise of a hundred samples.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench_slots import HUEY_IO, IO_SHAPE, MODES, best_shape, fused_ceiling, io_key, value
from bench_store import pct

BEFORE_SLACK = 1.25
RSS_LIMIT = 120.0  # MB, one worker at 250 slots

Goal = tuple[str, str, bool | None]  # what, measured, met (None: not measured)


def noop_slots(results: dict[str, list[float]], widths: list[int]) -> Goal:
    top = max(widths)
    what = f"No-op, slots: >= 3x huey -w {top} and >= 1.5x the one-transaction raw ceiling"
    best, huey = best_shape(results), value(results, f"huey -w {top}")
    fused = fused_ceiling(results, widths)
    if best is None or huey is None or fused is None:
        return what, "-", None
    label, ours = best
    got = (f"{label}: {ours:,.0f} runs/s = {ours / huey:.2f}x huey, {ours / fused:.2f}x the "
           f"ceiling ({fused:,.0f}/s)")  # fmt: skip
    return what, got, ours >= 3 * huey and ours >= 1.5 * fused


def one_slot_each(results: dict[str, list[float]], widths: list[int]) -> Goal:
    top = max(widths)
    what = f"One slot per worker, -n {top}: >= 1.2x huey -w {top}"
    ours, huey = value(results, f"ours -n {top}"), value(results, f"huey -w {top}")
    if ours is None or huey is None:
        return what, "-", None
    return what, f"{ours:,.0f} vs {huey:,.0f} runs/s = {ours / huey:.2f}x", ours >= 1.2 * huey


def io_bound(results: dict[str, list[float]]) -> Goal:
    slots = IO_SHAPE[0] * IO_SHAPE[1]
    what = f"I/O-bound at {slots} slots: no slower than huey with {slots} thread workers"
    ours = {mode: value(results, io_key(mode)) for mode in MODES}
    huey = value(results, HUEY_IO)
    if huey is None or None in ours.values():
        return what, "-", None
    got = ", ".join(f"{mode} {s:.2f} s" for mode, s in ours.items()) + f" vs huey {huey:.2f} s"
    return what, got, all(s is not None and s <= huey for s in ours.values())


def worker_rss(rss: dict[str, dict[str, float]]) -> Goal:
    what = f"Worker RSS at {IO_SHAPE[1]} slots <= {RSS_LIMIT:.0f} MB"
    peaks = {mode: rss[mode]["worker"] for mode in MODES if "worker" in rss.get(mode, {})}
    if len(peaks) < len(MODES):
        return what, "-", None
    got = ", ".join(f"{mode} {mb:.1f} MB" for mode, mb in peaks.items())
    return what, got, max(peaks.values()) <= RSS_LIMIT


def idle_and_takeover(lat: Any) -> Goal:
    what = "Idle pickup and takeover: no worse than today"
    if lat is None or lat.before is None:
        return what, "-", None
    figures = []
    for name, key in (("pickup -n 8", "pickup"), ("takeover", "takeover")):
        before, now = lat.before[key]["before"], lat.before[key]["now"]
        ratios = (statistics.median(now) / statistics.median(before),
                  pct(now, 0.99) / pct(before, 0.99))  # fmt: skip
        figures.append((name, now, before, ratios))
    got = "; ".join(f"{name} p50/p99 {statistics.median(now):.1f}/{pct(now, 0.99):.1f} ms "
                    f"(before {statistics.median(before):.1f}/{pct(before, 0.99):.1f}: "
                    f"{r[0]:.2f}x/{r[1]:.2f}x)"
                    for name, now, before, r in figures)  # fmt: skip
    met = all(max(r) <= BEFORE_SLACK for *_, r in figures)
    return what, got + f" (same run, allowing {BEFORE_SLACK:g}x)", met


def print_goals(widths: list[int], results: dict[str, list[float]],
                rss: dict[str, dict[str, float]], lat: Any) -> None:  # fmt: skip
    goals = [noop_slots(results, widths), one_slot_each(results, widths), io_bound(results),
             worker_rss(rss), idle_and_takeover(lat)]  # fmt: skip
    print("\n| goal | measured | result |")
    print("| --- | --- | --- |")
    for what, got, met in goals:
        verdict = "not measured" if met is None else "met" if met else "**NOT met**"
        print(f"| {what} | {got} | {verdict} |")
