"""Webhooks (B20): ``webhook``, ``webhook_list``, ``webhooks``, ``wake_webhook``,
``move_webhook``: the position moves under the delivery lease's fence (a zombie's move is
refused and recorded as ``webhook_move``), a parked delivery is woken once."""

from __future__ import annotations

import pytest

from workerproc.store import CasResult, ClaimRequest, Commit, Lease, RunNotFound
from workerproc.store.errors import InvalidOption
from workerproc.store.webhooks import IN_FLIGHT, WEBHOOK_QUEUE, RetryNumbers

from .kit import Driver, verb

SECRET = "s3cret-for-the-conformance-suite"
URL = "https://example.test/hook?token=abc"


def delivery(driver: Driver, owner: str = "w1", ttl: float = 30.0) -> Lease:
    (lease,) = driver.exchange(claim=ClaimRequest(owner, ttl, queues=(WEBHOOK_QUEUE,))).leases
    return lease


@verb("webhook", "webhook_list", "webhooks")
def test_a_webhook_is_read_with_its_secret_and_listed_without_it(driver: Driver) -> None:
    s = driver.store
    assert s.webhooks() == [] and s.webhook_list() == [] and s.webhook("h") is None
    s.start_run("t")
    newest = s.last_event_id()
    hook = s.add_webhook("h", URL, secret=SECRET, kinds=["run.*"])
    assert s.webhook("h") == hook and s.webhook_list() == [hook]
    assert (hook.secret, hook.kinds, hook.position) == (SECRET, ("run.*",), newest)
    (info,) = s.webhooks()
    assert (info.name, info.status, info.cursor, info.delivered) == ("h", "pending", hook.position,
                                                                      0)  # fmt: skip
    assert SECRET not in repr(info) and "abc" not in info.url
    s.start_run("u")
    assert s.webhooks()[0].backlog == 1  # run.enqueued: a kind it wants


@verb("webhook", "webhook_list", "webhooks")
def test_a_webhooks_window_is_stored_with_it(driver: Driver) -> None:
    """Its ``in_flight`` (1 to 64; 8 unless it says) reads back as it was added, everywhere."""
    s = driver.store
    for name, n in (("one", 1), ("most", 64)):
        s.add_webhook(name, URL, secret=SECRET, retry=RetryNumbers(max_failures=3, in_flight=n))
    s.add_webhook("plain", URL, secret=SECRET)
    want = {"one": 1, "most": 64, "plain": IN_FLIGHT}
    assert {h.name: h.retry.in_flight for h in s.webhook_list()} == want
    assert {i.name: (i.retry.in_flight, i.as_json()["window"]) for i in s.webhooks()} == {
        name: (n, n) for name, n in want.items()
    }
    one = s.webhook("one")
    assert one is not None and (one.retry.in_flight, one.retry.max_failures) == (1, 3)
    assert IN_FLIGHT == 8


@verb("webhook")
def test_webhook_refuses_a_bad_name(driver: Driver) -> None:
    with pytest.raises(InvalidOption):
        driver.store.webhook("bad name")


@verb("move_webhook")
def test_the_holder_moves_the_position_never_back(driver: Driver) -> None:
    s = driver.store
    s.add_webhook("h", URL, secret=SECRET, after=0)
    s.start_run("t")
    top = s.last_event_id()
    lease = delivery(driver)
    assert s.move_webhook(lease, top, delivered=1)
    hook = s.webhook("h")
    assert hook is not None and (hook.position, hook.delivered) == (top, 1)
    s.move_webhook(lease, 0, delivered=5)  # never back, and the count only with the position
    hook = s.webhook("h")
    assert hook is not None and (hook.position, hook.delivered) == (top, 1)
    with pytest.raises(InvalidOption):
        s.move_webhook(lease, -1)


@verb("move_webhook")
def test_a_zombie_delivery_moves_nothing_and_is_recorded(driver: Driver) -> None:
    s = driver.store
    s.add_webhook("h", URL, secret=SECRET, after=0)
    zombie = delivery(driver, "zombie", 10)
    driver.clock.advance(11)
    successor = delivery(driver, "w2", 10)
    assert successor.attempt == zombie.attempt + 1
    assert s.move_webhook(zombie, s.last_event_id()) is False
    assert s.webhook("h").position == 0  # type: ignore[union-attr]
    (refusal,) = s.fence_rejections()
    assert (refusal.op, refusal.owner, refusal.attempt) == ("webhook_move", "zombie", 1)
    assert s.move_webhook(successor, s.last_event_id())


@verb("move_webhook")
def test_a_removed_webhooks_delivery_moves_nothing_and_records_no_refusal(driver: Driver) -> None:
    s = driver.store
    s.add_webhook("h", URL, secret=SECRET, after=0)
    lease = delivery(driver)
    assert s.remove_webhook("h")
    assert s.move_webhook(lease, s.last_event_id()) is False
    assert s.fence_rejections() == []


@verb("wake_webhook")
def test_a_parked_delivery_is_woken_once(driver: Driver) -> None:
    s = driver.store
    hook = s.add_webhook("h", URL, secret=SECRET)
    assert s.wake_webhook(hook.run_id) is False  # not parked
    lease = delivery(driver)
    park = Commit(lease, "wait", next_task=lease.task, next_payload=lease.payload, delay=3600.0,
                  wait_for="signal:events")  # fmt: skip
    assert driver.commit(park) is CasResult.OK
    assert s.webhooks()[0].status == "waiting"
    assert s.wake_webhook(hook.run_id) is True and s.wake_webhook(hook.run_id) is False
    assert delivery(driver, "w2").signal is not None


@verb("wake_webhook")
def test_wake_webhook_of_an_unknown_or_user_run(driver: Driver) -> None:
    s = driver.store
    assert s.wake_webhook(424242) is False
    assert s.wake_webhook(s.start_run("t")) is False
    with pytest.raises(RunNotFound):
        s.wake_webhook("1")  # type: ignore[arg-type]
