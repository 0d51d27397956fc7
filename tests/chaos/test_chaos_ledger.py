"""The start rule under chaos, judged by the handlers' own ledger (tests/support/ledger.py), not by
the workers or the verifier: a short-ttl soak with kills and pauses, on SQLite with slots and on
PostgreSQL with two supervisors sharing the database. No handler of attempt k may start after
attempt k+1 of the same task started, and no live worker may lose a lease within 100 ms of
starting its handler; the verifier's own liveness rule must hold too. (``scripts/soak`` runs
the same judge on the long version: 1,000 runs, threads and async, both backends.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ledger
import pg_session
import pgbouncer as pgbouncer_support
import pytest
from sv_harness import Supervisor

from workerproc.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

APP = "apps.ledger_app:app"
STEPS = 3
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--max-attempts", "20",
         "--chaos", "--chaos-faults", "kill,pause"]  # fmt: skip


def enqueue(db: str, path: Path, runs: int, task: str) -> list[int]:
    payload = {"n": 0, "steps": STEPS, "sleep": 0.1, "sleep_max": 0.3, "ledger": str(path)}
    with open_store(db) as store:
        return store.start_runs([{"task": task, "payload": payload}] * runs)


def soak(
    sups: list[tuple[Supervisor, int, list[str]]], tmp_path: Path, interval: float
) -> list[dict[str, Any]]:
    reports = []
    for i, (sv, n, extra) in enumerate(sups):
        report = tmp_path / f"chaos{i}.json"
        sv.start(*CHAOS, "--chaos-interval", str(interval), "--chaos-seed", str(11 + i),
                 "--chaos-report", str(report), *extra, app=APP, n=n)  # fmt: skip
        reports.append(report)
    codes = [sv.wait_exit(240) for sv, _, _ in sups]
    assert codes == [0] * len(sups), "".join(sv.text()[-3000:] for sv, _, _ in sups)
    return [json.loads(r.read_text()) for r in reports]


def judge(db: str, path: Path, runs: list[int], docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        assert doc["ok"] and doc["violations"] == [], doc["violations"]
        assert doc["taken_over"] == doc["orphaned_leases"] and doc["not_taken_over"] == 0
    assert sum(d["faults"]["pause"] for d in docs) >= 1, [d["faults"] for d in docs]
    assert sum(d["faults"]["kill"] for d in docs) >= 1, [d["faults"] for d in docs]
    entries = ledger.read(path)
    assert ledger.late_starts(entries) == []
    assert ledger.doomed_starts(entries, ledger.pauses(docs)) == []
    with open_store(db) as store:
        for run_id in runs:
            run = store.get_run(run_id)
            assert run is not None and run.status == "succeeded", run
            assert [w["step"] for w in run.state["writes"]] == list(range(STEPS))
            assert run.revision == STEPS  # one committed write per step
        assert store.integrity_violations() == []


def test_sqlite_slots_under_kills_and_pauses_start_no_step_taken_over(tmp_path: Path) -> None:
    sv = Supervisor(tmp_path)
    path = tmp_path / "ledger.jsonl"
    try:
        runs = enqueue(sv.db, path, 60, "step")
        docs = soak([(sv, 3, ["--concurrency", "6"])], tmp_path, 0.4)
        judge(sv.db, path, runs, docs)
    finally:
        sv.kill_all()


def test_postgres_two_supervisors_under_kills_and_pauses_start_no_step_taken_over(
    tmp_path: Path,
) -> None:
    url = pg_session.schema_url("ledger")
    first, second = Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")
    first.db = second.db = url
    path = tmp_path / "ledger.jsonl"
    try:
        runs = enqueue(url, path, 40, "step")
        docs = soak([(first, 3, []), (second, 3, [])], tmp_path, 0.6)
        judge(url, path, runs, docs)
    finally:
        first.kill_all()
        second.kill_all()


@pytest.mark.pgbouncer
def test_through_pgbouncer_two_supervisors_under_kills_and_pauses_start_no_step_taken_over(
    tmp_path: Path, pgbouncer: pgbouncer_support.Bouncer
) -> None:
    """The same soak with every connection through PgBouncer in transaction mode: one
    supervisor woken by LISTEN straight to the server, the other polling."""
    direct = pg_session.schema_url("bouncer")
    first, second = Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")
    first.db, second.db = pgbouncer.url(direct, "direct"), pgbouncer.url(direct, "poll")
    path = tmp_path / "ledger.jsonl"
    try:
        runs = enqueue(first.db, path, 40, "step")
        docs = soak([(first, 3, []), (second, 3, [])], tmp_path, 0.6)
        judge(second.db, path, runs, docs)
    finally:
        first.kill_all()
        second.kill_all()
