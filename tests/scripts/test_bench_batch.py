"""``scripts/bench batch`` still runs: a few runs on SQLite at batch=1 and batch=64, two rounds
alternated, and prints its table of medians with the pool's CPU per run. Speed is the
benchmark's business, not this test's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sv_harness import env_with_tests

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.e2e  # (a benchmark's smoke run: scripts/test-e2e runs it)
def test_bench_batch_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "batch", "--runs", "100",
         "--backends", "sqlite", "--rounds", "2"],
        env=env_with_tests(), capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| SQLite")]
    assert len(rows) == 1 and rows[0].endswith("x |"), done.stdout
    assert rows[0].count("ms CPU") == 2, rows[0]
    assert "median of 2 alternated rounds" in done.stdout, done.stdout
