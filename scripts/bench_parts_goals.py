"""The goals table of ``scripts/bench --parts``: every speed goal, its figure in this run, this
checkout against ``--before``, and met / MISSED ("not measured" when its part was left out or
its peer is not installed)."""

from __future__ import annotations

import statistics
from typing import Any

Figures = dict[str, list[float]]  # "now -n 2" -> each round's value
Row = tuple[str, str, str, str, str]  # item, goal, measured (now), before, verdict


def med(figures: Figures, key: str) -> float | None:
    values = figures.get(key)
    return statistics.median(values) if values else None


def verdict(value: float | None, ok: bool | None) -> str:
    if value is None or ok is None:
        return "not measured"
    return "met" if ok else "**MISSED**"


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def at_most(item: str, goal: str, figures: Figures, key: str, limit: float,
            pattern: str) -> Row:  # fmt: skip
    now, before = med(figures, f"now {key}"), med(figures, f"before {key}")
    return (item, goal, fmt(now, pattern), fmt(before, pattern),
            verdict(now, None if now is None else now <= limit))  # fmt: skip


def at_least(item: str, goal: str, figures: Figures, key: str, limit: float,
             pattern: str) -> Row:  # fmt: skip
    now, before = med(figures, f"now {key}"), med(figures, f"before {key}")
    return (item, goal, fmt(now, pattern), fmt(before, pattern),
            verdict(now, None if now is None else now >= limit))  # fmt: skip


def cli_rows(figures: Figures) -> list[Row]:
    def worst(tree: str) -> tuple[str, float] | None:
        got = [(c, med(figures, f"{tree} cli {c}")) for c in COMMANDS]
        known = [(c, v) for c, v in got if v is not None]
        return max(known, key=lambda cv: cv[1]) if known else None

    now, before = worst("now"), worst("before")
    show = lambda w: "-" if w is None else f"{w[1]:.0f} ms ({w[0]}, the slowest p50)"  # noqa: E731
    python = med(figures, "python -c pass")
    note = "" if python is None else f"; python -c pass {python:.0f} ms"
    return [
        (
            "1",
            "CLI: each one-run command <= 150 ms",
            show(now) + note,
            show(before),
            verdict(None if now is None else now[1], None if now is None else now[1] <= 150),
        )
    ]


COMMANDS = ("--version", "--help", "enqueue", "show", "signal", "cancel", "retry")


def ratio_row(item: str, goal: str, num: float | None, den: float | None, limit: float,
              extra: str = "", before: str = "-", most: bool = False) -> Row:  # fmt: skip
    if num is None or den is None:
        return item, goal, "-", before, "not measured"
    r = num / den
    ok = r <= limit if most else r >= limit
    shown = f"{r:.0%}" if limit < 1 else f"{r:.2f}x"  # a share as a share, a ratio as a ratio
    return item, goal, f"{shown}{extra}", before, verdict(r, ok)


def sqlite_rows(figures: Figures) -> list[Row]:
    rows = [at_least("2", "SQLite: >= 13,000 no-op runs/s at -n 2 --concurrency 16", figures,
                     "-n 2 -c 16", 13_000, "{:,.0f} /s")]  # fmt: skip
    bare = med(figures, "bare batched loop")
    slots_now, slots_before = med(figures, "now -n 2 -c 16"), med(figures, "before -n 2 -c 16")
    rows.append(ratio_row("2", ">= 30 % of the bare batched loop (K = 8, two processes, FULL), "
                          "same run", slots_now, bare, 0.30, "" if bare is None else
                          f" of {bare:,.0f} /s", "-" if bare is None or slots_before is None
                          else f"{slots_before / bare:.0%}"))  # fmt: skip
    cpu_now, cpu_before = (
        med(figures, "now -n 2 -c 16 cpu us"),
        med(figures, "before -n 2 -c 16 cpu us"),
    )
    rows.append(
        (
            "2",
            "(the pool's CPU per run at -n 2 --concurrency 16: supervisor and workers, "
            "user + system)",
            fmt(cpu_now, "{:.0f} us"),
            fmt(cpu_before, "{:.0f} us"),
            "-",
        )
    )
    rows.append(at_least("2", "SQLite: >= 10,000 no-op runs/s at -n 2", figures, "-n 2", 10_000,
                         "{:,.0f} /s"))  # fmt: skip
    huey = med(figures, "huey -w 8")
    n8_before = med(figures, "before -n 8")
    n8_now = med(figures, "now -n 8")
    row = ratio_row("2", ">= 2x huey -w 8 at -n 8, from launch", n8_now, huey, 2.0,
                    "" if huey is None else f" ({n8_now:,.0f} of {huey:,.0f} /s)",
                    fmt(n8_before, "{:,.0f} /s"))  # fmt: skip
    if huey is None and n8_now is not None:  # our figure, without huey's beside it
        row = (row[0], row[1], f"{n8_now:,.0f} /s (huey not measured)", row[3], row[4])
    rows.append(row)
    io_now, io_before, io_huey = (med(figures, k) for k in ("now io", "before io", "huey io"))
    row = ratio_row("2", "I/O row (-n 2 --concurrency 250) <= 1.1x huey's 500 threads", io_now,
                    io_huey, 1.1, "", fmt(io_before, "{:.2f} s"), most=True)  # fmt: skip
    if io_huey is None and io_now is not None:  # our figure, without huey's beside it
        row = (row[0], row[1], f"{io_now:.2f} s (huey not measured)", row[3], row[4])
    rows.append(row)
    rows.append(("2", "per-run CPU broken down (worker Python, SQLite, supervisor), with a "
                 "profile", "docs/explanation/performance.md", "-", "see the page"))  # fmt: skip
    return rows


