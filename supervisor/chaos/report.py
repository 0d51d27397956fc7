"""Chaos mode's report: the one-line summary, the JSON file and the text printed at exit: the
verdict (violations: safety) apart from the warnings (slow takeovers: load)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from workerproc.store.calls import CallTotals

from ..files import PUBLIC, write_atomic
from ..logs import event


def summary_line(r: dict[str, Any]) -> str:
    return (
        f"chaos: {sum(r['faults'].values())} faults ({r['faults']['kill']} kill, "
        f"{r['faults']['pause']} pause) on {r['leases_hit']} leases, {r['spared']} spared, "
        f"{r['taken_over']}/"
        f"{r['orphaned_leases']} orphaned leases taken over (p50 {r['takeover_ms']['p50']} ms, "
        f"p99 {r['takeover_ms']['p99']} ms), {r['zombie_writes_rejected']} zombie writes "
        f"rejected, {len(r['warnings'])} warnings, {len(r['violations'])} violations"
    )


def paid_calls(totals: CallTotals) -> dict[str, int]:
    """Every paid call accounted for: calls started (an intent each), kept,
    reused instead of paid again (their tokens saved), paid again (an intent after an earlier
    one of the same call: an upper bound of real second payments), unknown (an intent whose
    attempt ended without an answer), and answers paid and thrown away (the losers of races)."""
    return {"started": totals.started, "kept": totals.kept, "reused": totals.reused,
            "paid_again": totals.paid_again, "unknown": totals.unknown,
            "tokens_saved": totals.saved_tokens, "paid_unused": totals.unused,
            "paid_unused_tokens": totals.unused_tokens}  # fmt: skip


def counts_line(c: dict[str, int]) -> str:
    """The five counts of every paid call, in one line (the chaos report, ``scripts/demo``)."""
    return (
        f"{c['started']} started, {c['kept']} kept, {c['reused']} reused, "
        f"{c['paid_again']} paid again, {c['unknown']} unknown"
    )


def calls_line(c: dict[str, int]) -> str:
    return (
        f"paid calls (ctx.once): {counts_line(c)} ({c['tokens_saved']:,} tokens saved by "
        f"reuse); {c['paid_unused']} paid unused ({c['paid_unused_tokens']:,} tokens spent "
        "twice)"
    )


def write(path: str, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` atomically with an explicit mode, never through a symlink
    (``files.write_atomic``). A failure is logged, never raised: the text report on stderr
    still says everything."""
    try:
        write_atomic(path, json.dumps(report, indent=2), PUBLIC)
    except OSError as exc:
        event(
            "chaos_report_failed",
            f"chaos: cannot write the report to {path}: {exc.strerror or exc}",
            level=logging.ERROR,
        )


def print_text(report: dict[str, Any], takeover_ms: list[float], path: str | None) -> None:
    lines = ["", "chaos report" + (f" ({path})" if path else "")]
    lines.append("  " + summary_line(report).removeprefix("chaos: "))
    if report.get("paid_calls") and (report["paid_calls"]["started"]
                                     or report["paid_calls"]["kept"]):  # fmt: skip
        lines.append("  " + calls_line(report["paid_calls"]))
    lines.append("  takeover latency:")
    lines += histogram(takeover_ms)
    lines += listed("warnings (slow takeovers: load, not a verdict)", report["warnings"])
    lines += listed("violations", report["violations"])
    lines.append("  verdict: " + ("OK" if report["ok"] else "VIOLATIONS"))
    print("\n".join(lines), file=sys.stderr, flush=True)


def listed(title: str, items: list[str], most: int = 10) -> list[str]:
    """``items`` under ``title``, at most ``most`` of them (the report file has them all)."""
    if not items:
        return []
    lines = [f"  {title}:"] + [f"    {item}" for item in items[:most]]
    if len(items) > most:
        lines.append(f"    ... and {len(items) - most} more")
    return lines


def histogram(values: list[float], width: int = 40) -> list[str]:
    """A small text histogram of latencies (ms) on log-ish buckets."""
    if not values:
        return ["  (no takeovers)"]
    edges = [1, 5, 10, 50, 100, 500, 1000, 2000, 5000, 10000, float("inf")]
    counts = [0] * len(edges)
    for v in values:
        counts[next(i for i, e in enumerate(edges) if v <= e)] += 1
    top = max(counts)
    lines = []
    lower = 0.0
    for edge, n in zip(edges, counts, strict=True):
        if n:
            label = f"{lower:g}-{edge:g} ms" if edge != float("inf") else f">{lower:g} ms"
            lines.append(f"  {label:>14} | {'#' * max(1, round(n / top * width))} {n}")
        lower = edge
    return lines
