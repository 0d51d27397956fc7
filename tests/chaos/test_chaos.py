"""Chaos mode end to end: a real supervisor attacks its own workers; the verifier proves from the
database that every orphaned lease was taken over and no zombie wrote, and it can fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pg_session
import pytest
from sv_harness import Supervisor

from supervisor import exitcodes
from workerproc.store import open_store

pytestmark = pytest.mark.slow

APP = "apps.chaos_app:app"
REPORT_KEYS = {
    "faults", "orphaned_leases", "taken_over", "not_taken_over", "takeover_ms",
    "zombie_writes_rejected", "violations", "events", "ok", "spared", "spared_by", "spared_why",
}  # fmt: skip
EVENT_KEYS = {"fault", "pid", "task_id", "attempt", "t", "taken_over_ms"}


@pytest.fixture
def sv(sv_each: Supervisor) -> Supervisor:
    """Every chaos test runs on each backend."""
    return sv_each


def enqueue(
    sv: Supervisor,
    runs: int,
    steps: int,
    sleep: float,
    sleep_max: float | None = None,
    task: str = "step",
) -> list[int]:
    store = open_store(sv.db)
    try:
        payload = {"n": 0, "steps": steps, "sleep": sleep, "sleep_max": sleep_max or sleep}
        return [store.start_run(task, payload, {}) for _ in range(runs)]
    finally:
        store.close()


def chaos_run(
    sv: Supervisor,
    *extra: str,
    n: int = 4,
    app: str = APP,
    max_attempts: int = 20,
    interval: float = 0.3,
    timeout: float = 120,
) -> dict[str, Any]:
    report = str(sv.workdir / "chaos.json")
    sv.start(
        "--drain", "--lease-ttl", "0.5", "--poll-interval", "0.2",
        "--max-attempts", str(max_attempts),
        "--chaos", "--chaos-interval", str(interval), "--chaos-seed", "1234",
        "--chaos-report", report, *extra, n=n, app=app,
    )  # fmt: skip
    code = sv.wait_exit(timeout)
    with open(report) as f:
        doc: dict[str, Any] = json.load(f)
    doc["exit_code"] = code
    return doc


def assert_one_write_per_step(sv: Supervisor, runs: list[int], steps: int) -> None:
    store = open_store(sv.db)
    try:
        for run_id in runs:
            run = store.get_run(run_id)
            assert run is not None and run.status == "succeeded", run
            writes = run.state["writes"]
            assert [w["step"] for w in writes] == list(range(steps)), writes
            assert run.revision == steps  # exactly one committed write per step
        assert store.integrity_violations() == []
    finally:
        store.close()


def test_chaos_with_fast_release_takes_every_orphan_over_and_no_zombie_writes(sv: Supervisor):
    runs = enqueue(sv, runs=100, steps=3, sleep=0.03)
    report = chaos_run(sv)
    assert report["exit_code"] == 0, sv.text()[-3000:]
    assert report["ok"] and report["violations"] == []
    assert set(report) >= REPORT_KEYS
    assert {"p50", "p99", "max"} <= set(report["takeover_ms"])
    assert report["faults"]["kill"] >= 1 and report["faults"]["pause"] >= 1
    assert report["orphaned_leases"] >= 1
    assert report["taken_over"] == report["orphaned_leases"]
    assert report["not_taken_over"] == 0
    assert report["zombie_writes_rejected"] >= 1  # a paused zombie woke and was turned away
    for event in report["events"]:
        assert set(event) >= EVENT_KEYS
    assert_one_write_per_step(sv, runs, 3)


@pytest.mark.e2e  # (four soaks of 15-20 s: scripts/test-e2e runs them)
@pytest.mark.parametrize("task", ["step", "astep"])
def test_chaos_with_slots_takes_over_every_lease_of_a_victim(sv: Supervisor, task: str):
    """Two workers of eight slots each (threads, or an event loop): a fault strikes a worker
    holding several leases, and every one of them must be taken over."""
    runs = enqueue(sv, runs=120, steps=3, sleep=0.05, sleep_max=0.15, task=task)
    report = chaos_run(sv, "--concurrency", "8", n=2)
    assert report["exit_code"] == 0, sv.text()[-3000:]
    assert report["ok"] and report["violations"] == []
    assert report["taken_over"] == report["orphaned_leases"] >= 2
    assert report["not_taken_over"] == 0
    by_victim: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for e in report["events"]:
        by_victim.setdefault((e["pid"], e["t"]), []).append(e)
    several = [evs for evs in by_victim.values() if len(evs) > 1]
    assert several, "no fault struck a worker holding several leases"
    for evs in several:
        assert len({e["task_id"] for e in evs}) == len(evs)
    assert_one_write_per_step(sv, runs, 3)


def test_chaos_without_fast_release_proves_the_ttl_path(sv: Supervisor):
    runs = enqueue(sv, runs=120, steps=3, sleep=0.03)
    report = chaos_run(sv, "--no-fast-release", "--chaos-faults", "kill")
    assert report["exit_code"] == 0, sv.text()[-3000:]
    assert report["ok"] and report["faults"]["kill"] >= 1 and report["faults"]["pause"] == 0
    kills = [e for e in report["events"] if e["outcome"] == "taken_over"]
    assert kills, report["events"]
    # without fast release a dead worker's lease is only taken over once it expires
    assert all(e["taken_over_ms"] >= 100 for e in kills), kills
    assert report["fast_release"] is False
    assert_one_write_per_step(sv, runs, 3)


@pytest.mark.e2e  # (steps of a second under pauses, on each backend: scripts/test-e2e)
def test_chaos_alone_never_fails_a_run_when_steps_outlast_the_fault_interval(sv: Supervisor):
    """Pauses every ~0.5 s, steps of 0.8-1.6 s: without the sparing rule nearly every attempt
    of the last runs is paused before it can finish, and runs end task_attempts_exhausted.
    With it, a task's last allowed attempt is never struck: every run succeeds."""
    runs = enqueue(sv, runs=6, steps=1, sleep=0.8, sleep_max=1.6)
    report = chaos_run(
        sv, "--chaos-faults", "pause", n=2, max_attempts=3, interval=0.5, timeout=180
    )
    assert report["exit_code"] == 0, sv.text()[-3000:]
    assert report["ok"], report["violations"]
    assert report["faults"]["pause"] >= 3
    store = open_store(sv.db)
    try:
        for run_id in runs:
            run = store.get_run(run_id)
            assert run is not None and run.status == "succeeded", (run, report["events"])
            (task,) = store.get_tasks(run_id)
            faulted = [e for e in report["events"] if e["task_id"] == task.id]
            struck = {e["attempt"] for e in faulted if e["outcome"] != "finished_before"}
            assert len(struck) <= 2  # at most max_attempts - 1 of its attempts
    finally:
        store.close()
    assert report["spared"] >= 1  # the rule did hold faults back


