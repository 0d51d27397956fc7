"""Renewals (R3, B3, B5, B15): ``renew_many`` and ``renew_each``: the new expiry, the fence (a
lost or expired lease is refused alone and recorded as ``renew``), and the refusals of a
programming error."""

from __future__ import annotations

import pytest

from workerproc.store import ClaimRequest, Renewal
from workerproc.store.errors import InvalidOption

from .kit import TTL, Driver, verb


@verb("renew_many")
def test_renewal_is_max_of_old_expiry_and_now_plus_ttl(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    lease = driver.lease("t")
    clock.advance(10)
    assert s.renew_many([lease], TTL) == [clock.now + TTL]
    assert s.renew_many([lease], 1) == [clock.now + TTL]  # a shorter ttl never shortens it
    assert s.get_task(lease.task_id).lease_expires_at == clock.now + TTL  # type: ignore[union-attr]
    assert s.renew_many([], TTL) == []


@verb("renew_many")
def test_a_lost_lease_is_refused_alone_and_recorded(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    old, new = driver.zombie("t")
    mine = driver.lease("u", owner="zombie")
    assert s.renew_many([old, mine], TTL) == [None, clock.now + TTL]
    (refusal,) = s.fence_rejections()
    assert (refusal.task_id, refusal.owner, refusal.attempt, refusal.op) == (
        old.task_id, "zombie", 1, "renew")  # fmt: skip
    assert s.get_task(new.task_id).lease_owner == "w2"  # type: ignore[union-attr]


@verb("renew_many")
def test_an_expired_lease_is_never_revived(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    driver.clock.advance(TTL)  # expires_at <= now: expired
    assert s.renew_many([lease], TTL) == [None]
    assert [r.op for r in s.run_rejections(lease.run_id)] == ["renew"]
    assert driver.claim("w2").attempt == 2


@verb("renew_many", "renew_each")
def test_leases_of_two_owners_are_a_programming_error(driver: Driver) -> None:
    s = driver.store
    a, b = driver.lease("t", owner="a"), driver.lease("u", owner="b")
    for renew in (s.renew_many, s.renew_each):
        with pytest.raises(ValueError):
            renew([a, b], TTL)
    assert s.fence_rejections() == []


@verb("renew_each")
def test_renew_each_says_when_the_run_was_cancelled_under_its_holder(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    a, b = driver.lease("t"), driver.lease("u")
    assert s.cancel_run(b.run_id)
    assert s.renew_each([a, b], TTL) == [Renewal(clock.now + TTL), Renewal(clock.now + TTL, True)]


@verb("renew_each")
def test_renew_each_records_a_start_and_refuses_a_lost_lease(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    for task in ("t", "u"):
        s.start_run(task)
    held = driver.exchange(claim=ClaimRequest("w1", 10, limit=2, start=0)).leases
    assert [lease.started for lease in held] == [False, False]
    assert s.renew_each(held, 10, starting=held[:1]) == [Renewal(clock.now + 10)] * 2
    clock.advance(11)
    assert s.renew_each(held, 10) == [Renewal(None), Renewal(None)]
    assert sorted(r.op for r in s.fence_rejections()) == ["renew", "renew"]
    driver.exchange(claim=ClaimRequest("w2", 10, limit=2))
    outcomes = {h.task_id: h.outcome for r in held for h in s.attempt_history(r.run_id)}
    # the confirmed start spent its attempt (taken over); the unconfirmed one did not (B3)
    assert outcomes == {held[0].task_id: "taken_over", held[1].task_id: "unstarted"}


@verb("renew_each")
def test_renew_each_starting_must_be_among_the_leases(driver: Driver) -> None:
    a, b = driver.lease("t"), driver.lease("u")
    with pytest.raises(ValueError):
        driver.store.renew_each([a], TTL, starting=[b])
    assert driver.store.renew_each([], TTL) == []


@verb("renew_many", "renew_each", "commit_many")
@pytest.mark.parametrize("ttl", [float("nan"), float("inf")])
def test_a_ttl_that_is_not_a_finite_number_is_refused_before_anything_is_written(
    driver: Driver, ttl: float
) -> None:
    """A lease must expire: a NaN ttl made PostgreSQL keep a lease whose expiry compares above
    every time (held for ever) and SQLite fail on its own CHECK."""
    s = driver.store
    lease = driver.lease("t")
    s.start_run("u")
    for call in (lambda: s.renew_many([lease], ttl), lambda: s.renew_each([lease], ttl),
                 lambda: driver.exchange(claim=ClaimRequest("w1", ttl))):  # fmt: skip
        with pytest.raises(InvalidOption):
            call()
    assert s.get_task(lease.task_id).lease_expires_at == lease.expires_at  # type: ignore[union-attr]
    assert s.stats().leased == 1 and s.fence_rejections() == []
