"""``scripts/bench streams`` still runs: its smoke run on each backend prints its table and its
verdicts. Speed is the benchmark's business, not this test's."""

from __future__ import annotations

import os
import subprocess
import sys

import pg_session
import pytest
from sv_harness import env_with_tests

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # half a minute: scripts/test-e2e runs it

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_streams_prints_its_table() -> None:
    env = {**env_with_tests(), "LEASEKEEPER_TEST_POSTGRES": pg_session.database_url()}
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "streams", "--quick",
         "--steady", "0.5", "--noops", "20"],
        env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| SQLite", "| Postg"))]
    assert [r.split(" | ")[0] for r in rows] == ["| SQLite", "| PostgreSQL"]
    assert "SQLite: target p99 <= 100 ms and >= 10,000 chunks/s:" in done.stdout
