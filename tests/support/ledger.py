"""Reading the handlers' own ledger (tests/apps/ledger_app.py) and judging it.

Two rules, from the handlers' point of view and independent of the workers' bookkeeping:

- **No late start.** For every task, attempts start in attempt order: a handler of attempt k
  that starts after attempt k+1 (or later) of the same task started means one step ran on a
  lease another worker already held.
- **No doomed start.** A handler that a live worker abandons to ``LeaseLost`` within
  ``EARLY_LOSS`` of its start started on a lease that was already gone. A worker paused or
  killed between the two is not live: its loss is the pause's doing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EARLY_LOSS = 0.1


@dataclass(frozen=True)
class Entry:
    ev: str
    t: float
    pid: int
    task: int
    attempt: int
    run: int


@dataclass(frozen=True)
class Pause:
    pid: int
    start: float
    end: float  # when it was resumed (or +inf if never)


def read(path: Path) -> list[Entry]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        entries.append(Entry(doc["ev"], doc["t"], doc["pid"], doc["task"], doc["attempt"],
                             doc["run"]))  # fmt: skip
    return entries


def pauses(reports: Iterable[dict[str, Any]]) -> list[Pause]:
    """Every SIGSTOP window in the chaos reports (one event per lease held: deduplicated)."""
    seen = set()
    for report in reports:
        for e in report["events"]:
            if e["fault"] == "pause":
                end = e.get("woke_at") or float("inf")
                seen.add(Pause(e["pid"], e["t"], end))
    return sorted(seen, key=lambda p: p.start)


def late_starts(entries: Sequence[Entry]) -> list[str]:
    starts: dict[int, dict[int, Entry]] = {}
    for e in entries:
        if e.ev == "start":
            starts.setdefault(e.task, {})[e.attempt] = e
    found = []
    for task, by_attempt in starts.items():
        for k, entry in by_attempt.items():
            for later, other in by_attempt.items():
                if later > k and other.t < entry.t:
                    found.append(
                        f"task {task}: attempt {k} (pid {entry.pid}) started "
                        f"{entry.t - other.t:.3f} s after attempt {later} (pid {other.pid})"
                    )
    return found


def doomed_starts(entries: Sequence[Entry], paused: Sequence[Pause]) -> list[str]:
    started = {(e.task, e.attempt): e for e in entries if e.ev == "start"}
    found = []
    for e in entries:
        if e.ev != "lost":
            continue
        start = started.get((e.task, e.attempt))
        if start is None or e.t - start.t >= EARLY_LOSS:
            continue
        if any(p.pid == e.pid and p.start <= e.t and p.end >= start.t for p in paused):
            continue  # frozen in between: not a live worker
        found.append(
            f"task {e.task} attempt {e.attempt} (pid {e.pid}): LeaseLost "
            f"{(e.t - start.t) * 1000:.0f} ms after its start"
        )
    return found
