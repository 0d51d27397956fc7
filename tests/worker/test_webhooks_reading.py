"""Webhooks (docs/protocol.md B20), how the events are read, on every backend: a delivery reads
batch after batch and past the kinds it does not want and the system's own events, prune keeps
what a webhook has not delivered and the delivery run it names, and the waker keeps up while
idle and never holds up a stopping worker. The rest of the delivery is in test_webhooks.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers import FakeClock
from webhook_receiver import SECRET, Receiver

from workerproc.context import TaskContext as Context
from workerproc.courier import REFRESH, Courier
from workerproc.delivery import BATCH, PARK, Deliverer, body_of
from workerproc.outage import Outage
from workerproc.store import CasResult, Store, open_store
from workerproc.store.types import SYSTEM_RUNS
from workerproc.store.webhooks import WEBHOOK_QUEUE


def test_one_execution_reads_batch_after_batch_then_parks(
    s: Store, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (an execution's time budget is 1 s: 110 POSTs on a loaded machine may outlast it, and
    # the execution then advances instead of parking; what is tested here is the batches)
    monkeypatch.setattr("workerproc.delivery.BUDGET", 60.0)
    s.add_webhook("b", receiver.url, secret=SECRET, kinds=["run.enqueued"])
    runs = s.start_runs([{"task": "noop"}] * (BATCH + 10))
    (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    ctx = Context(lease, threading.Event())
    Deliverer(lambda: s).deliver(ctx, s)
    assert sorted(d.event["run_id"] for d in receiver.all()) == runs
    assert ctx.commit is not None and ctx.commit.kind == "wait"
    newest = s.last_event_id()  # (the delivery run's own claim: read past too)
    assert ctx.commit.new_state["cursor"] == newest  # type: ignore[index]
    (info,) = s.webhooks()  # moved with each POST: before the execution's commit is written
    assert (info.cursor, info.delivered, info.backlog) == (newest, len(runs), 0)
    assert body_of(s.events(limit=1)[0], "b").startswith(b'{"at":')


def test_prune_keeps_the_events_a_webhook_has_not_delivered(s: Store, clock: FakeClock) -> None:
    """A receiver down for a day must not lose the events it has not had to a prune."""
    hook = s.add_webhook("slow", "https://example.test/", secret=SECRET, after=0)
    s.start_runs([{"task": "noop"}] * 3)
    clock.advance(7200.0)
    s.prune(3600)
    assert len(s.events(limit=100)) == 3, "the webhook's position (0) holds every event back"
    (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    third = s.events(limit=100)[2].id
    assert s.move_webhook(lease, third)
    s.prune(3600)
    assert s.events(limit=1, system=True)[0].id > third, "up to its position: those went"
    s.remove_webhook("slow")
    clock.advance(7200.0)
    s.last_event_id()  # (PostgreSQL numbers the committed events when one is read, B18)
    s.prune(3600)
    assert len(s.events(limit=100, system=True)) == 1, "no webhook left: all but the newest went"
    assert hook.run_id >= SYSTEM_RUNS


def test_prune_keeps_the_delivery_run_a_webhook_names_so_it_can_be_retried(
    s: Store, clock: FakeClock, receiver: Receiver
) -> None:
    """A webhook whose delivery run was cancelled: prune deleted the run, and then the webhook
    (its position) held every event back from retention for ever, and the drain's advice,
    ``supervisor retry``, named a run that was gone. The run stays while its webhook does."""
    hook = s.add_webhook("cx", receiver.url, secret=SECRET, kinds=["run.enqueued"])
    assert s.cancel_run(hook.run_id)
    runs = s.start_runs([{"task": "noop"}] * 3)
    clock.advance(7200.0)
    s.prune(3600)
    run = s.get_run(hook.run_id)
    assert run is not None and run.status == "cancelled"
    (info,) = s.webhooks()
    assert (info.status, info.backlog) == ("cancelled", 3)
    assert s.retry_run(hook.run_id), "retryable: it delivers what it held back"
    (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    Deliverer(lambda: s).deliver(Context(lease, threading.Event()), s)
    assert sorted(d.event["run_id"] for d in receiver.all()) == runs
    s.remove_webhook("cx")  # (its run cancelled with it: nothing names it now)
    clock.advance(7200.0)
    s.prune(3600)
    assert s.get_run(hook.run_id) is None


def test_while_idle_the_position_and_the_wakers_looks_keep_up_with_the_systems_events(
    s: Store, clock: FakeClock, receiver: Receiver
) -> None:
    """While the users are idle, the delivery runs' own events (claims, parks, wakes) piled up
    after a webhook's position, which moved over the users' events only: every look of the
    waker and every delivery read past all of them again (18 ms a look at 500,000 on SQLite,
    64 ms on PostgreSQL), and prune could delete none of them. They are read past now, as the
    kinds a webhook does not want are, and never delivered."""
    s.add_webhook("idle", receiver.url, secret=SECRET)
    s.start_run("noop")
    users = s.last_event_id()
    starts: list[int] = []

    class Watched:
        """The store, with where each of the waker's reads of the events starts."""

        def __getattr__(self, name: str) -> Any:
            return getattr(s, name)

        def events(self, after: int = 0, limit: int = 500, **kw: Any) -> Any:
            starts.append(after)
            return s.events(after, limit, **kw)

    watched: Any = Watched()
    courier = Courier(lambda: watched, Outage())
    for _ in range(4):
        (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
        ctx = Context(lease, threading.Event())
        Deliverer(lambda: s).deliver(ctx, s)
        read = s.last_event_id()  # (all it could read: nobody else writes)
        assert ctx.commit is not None and ctx.commit.kind == "wait"
        (ok,) = s.commit_many([ctx.commit]).results
        assert ok is CasResult.OK
        assert s.webhooks()[0].cursor == read > users, "past its own events too"
        assert courier.step(watched) is not None and courier.step(watched) is not None
        assert starts[-1] == s.last_event_id(), "the waker's next look starts past them"
        clock.advance(PARK + 1)  # (parked: its wait times out, and it looks again)
    assert [d.event["run_id"] for d in receiver.all()] == [1], "the user's run.enqueued only"


@pytest.mark.parametrize("with_webhook", [False, True])
def test_the_waker_never_holds_up_a_stopping_worker(db_path: str, with_webhook: bool) -> None:
    """Its watch is five seconds long with no webhook parked, and was sat out whole by every
    worker's exit (a drain took seconds longer): it looks at the stop in short slices."""
    with open_store(db_path) as store:
        if with_webhook:
            store.add_webhook("w", "https://example.test/", secret=SECRET)
    courier = Courier(lambda: open_store(db_path), Outage())
    courier.start()
    time.sleep(0.5)  # (into its first watch)
    began = time.monotonic()
    courier.close()
    assert time.monotonic() - began < REFRESH / 2


def test_a_full_batch_of_unwanted_events_is_read_past_not_taken_for_the_end(
    s: Store, receiver: Receiver
) -> None:
    """A webhook on run.succeeded behind more than a batch of other events: one execution
    reads on to the end (it parked after each hundred, woken a second later each time)."""
    s.add_webhook("picky", receiver.url, secret=SECRET, kinds=["run.succeeded"])
    s.start_runs([{"task": "noop"}] * (2 * BATCH + 10))
    lease = s.claim("w", 30.0, queues=["default"])
    assert lease is not None and s.ack(lease)
    (mine,) = s.claim("d", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    ctx = Context(mine, threading.Event())
    Deliverer(lambda: s).deliver(ctx, s)
    assert [d.event["kind"] for d in receiver.all()] == ["run.succeeded"]
    assert ctx.commit is not None and ctx.commit.kind == "wait"
