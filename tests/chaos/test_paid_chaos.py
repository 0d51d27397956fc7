"""Every paid call accounted for (B13) under chaos, small: runs of one paid call each under
kill+pause chaos on both backends (PostgreSQL: two supervisors sharing the database), judged by an
outside ledger the handlers write (tests/support/paid_ledger.py says what it proves). Every extra
payment is a call a fault struck in flight (at most two in the keep's own milliseconds),
``paid_again`` counts at least every one of them, every ``once`` returned the first kept answer,
every run succeeded. scripts/soak-paid runs the same at the acceptance's 300 runs (.ci/run, after
scripts/test)."""

from __future__ import annotations

from pathlib import Path

import paid_ledger
import pg_session
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

RUNS = 100


def check(soak: paid_ledger.Soak) -> None:
    print(f"\n{soak.line()}")
    assert soak.findings == []
    assert soak.figures["kept"] == RUNS
    assert soak.figures["calls_hit"] > 0, "no fault landed in a call: the soak proved nothing"


def test_sqlite_every_extra_payment_was_in_flight_at_a_fault(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    check(paid_ledger.run_soak(tmp_path, db, "sqlite", RUNS, supervisors=1, timeout=100))


def test_postgres_every_extra_payment_was_in_flight_at_a_fault(tmp_path: Path) -> None:
    url = pg_session.schema_url("paid")
    check(paid_ledger.run_soak(tmp_path, url, "postgres", RUNS, timeout=100))
