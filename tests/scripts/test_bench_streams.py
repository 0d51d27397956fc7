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
         "--noops", "20", "--rounds", "2"],
        env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| SQLite", "| Postg"))]
    assert [r.split(" | ")[0] for r in rows] == ["| SQLite", "| PostgreSQL"]
    assert "SQLite: target p99 <= 100 ms and >= 10,000 chunks/s:" in done.stdout
    # the other slots: a line per round (the stream's kept rate in it), then medians and spread
    rounds = [line for line in done.stdout.splitlines() if " round " in line]
    assert [line.split(":")[0].strip() for line in rounds] == [
        "sqlite round 1", "sqlite round 2", "postgres round 1", "postgres round 2"]  # fmt: skip
    assert all("chunks/s" in line for line in rounds)
    assert all(r.count(" | ") == 6 and " to " in r.split(" | ")[4] for r in rows)
    assert "PostgreSQL: target the other slots <= 10% slower beside 10,000 chunks/s:" in done.stdout
