"""The store benchmark still runs: ``scripts/bench_store.py --quick`` exits 0 and prints its
table. Speed is the benchmark's business, not this test's: no goal is asserted here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_store_quick_prints_the_table(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_store.py"), "--quick",
         "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "| measurement | result | goal | notes |" in out
    for row in ("claim+ack throughput, 8 processes", "latency ratio", "hot-run slowdown",
                "write-lock wait, 8 processes", "| process | claim+ack done |"):  # fmt: skip
        assert row in out, f"missing {row!r} in:\n{out}"
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"


@pytest.mark.slow
def test_bench_web_smoke_prints_both_rows(tmp_path: object) -> None:
    """``scripts/bench_web.py`` still drains with and without a busy dashboard."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_web.py"), "--runs", "200",
         "--workers", "1", "--rounds", "1", "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("| without a dashboard |", "| with 3 pages loaded every second |", "| ratio |"):
        assert row in proc.stdout, proc.stdout
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"