def test_the_verifier_reports_a_violation_when_fencing_is_disabled(sv: Supervisor):
    """Handlers outlive the pause: with the fence broken (by the test app,
    tests/support/unfenced.py), a woken zombie commits before its successor, and the verifier
    must say so (and the exit code too)."""
    enqueue(sv, runs=6, steps=1, sleep=2.0)
    report = chaos_run(
        sv,
        "--chaos-faults", "pause", "--chaos-max-faults", "3", "--chaos-pause", "1.0",
        n=3, app="apps.chaos_unfenced:app",
    )  # fmt: skip
    assert report["exit_code"] == exitcodes.CHAOS_VIOLATION
    assert not report["ok"]
    assert any("zombie" in v or "superseded" in v for v in report["violations"])


def test_chaos_options_are_validated(sv: Supervisor):
    sv.start("--chaos", "--chaos-faults", "kill,explode", n=1, pidfile=False)
    assert sv.wait_exit() == exitcodes.USAGE
    assert "--chaos-faults" in sv.text()
    assert "Traceback" not in sv.text()


def test_two_supervisors_on_one_postgres_database_both_with_chaos(tmp_path: Path):
    """Two hosts' supervisors (stand-ins) share one database, both attack their own workers;
    both audits pass and every run succeeds with exactly one write per step."""
    url = pg_session.schema_url("hosts")
    first, second = Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")
    first.db = second.db = url
    try:
        runs = enqueue(first, runs=120, steps=3, sleep=0.03)
        reports = []
        for i, sv in enumerate((first, second)):
            report = str(tmp_path / f"chaos{i}.json")
            sv.start(
                "--drain", "--lease-ttl", "0.5", "--poll-interval", "0.2",
                "--max-attempts", "20", "--chaos", "--chaos-interval", "0.3",
                "--chaos-seed", str(1234 + i), "--chaos-report", report, n=3, app=APP,
            )  # fmt: skip
            reports.append(report)
        codes = [sv.wait_exit(180) for sv in (first, second)]
        assert codes == [0, 0], first.text()[-2000:] + second.text()[-2000:]
        docs = [json.loads(Path(r).read_text()) for r in reports]
        for doc in docs:
            assert doc["ok"] and doc["violations"] == [] and doc["not_taken_over"] == 0
            assert doc["taken_over"] == doc["orphaned_leases"]
        assert sum(d["faults"]["kill"] + d["faults"]["pause"] for d in docs) >= 2
        assert sum(d["orphaned_leases"] for d in docs) >= 1
        assert_one_write_per_step(first, runs, 3)
    finally:
        first.kill_all()
        second.kill_all()
