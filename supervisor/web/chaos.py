"""The chaos report (``supervisor start --chaos-report FILE``), read and checked for the page.

The file is the verifier's JSON (``supervisor/chaos/verifier.py``). It is written when the
supervisor exits, so a missing file is a normal state, not an error. Anything unreadable
becomes one line on the page.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

MAX_REPORT = 32 * 1024 * 1024  # bytes: a report of a very long chaos run, never more


@dataclass(frozen=True)
class ChaosReport:
    path: str
    doc: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # why there is no report to draw
    modified: float | None = None

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for e in self.doc.get("events", []) if isinstance(e, dict)]

    @property
    def violations(self) -> list[str]:
        return [str(v) for v in self.doc.get("violations", [])]

    @property
    def warnings(self) -> list[str]:
        """Slow takeovers: load, not a verdict (older reports have none)."""
        return [str(w) for w in self.doc.get("warnings", [])]

    def latencies(self) -> list[float]:
        """Takeover latencies (ms) of the faults that orphaned a lease."""
        return [float(e["taken_over_ms"]) for e in self.events
                if isinstance(e.get("taken_over_ms"), (int, float))]  # fmt: skip


class ReportFile:
    """The report at ``path``, parsed again only when the file changed (pages poll it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[tuple[int, int, int], ChaosReport] | None = None

    def read(self) -> ChaosReport:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            return load(self.path)
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, load(self.path))
        return self._seen[1]


def load(path: str) -> ChaosReport:
    try:
        with open(path, "rb") as fh:
            modified = os.fstat(fh.fileno()).st_mtime
            data = fh.read(MAX_REPORT + 1)
    except FileNotFoundError:
        return ChaosReport(path, problem="no report yet: chaos mode writes it when the "
                           "supervisor exits")  # fmt: skip
    except OSError as exc:
        return ChaosReport(path, problem=f"cannot read it: {exc.strerror or exc}")
    if len(data) > MAX_REPORT:
        return ChaosReport(path, problem=f"larger than {MAX_REPORT // 2**20} MiB: not drawn")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return ChaosReport(path, problem=f"not valid JSON: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("events", []), list):
        return ChaosReport(path, problem="not a chaos report (no events list)")
    return ChaosReport(path, doc, modified=modified)
