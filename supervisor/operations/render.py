"""Plain tables for people, JSON for scripts."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from typing import Any


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 worker``, ``2 workers`` (``nouns``: an irregular plural)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


# How a run's status reads after "run N": "run 1 succeeded", never "run 1 is succeeded".
_STATUS_PHRASES = {"pending": "is pending", "running": "is running", "succeeded": "succeeded",
                   "failed": "failed", "cancelled": "was cancelled"}  # fmt: skip


def run_status(run_id: int, status: str) -> str:
    """``run 3 succeeded``, ``run 3 is running``, ``run 3 was cancelled``."""
    return f"run {run_id} {_STATUS_PHRASES.get(status, f'is {status}')}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, (dict, list)):
        return short(json.dumps(value, separators=(",", ":")))
    return short(str(value))


def short(text: str, limit: int = 60) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def relative(ts: float | None, now: float) -> str | None:
    if ts is None:
        return None
    delta = ts - now
    return f"in {delta:.1f}s" if delta >= 0 else f"{-delta:.1f}s ago"


def to_json(value: Any) -> str:
    return json.dumps(_plain(value), indent=2, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def reload_line(record: Any) -> str | None:
    """The supervisor's latest reload, from its state file, as one line (None: never reloaded)."""
    if not isinstance(record, dict):
        return None
    head = f"reload {record.get('id')}"
    status = record.get("status")
    finished = when(record.get("finished"))
    if status == "failed":
        return f"{head} failed at {finished}: {record.get('error')}"
    if status == "done":
        return f"{head} done at {finished}: generation {record.get('generation')}"
    if status == "importing":
        return f"{head}: importing the new code (since {when(record.get('started'))})"
    return (
        f"{head}: rolling to generation {record.get('generation')} "
        f"({record.get('workers_on_generation')} workers on it)"
    )
