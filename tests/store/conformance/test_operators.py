"""Operators (B1, B2, B15): ``cancel_run``, ``retry_run``, ``release_owner``, ``prune``: the
answer, what a holder's later write meets (a conflict, a refusal), and unknown runs."""

from __future__ import annotations

import pytest

from workerproc.store import CasResult, ClaimRequest, Commit, InvalidPayload, RunNotFound
from workerproc.store.errors import InvalidOption

from .kit import TTL, Driver, last_word, verb


@verb("cancel_run")
def test_cancel_ends_a_live_run_and_its_holder_meets_a_conflict(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    waiting = s.start_run("u")
    assert s.cancel_run(lease.run_id) and s.cancel_run(waiting)
    assert s.cancel_run(waiting) is False  # over already
    run = s.get_run(lease.run_id)
    assert run is not None and run.status == "cancelled" and run.finished_at == driver.clock.now
    assert driver.finish(lease) is CasResult.CONFLICT  # B15: not a lost lease
    assert s.fence_rejections() == []
    assert driver.commit(Commit(lease, "drop")) is CasResult.OK
    assert "run.cancelled" in [e.kind for e in s.events(run=lease.run_id)]


@verb("cancel_run")
def test_cancel_takes_the_children_with_it(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("parent")
    assert driver.commit(last_word(lease, "spawn")) is CasResult.OK
    ((child, _, _),) = s.run_children(lease.run_id)
    assert s.cancel_run(lease.run_id)
    assert s.get_run(child).status == "cancelled"  # type: ignore[union-attr]


@verb("cancel_run", "retry_run")
def test_cancel_and_retry_of_an_unknown_run_raise(driver: Driver) -> None:
    for op in (driver.store.cancel_run, driver.store.retry_run):
        with pytest.raises(RunNotFound):
            op(404)


@verb("retry_run")
def test_retry_starts_a_new_generation_and_fences_the_old_lease(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    assert s.cancel_run(lease.run_id)
    assert s.retry_run(lease.run_id)
    run = s.get_run(lease.run_id)
    assert run is not None and (run.status, run.finished_at) == ("pending", None)
    (task,) = s.get_tasks(lease.run_id)
    assert task.attempt_base == task.attempts == 1 and task.lease_owner is None
    assert driver.finish(lease) is CasResult.LEASE_LOST  # the old lease was dropped
    driver.clock.advance(TTL + 1)  # (the new generation waits for it: the next test)
    again = driver.claim("w2")
    assert (again.attempt, again.tries) == (2, 1)
    assert "run.retried" in [e.kind for e in s.events(run=lease.run_id)]


@verb("retry_run")
def test_retry_under_a_live_lease_begins_when_that_lease_would_have_expired(
    driver: Driver,
) -> None:
    """A cancelled run's holder may run on until its next renewal tells it, and pay within its
    lease (B13): the new generation must not begin (and keep that call's answer) before."""
    s = driver.store
    lease = driver.lease("t")
    expires = lease.expires_at
    driver.clock.advance(TTL / 2)
    assert s.cancel_run(lease.run_id) and s.retry_run(lease.run_id)
    (task,) = s.get_tasks(lease.run_id)
    assert task.available_at == pytest.approx(expires) and task.lease_owner is None
    assert not driver.exchange(claim=ClaimRequest("w2", TTL)).leases  # it has time left
    driver.clock.advance(TTL / 2 - 1)
    assert not driver.exchange(claim=ClaimRequest("w2", TTL)).leases
    driver.clock.advance(2)
    again = driver.claim("w2")
    assert (again.task_id, again.attempt, again.tries) == (lease.task_id, 2, 1)


@verb("retry_run")
def test_retry_of_a_run_with_no_live_lease_is_due_at_once(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    assert s.cancel_run(lease.run_id)
    driver.clock.advance(TTL + 5)  # the holder's lease ran out before the retry
    assert s.retry_run(lease.run_id)
    (task,) = s.get_tasks(lease.run_id)
    assert task.available_at == pytest.approx(driver.clock.now)
    assert driver.claim("w2").attempt == 2


@verb("retry_run")
def test_retry_refuses_a_live_or_succeeded_run(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("u")
    assert driver.finish(lease) is CasResult.OK
    live = s.start_run("t")
    assert s.retry_run(live) is False and s.retry_run(lease.run_id) is False
    assert s.get_run(live).status == "pending"  # type: ignore[union-attr]


@verb("release_owner")
def test_release_owner_expires_a_dead_owners_leases_at_once(driver: Driver) -> None:
    s = driver.store
    a, b = driver.lease("t", owner="dead"), driver.lease("u", owner="dead")
    alive = driver.lease("v", owner="alive")
    assert s.release_owner("dead") == 2
    assert s.release_owner("dead") == 0 and s.release_owner("nobody") == 0
    taken = {driver.claim("w2").task_id, driver.claim("w2").task_id}
    assert taken == {a.task_id, b.task_id}
    assert driver.finish(a) is CasResult.LEASE_LOST  # the dead owner's write is refused
    assert [r.op for r in s.run_rejections(a.run_id)] == ["finish"]
    assert driver.finish(alive) is CasResult.OK


@verb("prune")
def test_prune_deletes_runs_finished_long_enough_ago(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    old = driver.lease("t")
    assert driver.finish(old) is CasResult.OK
    clock.advance(100)
    young = driver.lease("u")
    assert driver.finish(young) is CasResult.OK
    live = s.start_run("v")
    assert s.prune(50, batch=1) == 1
    assert s.get_run(old.run_id) is None and s.get_tasks(old.run_id) == []
    assert s.get_run(young.run_id) is not None and s.get_run(live) is not None
    assert s.stats().runs.get("succeeded") == 1
    assert s.prune(50) == 0


@verb("prune")
def test_prune_takes_a_pruned_runs_refusals_with_it(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    old, new = driver.zombie("t")
    assert driver.finish(old) is CasResult.LEASE_LOST
    assert driver.finish(new) is CasResult.OK
    clock.advance(TTL * 10)
    assert s.prune(1) == 1
    assert s.fence_rejections() == []


@verb("prune")
def test_prune_refuses_an_age_or_batch_out_of_range(driver: Driver) -> None:
    """``older_than`` NaN made PostgreSQL delete every finished run (``x < now - NaN`` holds
    there for every x) while SQLite deleted none; a negative batch meant "no limit" to SQLite."""
    s = driver.store
    lease = driver.lease("t")
    assert driver.finish(lease) is CasResult.OK
    for age, batch in ((float("nan"), 10), (float("inf"), 10), (1.0, 0), (1.0, -1)):
        with pytest.raises(InvalidOption):
            s.prune(age, batch=batch)
    assert s.get_run(lease.run_id) is not None


@verb("release_owner")
def test_release_owner_refuses_an_owner_no_lease_could_have(driver: Driver) -> None:
    """B9: a lookup by a name no store could hold is refused alike on every backend (SQLite
    answered 0 for a NUL, PostgreSQL raised)."""
    lease = driver.lease("t")
    for owner in ("", "a\x00b", "x" * 256):
        with pytest.raises(InvalidPayload):
            driver.store.release_owner(owner)
    assert driver.store.get_task(lease.task_id).lease_owner == "w1"  # type: ignore[union-attr]
