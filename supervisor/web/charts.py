"""Small server-rendered charts: the geometry of each SVG, computed here, drawn by templates
(``templates/charts.html``). No JavaScript draws anything."""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workerproc.store import FinishedBucket

from ..operations.render import short
from .timeline import TaskTimeline

WIDTH = 720
# takeover latency buckets (ms), the same edges the verifier's text histogram uses
LATENCY_EDGES = (1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)
FAULT_CLASS = {
    "taken_over": "ok", "finished_before": "muted", "superseded_before": "muted",
    "committed_in_flight": "muted", "resumed_early": "muted", "run_over": "muted",
    "no_lease": "muted", "not_taken_over": "warn", "lost": "bad", "committed_after_fault": "bad",
}  # fmt: skip


@dataclass(frozen=True)
class Mark:
    """One rectangle (or, with ``w == 0``, a tick) and its tooltip."""

    x: float
    y: float
    w: float
    h: float
    css: str
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    marks: list[Mark]
    labels: Sequence[tuple[float, float, str]]  # x, y, text
    caption: str = ""


def _clock(ts: float) -> str:
    return time.strftime("%H:%M", time.localtime(ts))


def throughput(buckets: Sequence[FinishedBucket], since: float, minutes: int = 60) -> Chart:
    """Runs finished per minute (succeeded below, failed stacked above) from ``since`` on."""
    height, top = 120, 14
    per = {round((b.start - since) / 60): b for b in buckets}
    totals = [(per[i].succeeded, per[i].failed) if i in per else (0, 0) for i in range(minutes)]
    peak = max((ok + bad for ok, bad in totals), default=0) or 1
    step = WIDTH / minutes
    marks = []
    for i, (ok, bad) in enumerate(totals):
        x = i * step
        at = _clock(since + i * 60)
        h_ok = ok / peak * (height - top)
        h_bad = bad / peak * (height - top)
        if ok:
            marks.append(Mark(x, height - h_ok, step - 1, h_ok, "ok", f"{at}: {ok} succeeded"))
        if bad:
            y = height - h_ok - h_bad
            marks.append(Mark(x, y, step - 1, h_bad, "bad", f"{at}: {bad} failed"))
    done = sum(ok for ok, _ in totals)
    failed = sum(bad for _, bad in totals)
    labels = [(0, 10, f"peak {peak}/min"), (0, height + 14, _clock(since)),
              (WIDTH - 30, height + 14, "now")]  # fmt: skip
    caption = f"last hour: {done} succeeded ({done / 60:.1f}/min), {failed} failed"
    return Chart(WIDTH, height + 18, marks, labels, caption)


def faults(events: Sequence[dict[str, Any]]) -> Chart:
    """Each fault at its time, one lane per kind; a takeover draws its latency as a bar."""
    lanes = {"kill": 22.0, "pause": 58.0}
    times = [float(e["t"]) for e in events if isinstance(e.get("t"), (int, float))]
    if not times:
        return Chart(WIDTH, 90, [], [(0, 40, "no faults")])
    t0, t1 = min(times), max(times)
    span = max(t1 - t0, 1.0)
    left, usable = 50.0, WIDTH - 60.0
    marks = []
    for e in events:
        if not isinstance(e.get("t"), (int, float)):
            continue
        x = left + (float(e["t"]) - t0) / span * usable
        y = lanes.get(str(e.get("fault")), 90.0)
        outcome = str(e.get("outcome", "?"))
        latency = e.get("taken_over_ms")
        title = (f"{e.get('fault')} pid {e.get('pid')} at +{float(e['t']) - t0:.2f}s "
                 f"({e.get('phase')}): {outcome}")  # fmt: skip
        if isinstance(latency, (int, float)):
            title += f" after {latency:g} ms"
            w = max(2.0, latency / 1000 / span * usable)
            marks.append(Mark(x, y - 3, w, 6, "span", title))
        marks.append(Mark(x - 4, y - 8, 8, 16, FAULT_CLASS.get(outcome, "warn"), title))
    labels = [(0, lanes["kill"] + 4, "kill"), (0, lanes["pause"] + 4, "pause"),
              (left, 88, "+0 s"), (WIDTH - 60, 88, f"+{span:.1f} s")]  # fmt: skip
    struck = len({(e.get("fault"), e.get("pid"), e.get("t")) for e in events})  # per process
    return Chart(WIDTH, 92, marks, labels, f"{struck} faults over {span:.1f} s")


def histogram(latencies_ms: Sequence[float]) -> Chart:
    """Takeover latencies on log-like buckets, every bucket drawn (empty ones too)."""
    counts = [0] * (len(LATENCY_EDGES) + 1)
    for value in latencies_ms:
        counts[bisect.bisect_left(LATENCY_EDGES, value)] += 1
    height, top = 110, 14
    peak = max(counts) or 1
    step = WIDTH / len(counts)
    marks, labels = [], []
    lower = 0.0
    for i, n in enumerate(counts):
        edge = LATENCY_EDGES[i] if i < len(LATENCY_EDGES) else None
        name = f"≤{edge:g}" if edge is not None else f">{lower:g}"
        h = n / peak * (height - top)
        if n:
            marks.append(Mark(i * step + 4, height - h, step - 8, h, "ok", f"{name} ms: {n}"))
            labels.append((i * step + step / 2 - 4, height - h - 3, str(n)))
        labels.append((i * step + 4, height + 14, name))
        lower = edge or lower
    return Chart(WIDTH, height + 18, marks, labels, f"{len(latencies_ms)} takeovers (ms)")


def run_timeline(timelines: Sequence[TaskTimeline], start: float, end: float) -> Chart:
    """One row per attempt: a bar from its claim to its end, refused writes as red ticks."""
    left, usable, row = 130.0, WIDTH - 140.0, 18.0
    span = max(end - start, 0.001)

    def x(ts: float) -> float:
        return left + min(max((ts - start) / span, 0.0), 1.0) * usable

    marks: list[Mark] = []
    labels: list[tuple[float, float, str]] = []
    y = 4.0
    for tl in timelines:
        for a in tl.attempts:
            labels.append((0, y + 12, f"{short(tl.task.name, 12)} ({tl.task.id}) #{a.number}"))
            if a.claimed_at is not None:
                stop = a.ended_at if a.ended_at is not None else end
                x0 = x(a.claimed_at)
                title = f"{tl.task.name} attempt {a.number}: {a.owner or '?'}: {a.label}"
                marks.append(Mark(x0, y + 2, max(2.0, x(stop) - x0), row - 6, a.outcome, title))
            for r in a.refused:
                why = f"refused {r.op} from {r.owner} (attempt {r.attempt})"
                marks.append(Mark(x(r.at), y, 0, row - 2, "refused", why))
            y += row
    labels.append((left, y + 12, "+0 s"))
    labels.append((WIDTH - 60, y + 12, f"+{span:.2f} s"))
    return Chart(WIDTH, int(y + 18), marks, labels)
