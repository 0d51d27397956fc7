"""What the store answers without writing: runs and tasks, the lists and pages, counts, the
evidence of refused writes, the integrity checks, ``next_ready_at`` and ``ready_in``; and their
bad input."""

from __future__ import annotations

import pytest

from workerproc.store import CasResult, Commit, InvalidPayload
from workerproc.store.errors import InvalidOption

from .kit import TTL, Driver, verb


@verb("get_task", "get_tasks")
def test_a_runs_tasks_and_one_task(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    lease = driver.lease("t", {"p": 1})
    advance = Commit(lease, "advance", next_task="u", next_payload=2, delay=5.0)
    assert driver.commit(advance) is CasResult.OK
    first, second = s.get_tasks(lease.run_id)
    assert (first.id, first.name, first.done_attempt, first.done_owner) == (
        lease.task_id, "t", 1, "w1")  # fmt: skip
    assert (second.name, second.payload, second.available_at, second.attempts) == (
        "u", 2, clock.now + 5, 0)  # fmt: skip
    assert s.get_task(second.id) == second
    assert s.get_task(999) is None and s.get_tasks(999) == []


@verb("list_runs")
def test_list_runs_newest_first_by_status_and_queue(driver: Driver) -> None:
    s = driver.store
    held = driver.lease("t")
    a, b = s.start_run("t", queue="q"), s.start_run("t")
    assert [r.id for r in s.list_runs()] == [b, a, held.run_id]
    assert [r.id for r in s.list_runs("running")] == [held.run_id]
    assert [r.id for r in s.list_runs("pending")] == [b, a]
    assert [r.id for r in s.list_runs(queue="q")] == [a]
    assert [r.id for r in s.list_runs(limit=1)] == [b]
    with pytest.raises(ValueError):
        s.list_runs("sleeping")
    with pytest.raises(InvalidPayload):
        s.list_runs(queue="bad queue")


@verb("runs_page", "task_names")
def test_keyset_pages_and_task_names(driver: Driver) -> None:
    s = driver.store
    ids = [s.start_run(f"t{i % 2}") for i in range(5)]
    assert [r.id for r in s.runs_page(limit=2)] == ids[:-3:-1]
    assert [r.id for r in s.runs_page(before=ids[3], limit=2)] == [ids[2], ids[1]]
    assert [r.id for r in s.runs_page(after=ids[1], limit=2)] == [ids[3], ids[2]]
    assert [r.id for r in s.runs_page(task="t1")] == [ids[3], ids[1]]
    assert [r.id for r in s.runs_page("pending", "t0", limit=1)] == [ids[4]]
    assert sorted(s.task_names()) == ["t0", "t1"] and len(s.task_names(limit=1)) == 1
    with pytest.raises(ValueError):
        s.runs_page(before=1, after=1)
    with pytest.raises(InvalidPayload):
        s.runs_page(task="")


@verb("stats", "next_ready_at", "ready_in")
def test_counts_and_the_earliest_ready_moment(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    assert s.next_ready_at() is None and s.stats().pending_work == 0
    lease = driver.lease("t")
    s.start_run("u", delay=10, queue="q")
    stats = s.stats()
    assert (stats.now, stats.ready, stats.delayed, stats.leased, stats.expired) == (
        clock.now, 0, 1, 1, 0)  # fmt: skip
    assert stats.runs == {"running": 1, "pending": 1} and stats.queues["q"].delayed == 1
    assert [(x.owner, x.task_id) for x in stats.leases] == [("w1", lease.task_id)]
    assert s.next_ready_at() == clock.now + 10 and s.next_ready_at(["q"]) == clock.now + 10
    assert s.next_ready_at(["other"]) is None
    # the same against the clock it was judged by, in one read (an idle worker's look)
    assert s.ready_in() == 10 and s.ready_in(["q"]) == 10 and s.ready_in(["other"]) is None
    clock.advance(TTL + 1)
    assert s.stats().expired == 1
    assert s.next_ready_at(["default"]) <= clock.now  # type: ignore[operator]  # claimable now
    assert s.ready_in(["default"]) <= 0  # type: ignore[operator]
    with pytest.raises(InvalidPayload):
        s.next_ready_at(["bad queue"])
    with pytest.raises(InvalidPayload):
        s.ready_in(["bad queue"])


@verb("fence_rejections", "run_rejections")
def test_the_evidence_of_refused_writes(driver: Driver) -> None:
    s = driver.store
    s.start_runs([{"task": "t"}, {"task": "u"}])
    old, other_old = (driver.claim("zombie") for _ in range(2))
    driver.clock.advance(TTL + 1)
    assert {driver.claim("w2").attempt for _ in range(2)} == {2}
    assert driver.finish(old) is CasResult.LEASE_LOST
    assert driver.finish(other_old) is CasResult.LEASE_LOST
    every = s.fence_rejections()
    now = driver.clock.now
    assert [(r.run_id, r.op, r.at) for r in every] == [
        (old.run_id, "finish", now), (other_old.run_id, "finish", now)]  # fmt: skip
    assert s.fence_rejections(after=every[0].id) == every[1:]
    assert s.fence_rejections(limit=1) == every[:1]
    assert s.run_rejections(old.run_id) == every[:1] and s.run_rejections(999) == []


@verb("integrity_violations", "check_integrity", "integrity_check_name")
def test_a_sound_database_has_no_violations(driver: Driver) -> None:
    s = driver.store
    old, _ = driver.zombie("t")
    driver.finish(old)
    assert s.integrity_violations() == []
    assert s.check_integrity() == [] and s.check_integrity(quick=True, limit=1) == []
    name = s.integrity_check_name()
    assert name is None or isinstance(name, str)
    if driver.name == "sqlite":
        assert (s.integrity_check_name(), s.integrity_check_name(True)) == (
            "integrity_check", "quick_check")  # fmt: skip


@verb("integrity_violations")
def test_a_zombie_write_accepted_behind_the_stores_back_is_a_violation(driver: Driver) -> None:
    s = driver.store
    old, new = driver.zombie("t")
    assert driver.finish(new) is CasResult.OK
    driver.backend.tamper(f"UPDATE tasks SET done_attempt = 1 WHERE id = {old.task_id}")
    (line,) = s.integrity_violations()
    assert f"task {old.task_id}" in line and "zombie" in line


@verb("attempt_history")
def test_attempt_history_keeps_attempts_that_ended_without_a_commit(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    assert driver.commit(Commit(lease, "release", error="boom")) is CasResult.OK
    second = driver.claim("w2")
    driver.clock.advance(TTL + 1)
    third = driver.claim("w3")
    got = [(h.attempt, h.owner, h.outcome, h.error, h.taken_by) for h in
           s.attempt_history(lease.run_id)]  # fmt: skip
    assert got == [(1, "w1", "released", "boom", None), (2, "w2", "taken_over", None, "w3")]
    assert third.previous_owner == "w2" and second.attempt == 2
    assert s.attempt_history(999) == []


@verb("finished_since", "failed_since")
def test_finished_buckets_and_failures_per_queue(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    start = clock.now
    ok = driver.lease("t")
    assert driver.finish(ok) is CasResult.OK
    clock.advance(10)
    bad = driver.lease("u", queue="q")
    assert driver.commit(Commit(bad, "fail", reason="r")) is CasResult.OK
    s.cancel_run(s.start_run("v"))
    got = s.finished_since(start, 5)
    assert [(b.start, b.succeeded, b.failed, b.cancelled) for b in got] == [
        (start, 1, 0, 0), (start + 10, 0, 1, 1)]  # fmt: skip
    assert s.finished_since(start + 1, 100) == [got[1].__class__(start + 1, 100, 0, 1, 1)]
    assert s.failed_since(start) == {"q": 1} and s.failed_since(clock.now + 1) == {}
    with pytest.raises(ValueError):
        s.finished_since(start, 0)
    assert isinstance(InvalidOption("x"), ValueError)


@verb("list_runs", "fence_rejections")
def test_a_negative_limit_answers_nothing_on_every_backend(driver: Driver) -> None:
    """(SQLite read a negative LIMIT as no limit at all, PostgreSQL refused it.)"""
    s = driver.store
    old, _ = driver.zombie("t")
    assert driver.finish(old) is CasResult.LEASE_LOST
    assert s.list_runs(limit=-1) == [] and s.fence_rejections(limit=-1) == []
    assert s.list_runs(limit=0) == [] and len(s.fence_rejections(limit=1)) == 1


BEYOND = 2**70  # an id no run can have (every backend's ids are 64-bit)


@verb("get_run", "get_task", "get_tasks", "run_signals", "attempt_history", "run_rejections")
def test_a_read_of_an_id_beyond_64_bits_answers_as_for_an_unknown_run(driver: Driver) -> None:
    s = driver.store
    assert s.get_run(BEYOND) is None and s.get_task(BEYOND) is None
    assert s.get_tasks(BEYOND) == [] and s.run_signals(BEYOND) == []
    assert s.attempt_history(BEYOND) == [] and s.run_rejections(BEYOND) == []
