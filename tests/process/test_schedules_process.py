"""Schedules across supervisors (B16): two supervisors share one database and a one-second
schedule; one is SIGKILLed with its workers mid-way and restarted. Over at least ten ticks
exactly one run starts per tick: the runs' keys (``schedule:<name>:<tick>``) name every tick
from the first to the last once (none missed), and the schedule's count of the runs it started
equals their number (a second firing of a tick, turned away by the key, would count twice)."""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from pathlib import Path

import pg_session
import pytest
from helpers import wait_for
from sv_harness import Supervisor, gone

from workerproc.store import open_store

pytestmark = pytest.mark.slow

APP = "apps.schedule_app:app"
ARGS = ["--poll-interval", "0.2", "--lease-ttl", "5"]
PREFIX = "schedule:tick:"


def ticks(db: str) -> tuple[list[float], int, list[str]]:
    """The ticks that started runs (sorted), the schedule's count, the runs' statuses."""
    with open_store(db) as store:
        runs = [r for r in store.list_runs(limit=10_000) if (r.key or "").startswith(PREFIX)]
        (info,) = store.schedules()
    found = sorted(
        datetime.strptime(r.key[len(PREFIX) :], "%Y-%m-%dT%H:%M:%SZ")  # type: ignore[index]
        .replace(tzinfo=UTC)
        .timestamp()
        for r in runs
    )
    return found, info.fired, [r.status for r in runs]


def count(db: str) -> int:
    try:
        return len(ticks(db)[0])
    except Exception:  # not declared yet: no schedule row (or no schema) to read
        return 0


def one_run_per_tick(tmp_path: Path, db: str) -> None:
    a, b = Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")
    a.db = b.db = db
    try:
        a.start(*ARGS, app=APP, n=2)
        b.start(*ARGS, app=APP, n=2)
        wait_for(lambda: count(db) >= 3, timeout=30, what="three ticks fired")
        workers = a.workers()
        a.signal(signal.SIGKILL)  # its worker dies with it (orphan protection)
        a.wait_exit(10)
        assert workers
        wait_for(lambda: gone(workers), timeout=10, what="the killed supervisor's worker gone")
        before = count(db)
        wait_for(lambda: count(db) >= before + 3, timeout=30, what="ticks while one is down")
        a.start(*ARGS, app=APP, n=2)  # restarted: it declares the same schedule again
        a.wait_workers(2)
        wait_for(lambda: count(db) >= before + 9, timeout=30, what="ten ticks and more")
        for sv in (a, b):
            sv.signal(signal.SIGTERM)
        assert [sv.wait_exit(30) for sv in (a, b)] == [0, 0], a.text()[-2000:] + b.text()[-2000:]
    finally:
        for sv in (a, b):
            sv.kill_all()
    found, fired, _ = ticks(db)
    assert len(found) >= 10
    assert found == [found[0] + i for i in range(len(found))], "a tick was missed or doubled"
    assert fired == len(found), "a tick was fired twice"


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
def test_sqlite_two_supervisors_one_killed_start_one_run_per_tick(tmp_path: Path) -> None:
    one_run_per_tick(tmp_path, str(tmp_path / "lk.db"))


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
def test_postgres_two_supervisors_one_killed_start_one_run_per_tick(tmp_path: Path) -> None:
    one_run_per_tick(tmp_path, pg_session.schema_url("schedules"))
