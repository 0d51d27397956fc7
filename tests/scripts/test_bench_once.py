"""``scripts/bench once`` still runs: a few runs on each backend, one
pool of each kind, and prints its table. Speed is the benchmark's business, not this test's."""

from __future__ import annotations

import os
import subprocess
import sys

import pg_session
import pytest
from sv_harness import env_with_tests

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.e2e  # (a benchmark's smoke run: scripts/test-e2e runs it)
def test_bench_once_prints_its_table() -> None:
    env = {**env_with_tests(), "LEASEKEEPER_TEST_POSTGRES": pg_session.database_url()}
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "once", "--runs", "30",
         "--configs", "1x1,1x2", "--work-ms", "0", "--before", "0.1"],
        env=env, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| SQLite", "| Postg"))]
    assert [r.split(" | ")[0] for r in rows] == [
        "| SQLite -n 1", "| SQLite -n 1 --concurrency 2", "| PostgreSQL -n 1",
        "| PostgreSQL -n 1 --concurrency 2"]  # fmt: skip
    assert "target p99 <= 10 ms:" in done.stdout
