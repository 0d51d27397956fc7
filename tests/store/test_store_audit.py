"""The evidence the store keeps for operators and chaos mode: claim times, the committing
attempt, refused writes, integrity checks; and the forward migration that added them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from helpers import FakeClock
from store_backends import Backend, commit, finish
from unfenced import sources, unfenced_statements

from workerproc.store import Commit, Store, open_store
from workerproc.store.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

TTL = 10.0


class TestEvidence:
    def test_claim_time_and_committing_attempt_are_kept(self, s: Store, clock: FakeClock):
        run = s.start_run("t")
        first = s.claim("a", TTL)
        assert first is not None
        clock.advance(TTL + 1)
        second = s.claim("b", TTL)
        assert second is not None and second.attempt == 2
        (task,) = s.get_tasks(run)
        assert task.claimed_at == clock.now
        assert s.ack(second)
        done = s.get_task(task.id)
        assert done is not None and done.done_attempt == 2 and done.attempts == 2

    def test_every_refused_write_is_recorded_and_nothing_else(self, s: Store, clock: FakeClock):
        s.start_run("t")
        zombie = s.claim("a", TTL)
        assert zombie is not None
        assert s.renew(zombie, TTL)  # accepted: not evidence of anything
        clock.advance(TTL + 1)
        live = s.claim("b", TTL)
        assert live is not None
        assert not s.renew(zombie, TTL)
        assert s.compare_and_set(zombie, 0, {"x": 1}) == "lease_lost"
        assert commit(s, Commit(zombie, "finish", new_state={"x": 2})).result == "lease_lost"
        assert not s.ack(zombie)
        rejections = s.fence_rejections()
        assert [r.op for r in rejections] == ["renew", "compare_and_set", "finish", "ack"]
        assert {(r.task_id, r.owner, r.attempt) for r in rejections} == {(zombie.task_id, "a", 1)}
        assert s.fence_rejections(after=rejections[1].id) == rejections[2:]
        assert s.ack(live)
        assert len(s.fence_rejections()) == 4

    def test_integrity_is_clean_after_takeovers(self, s: Store, clock: FakeClock):
        for _ in range(3):
            s.start_run("t")
        for owner in ("a", "b"):
            lease = s.claim(owner, TTL)
            assert lease is not None
        clock.advance(TTL + 1)
        while (lease := s.claim("c", TTL)) is not None:
            assert s.ack(lease)
        assert s.integrity_violations() == []


def test_integrity_reports_a_superseded_commit_and_overlapping_leases(db_path: str):
    store = open_store(db_path)
    one, two = store.start_run("t"), store.start_run("t")
    lease = store.claim("a", TTL)
    assert lease is not None and store.ack(lease)
    raw = sqlite3.connect(db_path, isolation_level=None)
    # what a zombie write would leave behind, and what a broken claim would (a lease is keyed
    # by its run, so two live leases in one run take a table without that key)
    raw.execute("UPDATE tasks SET attempts = 2 WHERE run_id = ?", (one,))
    raw.executescript(
        "DROP TABLE leases; CREATE TABLE leases (run_id INTEGER, task_id INTEGER, owner TEXT, "
        "attempts INTEGER, expires_at REAL);"
    )
    raw.execute(
        "INSERT INTO leases (run_id, task_id, owner, attempts, expires_at) "
        "SELECT run_id, id, 'x', 1, 1e12 FROM tasks WHERE run_id = ? UNION ALL "
        "SELECT run_id, id, 'y', 1, 1e12 FROM tasks WHERE run_id = ?",
        (two, two),
    )
    raw.close()
    found = store.integrity_violations()
    assert any("superseded" in v and f"run {one}" in v for v in found)
    assert any(f"run {two} holds 2 live leases" in v for v in found)
    store.close()


def test_migration_from_v1_keeps_data_and_adds_the_evidence(db_path: str):
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.executescript(f"BEGIN; {MIGRATIONS[0]} PRAGMA user_version = 1; COMMIT;")
    raw.execute("INSERT INTO runs (state, created_at, updated_at) VALUES ('{\"n\": 1}', 1, 1)")
    raw.execute(
        "INSERT INTO tasks (run_id, name, available_at, created_at) VALUES (1, 'old', 1, 1)"
    )
    raw.close()
    store = open_store(db_path)
    version = sqlite3.connect(db_path).execute("PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION >= 2
    run = store.get_run(1)
    assert run is not None and run.state == {"n": 1}
    lease = store.claim("w", TTL)
    assert lease is not None and lease.task == "old"
    assert store.ack(lease)
    task = store.get_task(lease.task_id)
    assert task is not None and task.done_attempt == 1 and task.claimed_at is not None
    store.close()


def zombie_finish(backend: Backend) -> tuple[bool, str, int]:
    """A lease holder paused past its ttl renews, then tries to finish, after a successor
    claimed the task: was it renewed, what did its finish answer, how many violations."""
    now = [1000.0]
    s = backend.open(clock=lambda: now[0])
    try:
        s.start_run("t")
        zombie = s.claim("a", 10)
        assert zombie is not None
        now[0] += 11
        assert s.claim("b", 10) is not None
        renewed = s.renew_many([zombie], 10)[0] is not None
        return renewed, str(finish(s, zombie, 0, {"by": "zombie"})), len(s.integrity_violations())
    finally:
        s.close()


def test_the_broken_test_store_really_lets_a_zombie_write(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The chaos verifier's must-fail test runs on tests/support/unfenced.py; prove that it breaks
    the fence of each backend (and that the same zombie is refused by the real store)."""
    assert zombie_finish(backend) == (False, "lease_lost", 0)
    (tmp_path / "unfenced").mkdir()
    other = type(backend)(str(tmp_path / "unfenced"))  # a fresh database
    module, catalogue = sources(backend.name)
    for name, sql in unfenced_statements(backend.name).items():  # undone by monkeypatch afterwards
        if hasattr(module, name):
            monkeypatch.setattr(module, name, sql)
        if isinstance(catalogue.get(name), str):
            monkeypatch.setitem(catalogue, name, sql)
    assert zombie_finish(other) == (True, "ok", 1)


def test_attempts_lost_without_an_error_still_explain_the_failure(db_path: str):
    now = [1000.0]
    store = open_store(db_path, clock=lambda: now[0])
    run_id = store.start_run("fragile")
    for i in range(3):  # three workers die holding it: no handler ever raised
        assert store.claim(f"w{i}", 1.0) is not None
        now[0] += 2
    assert store.claim("w", 1.0) is None
    run = store.get_run(run_id)
    assert run is not None and run.failure_reason == "task_attempts_exhausted"
    assert run.last_error is not None and "ended without a commit" in run.last_error
    store.close()


class TestTakeoverFlag:
    def test_a_claim_says_whether_it_took_a_lease_over(self, s: Store, clock: FakeClock):
        s.start_run("t")
        first = s.claim("a", TTL)
        assert first is not None and not first.takeover
        clock.advance(TTL + 1)
        second = s.claim("b", TTL)  # a's lease expired on the task
        assert second is not None and second.takeover
        assert s.release(second)
        third = s.claim("c", TTL)  # handed back cleanly: a retry, not a takeover
        assert third is not None and not third.takeover

    def test_release_owner_makes_the_next_claim_a_takeover(self, s: Store, clock: FakeClock):
        s.start_run("t")
        assert s.claim("dead", TTL) is not None
        assert s.release_owner("dead") == 1
        lease = s.claim("alive", TTL)
        assert lease is not None and lease.takeover
