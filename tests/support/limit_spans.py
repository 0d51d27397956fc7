"""The limits soak's ledger: its entries, each started attempt's live span, and the most spans
live at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workerproc.store import open_store


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def live_spans(db: str, log: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    """Each started attempt, from its start until its lease ended."""
    with open_store(db) as store:
        ended: dict[tuple[int, int], float] = {}
        done: dict[int, tuple[int, float]] = {}
        for run in {e["run"] for e in log}:
            for t in store.get_tasks(run):
                if t.done_attempt is not None and t.done_at is not None:
                    done[t.id] = (t.done_attempt, t.done_at)
            for a in store.attempt_history(run):
                if a.ended_at is not None:
                    ended[(a.task_id, a.attempt)] = a.ended_at
    ends = {(e["task"], e["attempt"]): e["t"] for e in log if e["ev"] in ("end", "retry")}
    spans = []
    for e in log:
        if e["ev"] != "start":
            continue
        key = (e["task"], e["attempt"])
        until = ends.get(key, float("inf"))
        if key in ended:
            until = min(until, ended[key])
        elif done.get(e["task"], (0, 0.0))[0] == e["attempt"]:
            until = min(until, done[e["task"]][1])
        spans.append((e["t"], until, e))
    return spans


def most_at_once(spans: list[tuple[float, float, dict[str, Any]]]) -> int:
    edges = sorted([(s, 1) for s, _, _ in spans] + [(u, -1) for _, u, _ in spans])
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best
