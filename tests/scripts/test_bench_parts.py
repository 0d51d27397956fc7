"""``scripts/bench --parts ... --before REV`` still runs and ends with its goals table: the quick
form of the speed goals' command on a few parts, this checkout beside its parent commit. Speed
is the benchmark's business, not this test's: no figure is asserted, only the table's shape."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOALS = (
    "CLI: each one-run command <= 150 ms",
    "supervisor start -n 2 --drain on one run exits <= 250 ms",
    "a pool's first claim <= 150 ms after its start",
    "SQLite: >= 13,000 no-op runs/s at -n 2 --concurrency 16",
    ">= 30 % of the bare batched loop",
    "SQLite: >= 10,000 no-op runs/s at -n 2",
    ">= 2x huey -w 8 at -n 8, from launch",
    "I/O row (-n 2 --concurrency 250) <= 1.1x huey's 500 threads",
    "per-run CPU broken down",
    "sqlite: a limit that never binds costs <= 10 %",
    "postgres: a limit that never binds costs <= 10 %",
    "sqlite: a binding per-key cap",
    "PostgreSQL: >= 7,000 tasks/s at 4 worker processes",
    "PostgreSQL: <= 70 us of server CPU per run",
    "sqlite: webhook delivery >= 3,000 events/s per receiver",
    "postgres: webhook delivery >= 3,000 events/s per receiver",
    "an idle worker uses <= 0.3 % of a core",
    "producer p99 <= 30 ms",
    "worker RSS <= 25 MB at one slot",
)


@pytest.mark.slow
@pytest.mark.e2e  # (a minute: scripts/test-e2e runs it)
def test_bench_parts_quick_prints_every_goal(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--parts",
         "cli,startup,noop,slots", "--before", "HEAD~1", "--quick", "--postgres", "",
         "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| # | goal (issue: speed) | measured, this checkout | before | result |" in out
    rows = [line for line in out.splitlines() if re.match(r"\| [1-6] \| ", line)]
    for goal in GOALS:
        assert any(goal in row for row in rows), f"no row for {goal!r} in:\n{out}"
    for row in rows:
        assert len(row.split(" | ")) == 5, row  # item, goal, measured, before, result
    measured = {"CLI: each", "start -n 2 --drain", "first claim", "at -n 2 --concurrency 16",
                "bare batched loop", "runs/s at -n 2 |"}  # fmt: skip
    for row in rows:
        if " | (" in row:  # a figure beside the goals (the pool's CPU per run): no verdict
            assert row.endswith("| - |") and row.split(" | ")[2] != "-", row
            continue
        if any(m in row for m in measured):
            assert row.endswith(("| met |", "| **MISSED** |")), row
            assert row.split(" | ")[3] != "-", f"no figure from before: {row}"
        if "postgres" in row.lower():
            assert row.endswith(("| not measured |", "| see the page |")), row
    assert "| now -n 2 -c 16 |" in out and "| before -n 2 -c 16 |" in out
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"
