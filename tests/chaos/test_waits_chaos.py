"""Waits and children (B14) under chaos, on both backends, with two
supervisors sharing the database under kills and pauses (tests/apps/waits_app.py), judged from
the database: every child is created exactly once and every join commits once with every
child's result in spawn order; signals sent from another process while the runs wait (before,
during and between their waits) are each delivered to exactly one wait, none lost, none twice.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import pg_session
import pytest
from sv_harness import Supervisor

from workerproc.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

APP = "apps.waits_app:app"
CHAOS = ["--lease-ttl", "1", "--poll-interval", "0.2", "--prefetch", "0",
         "--max-attempts", "30", "--chaos", "--chaos-faults", "kill,pause",
         "--chaos-interval", "0.7"]  # fmt: skip
PARENTS, KIDS, APPROVALS, K = 6, 5, 8, 3


def send_signals(db: str, runs: list[int], stop: threading.Event) -> None:
    """K signals to each run, in order per run, at random moments over a few seconds."""
    rng = random.Random(7)
    plan = sorted((rng.uniform(0, 4), r, i) for r in runs for i in range(K))
    sent = {r: 0 for r in runs}
    start = time.monotonic()
    with open_store(db) as store:
        for at, run_id, _ in plan:
            while time.monotonic() - start < at and not stop.is_set():
                time.sleep(0.01)
            store.signal(run_id, "go", sent[run_id])  # in order per run: 0, 1, 2
            sent[run_id] += 1


def run_soak(tmp_path: Path, db: str) -> None:
    with open_store(db) as store:
        parents = store.start_runs([{"task": "parent", "payload": {"n": KIDS}}] * PARENTS)
        approvals = store.start_runs([{"task": "draft", "payload": {"k": K}}] * APPROVALS)
    stop = threading.Event()
    sender = threading.Thread(target=send_signals, args=(db, approvals, stop))
    sups = [Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")]
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            sv.start(*CHAOS, "--chaos-seed", str(11 + i), "--concurrency", "2", app=APP, n=2)
        sender.start()
        deadline = time.monotonic() + 30
        with open_store(db) as store:
            while time.monotonic() < deadline:
                runs = store.list_runs(limit=1000)
                if len(runs) == PARENTS * (1 + KIDS) + APPROVALS and all(r.terminal for r in runs):
                    break
                time.sleep(0.2)
        stop.set()
        sender.join(10)
        for sv in sups:
            sv.signal(signal.SIGTERM)
        for sv in sups:
            sv.wait_exit(30)
    finally:
        stop.set()
        for sv in sups:
            sv.kill_all()
    with open_store(db) as store:
        runs = store.list_runs(limit=1000)
        by_status = sorted({r.status for r in runs})
        assert by_status == ["succeeded"], [
            (r.id, r.status, r.task) for r in runs if not r.terminal
        ]
        # every child created once: exactly KIDS per parent, nothing else
        assert len(runs) == PARENTS * (1 + KIDS) + APPROVALS
        assert store.integrity_violations() == []
        for p in parents:
            run = store.get_run(p)
            assert run is not None and run.state == {"joins": 1}  # the join committed once
            assert run.result == [{"i": i, "sq": i * i} for i in range(KIDS)]
        for a in approvals:
            run = store.get_run(a)
            assert run is not None and run.result == list(range(K))  # none lost, none twice
            signals = store.run_signals(a)
            assert len(signals) == K and all(s.task_id is not None for s in signals)
            assert len({s.task_id for s in signals}) == K  # each resumed its own wait


def test_sqlite_waits_and_children_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, str(tmp_path / "lk.db"))


def test_postgres_waits_and_children_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, pg_session.schema_url("waits"))
