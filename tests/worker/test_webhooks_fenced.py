"""Webhooks (docs/protocol.md B20), the delivery's fence, on every backend: each acknowledged
POST moves the position under the lease's fence, so a zombie's delivery moves nothing and its
successor delivers again; failures a lost commit left in the run's state are not charged to the
next event; a delivery woken past its ttl sends nothing more. The rest of the delivery is in
test_webhooks.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers import FakeClock
from webhook_receiver import SECRET, Receiver

from workerproc.context import LeaseLost
from workerproc.context import TaskContext as Context
from workerproc.delivery import Deliverer
from workerproc.store import CasResult, Store
from workerproc.store.webhooks import WEBHOOK_QUEUE, RetryNumbers


def test_a_zombie_delivery_moves_no_cursor_and_its_successor_delivers_again(
    s: Store, clock: FakeClock, receiver: Receiver
) -> None:
    """Each acknowledged POST moves the position under the lease's fence: a delivery paused past
    its lease between a POST and its move (a zombie) moves nothing, stops at the refusal and
    commits nothing; its successor delivers that event again (at least once) and moves it."""
    kinds = ["run.enqueued", "run.succeeded"]  # two events of one run: one POST after the other
    hook = s.add_webhook("z", receiver.url, secret=SECRET, kinds=kinds)
    s.start_run("noop")
    lease = s.claim("worker-a", 30.0, queues=["default"])
    assert lease is not None and s.ack(lease)
    first, second = (e.id for e in s.events(limit=100) if e.kind in kinds)
    successor: list[Context] = []
    reached: list[int] = []  # where the successor left the position

    def execute(owner: str, deliverer: Deliverer) -> Context:
        (got,) = s.claim(owner, 10.0, limit=1, queues=[WEBHOOK_QUEUE])
        ctx = Context(got, threading.Event())
        deliverer.deliver(ctx, s)
        return ctx

    class Pausing(Deliverer):
        """POSTs the second event, then pauses past its lease before it moves the position:
        meanwhile another worker takes the delivery over and delivers."""

        def _post(self, client: Any, hook: Any, event: Any) -> str | None:
            error = super()._post(client, hook, event)
            if event.id == second and not successor:
                assert first <= s.webhooks()[0].cursor < second, "the first POST moved it at once"
                clock.advance(11.0)
                successor.append(execute("worker-b", Deliverer(lambda: s)))
                reached.append(s.webhooks()[0].cursor)
            return error

    zombie = Context(s.claim("worker-a", 10.0, limit=1, queues=[WEBHOOK_QUEUE])[0],
                     threading.Event())  # fmt: skip
    with pytest.raises(LeaseLost):
        Pausing(lambda: s).deliver(zombie, s)
    assert zombie.commit is None, "the zombie stopped at the refusal: nothing to commit"
    (taker,) = successor
    assert taker.attempt == zombie.attempt + 1
    got = [d.event["id"] for d in receiver.all()]
    assert got == [first, second, second], "the one in flight twice (at least once), no more"
    (info,) = s.webhooks()
    assert reached[0] > second, "past the event, and the system's events after it"
    assert (info.cursor, info.delivered) == (reached[0], 2), "the zombie's move changed nothing"
    assert [r.op for r in s.fence_rejections()] == ["webhook_move"]
    assert taker.commit is not None
    (ok,) = s.commit_many([taker.commit]).results
    assert ok is CasResult.OK
    assert s.webhooks()[0].cursor == reached[0] and info.run_id == hook.run_id


def test_failures_left_in_the_state_by_a_lost_commit_are_not_charged_to_the_next_event(
    s: Store, clock: FakeClock, receiver: Receiver
) -> None:
    """An execution delivers the event that was failing (the position moves past it at once),
    fails on the next one and dies before its commit: the run's state still holds the first
    event's three failures. Its successor counts the next event's from nought: its first
    failure is the first (the first backoff), and it gives up only after ``max_failures``
    POSTs of its own (it gave up after one: "after 4 failures")."""
    retry = RetryNumbers(max_failures=4, backoff=5.0, backoff_max=20.0, timeout=5.0)
    kinds = ["run.enqueued", "run.succeeded"]  # two events of one run: one POST after the other
    s.add_webhook("h", receiver.url, secret=SECRET, kinds=kinds, retry=retry)
    s.start_run("noop")
    lease = s.claim("worker", 30.0, queues=["default"])
    assert lease is not None and s.ack(lease)
    first, second = (e.id for e in s.events(limit=100) if e.kind in kinds)

    def execute(owner: str, deliverer: Deliverer | None = None, commit: bool = True) -> None:
        clock.advance(25.0)  # (past the last one's lease and backoff: the next try is due)
        (lease,) = s.claim(owner, 10.0, limit=1, queues=[WEBHOOK_QUEUE])
        ctx = Context(lease, threading.Event())
        (deliverer or Deliverer(lambda: s)).deliver(ctx, s)
        if commit:
            assert ctx.commit is not None
            (ok,) = s.commit_many([ctx.commit]).results
            assert ok is CasResult.OK

    receiver.fail_share = 1.0
    for _ in range(3):
        execute("w")
    assert s.webhooks()[0].failures == 3

    class Dying(Deliverer):
        """Its first POST is taken; every one after it fails (then it dies, uncommitted)."""

        def _post(self, client: Any, hook: Any, event: Any) -> str | None:
            error = super()._post(client, hook, event)
            receiver.fail_share = 1.0
            return error

    receiver.fail_share = 0.0
    execute("dying", Dying(lambda: s), commit=False)
    (info,) = s.webhooks()
    posts = [d.event["id"] for d in receiver.all()]
    assert posts == [first] * 4 + [second] and info.failures == 0
    execute("successor")
    (info,) = s.webhooks()
    assert (info.failures, info.dead_total) == (1, 0), "its first failure, not its fourth"
    assert info.next_try_at is not None and info.next_try_at - s.now() <= 5.0 * 1.25
    while not s.webhooks()[0].dead_total:
        execute("successor")
    posts = [d.event["id"] for d in receiver.all()]
    assert posts == [first] * 4 + [second] * 5, "the dying one's POST, then max_failures"
    assert s.webhooks()[0].dead[0].event == second


def test_a_delivery_woken_past_its_ttl_sends_nothing_more(s: Store, receiver: Receiver) -> None:
    """Its lease last confirmed longer than a ttl ago (a pause, by the local clock): no POST
    (its successor may be sending that event now); its commit says whether the lease held."""
    s.add_webhook("p", receiver.url, secret=SECRET, kinds=["run.enqueued"])
    s.start_run("noop")
    (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    ctx = Context(lease, threading.Event())
    ctx.latest = lambda: time.monotonic() - 31.0  # (the heartbeat's last renewal: 31 s ago)
    Deliverer(lambda: s).deliver(ctx, s)
    assert receiver.all() == []
    assert ctx.commit is not None and ctx.commit.kind == "advance"
    ctx = Context(lease, threading.Event())  # the same lease, renewed just now: it delivers
    ctx.latest = time.monotonic
    Deliverer(lambda: s).deliver(ctx, s)
    assert len(receiver.all()) == 1