def limit_rows(figures: Figures, args: Any) -> list[Row]:
    rows: list[Row] = []
    for backend in ("sqlite", "postgres"):
        cost: dict[str, float | None] = {}
        for tree in ("now", "before"):
            plain = med(figures, f"{tree} {backend} plain")
            gated = med(figures, f"{tree} {backend} limited")
            cost[tree] = None if plain is None or gated is None else 1 - gated / plain
        c, b = cost["now"], cost["before"]
        rows.append(("3", f"{backend}: a limit that never binds costs <= 10 % (-n 2, "
                     f"{args.limits_tasks:,} runs, medians of {args.limits_rounds} rounds)",
                     fmt(c, "{:.0%}"), fmt(b, "{:.0%}"),
                     verdict(c, None if c is None else c <= 0.10)))  # fmt: skip
    for backend in ("sqlite", "postgres"):
        cost = {}
        for tree in ("now", "before"):
            plain = med(figures, f"{tree} {backend} claim plain_p50_ms")
            gated = med(figures, f"{tree} {backend} claim gated_p50_ms")
            cost[tree] = None if plain is None or gated is None else gated / plain - 1
        c, b = cost["now"], cost["before"]
        rows.append(("3", f"{backend}: a binding per-key cap, {args.keys:,} keys, costs <= 25 % "
                     "(a batched claim of 16, p50, against the same claim without limits)",
                     fmt(c, "{:+.0%}"), fmt(b, "{:+.0%}"),
                     verdict(c, None if c is None else c <= 0.25)))  # fmt: skip
    return rows


def pg_rows(figures: Figures) -> list[Row]:
    rows = [at_least("4", "PostgreSQL: >= 7,000 tasks/s at 4 worker processes (-n 4 "
                     "--concurrency 8, server included)", figures, "pg rate", 7_000,
                     "{:,.0f} /s"),
            at_most("4", "PostgreSQL: <= 70 us of server CPU per run", figures, "pg server us",
                    70, "{:.0f} us")]  # fmt: skip
    peer = med(figures, "procrastinate -w 4")
    if peer is not None:
        rows.append(("4", "(procrastinate -w 4, beside)", f"{peer:,.0f} /s", "-", "-"))
    for backend in ("sqlite", "postgres"):
        rows.append(at_least("4", f"{backend}: webhook delivery >= 3,000 events/s per receiver "
                             "(a webhook catching up over done runs)", figures,
                             f"{backend} hooks catch_up_per_s", 3_000, "{:,.0f} /s"))  # fmt: skip
        rows.append(at_least("4", f"... {backend}: while the runs drain (backlog)", figures,
                             f"{backend} hooks deliveries_per_s", 3_000, "{:,.0f} /s"))  # fmt: skip
    return rows


def later_rows() -> list[Row]:
    missing = "not in these parts"
    return [
        ("5", "an idle worker uses <= 0.3 % of a core", "scripts/bench idle", "-", missing),
        ("5", "producer p99 <= 30 ms under a draining -n 8 pool", "scripts/bench store", "-",
         missing),
        ("6", "worker RSS <= 25 MB at one slot, supervisor <= 30 MB (-n 8)",
         "scripts/bench idle", "-", missing),
    ]  # fmt: skip


def startup_rows(figures: Figures) -> list[Row]:
    return [at_most("1", "supervisor start -n 2 --drain on one run exits <= 250 ms", figures,
                    "start --drain", 250, "{:.0f} ms"),
            at_most("1", "a pool's first claim <= 150 ms after its start", figures,
                    "first claim", 150, "{:.0f} ms")]  # fmt: skip


def print_goals(figures: Figures, parts: list[str], args: Any) -> None:
    rows = (cli_rows(figures) + startup_rows(figures) + sqlite_rows(figures)
            + limit_rows(figures, args) + pg_rows(figures) + later_rows())  # fmt: skip
    print("| # | goal (issue: speed) | measured, this checkout | before | result |")
    print("| --- | --- | ---: | ---: | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\n| side | median | rounds |\n| --- | ---: | --- |")
    for key, values in figures.items():
        shown = ", ".join(f"{v:,.1f}" for v in values)
        print(f"| {key} | {statistics.median(values):,.1f} | {shown} |")
