"""Webhooks (docs/protocol.md B20) on every backend: declared in the database,
delivered by a leased delivery run to a real local receiver, signed, in order; failures back off
and become dead letters; the waker signals a parked delivery once. The fence (a zombie's
delivery moves no cursor) is in test_webhooks_fenced.py, how the events are read (batches,
prune, the waker) in test_webhooks_reading.py, the chaos acceptance in test_webhooks_chaos.py."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest
from store_backends import Backend
from webhook_receiver import SECRET, Receiver

from workerproc import App, TaskContext
from workerproc.config import WorkerConfig
from workerproc.delivery import Deliverer, backoff
from workerproc.store import InvalidOption, Store, open_store
from workerproc.store.protocol.events import KINDS
from workerproc.store.webhooks import (
    DELIVERY_TASK,
    MAX_DEAD,
    WEBHOOK_QUEUE,
    RetryNumbers,
    check_kinds,
)
from workerproc.window import WINDOW
from workerproc.worker import Worker

FAST = RetryNumbers(max_failures=3, backoff=0.01, backoff_max=0.05, timeout=5.0)

app = App()


@app.task
def noop(ctx: TaskContext) -> None:
    return None


class Until(Worker):
    """A worker in-process that stops (as TERM would) once ``done()`` holds."""

    done: Callable[[], bool] = staticmethod(lambda: True)

    def _wait(self, want: int) -> None:
        if self.done() and not self.holdings.running:
            self.signals.stop = signal.SIGTERM
            return
        super()._wait(want)


def run_until(url: str, done: Callable[[], bool], **kw: Any) -> None:
    config = WorkerConfig(db=url, app="tests:app", poll_interval=0.05, lease_ttl=30.0, **kw)
    w = Until(open_store(url), app, config, owner="host:1:1.00:w",
              open_store=lambda: open_store(url))  # fmt: skip
    w.done = done  # type: ignore[method-assign]
    assert w.run() == 0


# -- declared in the database ---------------------------------------------------------------------
def test_a_webhook_is_added_listed_and_removed_with_its_run(s: Store) -> None:
    run = s.start_run("noop")
    before = s.last_event_id()
    hook = s.add_webhook("billing", "https://example.test/h", secret=SECRET, kinds=["run.*"])
    assert hook.kinds == ("run.*",) and hook.wants("run.failed") and not hook.wants("step.claimed")
    (info,) = s.webhooks()
    assert (info.name, info.status, info.delivered, info.dead_total) == ("billing", "pending", 0, 0)
    assert info.cursor == before > 0, "a new webhook takes only the events from now on"
    assert "secret" not in info.as_json() and SECRET not in repr(info) + repr(hook)
    delivery = s.get_run(hook.run_id)
    assert delivery is not None
    assert (delivery.queue, delivery.task) == (WEBHOOK_QUEUE, DELIVERY_TASK)
    assert s.task_options()[DELIVERY_TASK].max_attempts == 1000
    with pytest.raises(InvalidOption, match="exists"):
        s.add_webhook("billing", "https://example.test/other", secret=SECRET)
    assert s.remove_webhook("billing") and not s.remove_webhook("billing")
    assert s.webhooks() == []
    gone = s.get_run(hook.run_id)
    assert gone is not None and gone.status == "cancelled"
    again = s.add_webhook("billing", "https://example.test/h", secret=SECRET, after=0)
    assert again.run_id not in (hook.run_id, run)
    assert s.webhooks()[0].cursor == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://example.test/"}, "http:// or https://"),
        ({"url": "https://user:pw@example.test/"}, "credentials"),
        ({"url": "https:///nohost"}, "with a host"),
        ({"url": "https://example.test:99999/"}, "cannot be parsed"),
        ({"url": "https://example.test/" + "a" * 2048}, "printable characters"),
        ({"name": "bad name"}, "name must be"),
        ({"secret": ""}, "secret must be"),
        ({"secret": "a\x00b"}, "printable"),
        ({"kinds": ["run.nope"]}, "unknown event kind"),
        ({"kinds": ["nope.*"]}, "unknown event kind"),
        ({"kinds": ["RUN FAILED"]}, "must look like"),
        ({"after": -1}, "after must be an event id"),
    ],
)
def test_bad_values_are_refused_before_anything_is_written(
    s: Store, kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"name": "h", "url": "https://example.test/", "secret": SECRET, **kwargs}
    with pytest.raises(InvalidOption, match=message):
        s.add_webhook(args.pop("name"), args.pop("url"), **args)
    assert s.webhooks() == [] and s.stats().runs == {}


def test_retry_numbers_have_ranges() -> None:
    bad_numbers: list[dict[str, Any]] = [
        {"max_failures": 0}, {"max_failures": 1001}, {"backoff": -1.0}, {"timeout": 0.0},
        {"backoff": 5.0, "backoff_max": 1.0}, {"max_failures": True}, {"in_flight": 0},
        {"in_flight": 65}, {"in_flight": 2.0}, {"in_flight": True},
    ]  # fmt: skip
    for bad in bad_numbers:
        with pytest.raises(InvalidOption):
            RetryNumbers(**bad)
    assert (RetryNumbers().in_flight, RetryNumbers(in_flight=1).in_flight) == (WINDOW, 1)
    assert RetryNumbers(in_flight=64).in_flight == 64
    assert check_kinds("run.failed, step.*", KINDS) == ("run.failed", "step.*")
    assert check_kinds([], KINDS) is None
    delays = [backoff(n, 1.0, 10.0) for n in range(1, 8)]
    assert 0.75 <= delays[0] <= 1.25 and all(d <= 10.0 for d in delays) and delays[-1] >= 7.5


# -- delivered ------------------------------------------------------------------------------------
def test_events_are_delivered_signed_in_order_and_the_delivery_parks(
    backend: Backend, receiver: Receiver
) -> None:
    with backend.open() as store:
        hook = store.add_webhook("all", receiver.url, secret=SECRET, kinds=["run.succeeded"])
        runs = [store.start_run("noop") for _ in range(5)]
    run_until(backend.url, lambda: len(receiver.accepted()) >= 5 and parked(backend.url))
    got = receiver.all()
    # (runs' events interleave in the window; each run's own keep their order: test_window.py)
    assert sorted(d.event["run_id"] for d in got) == runs, "every run's success, once"
    assert all(d.signed and d.accepted for d in got), "every signature verifies"
    # (the id is in the signed body only; no unsigned header a replay could change)
    assert all(d.event_header is None for d in got)
    assert {d.event["kind"] for d in got} == {"run.succeeded"}
    assert {d.event["webhook"] for d in got} == {"all"}
    with backend.open() as store:
        (info,) = store.webhooks()
        assert (info.status, info.delivered, info.failures) == ("waiting", 5, 0)
        assert info.last_error is None
        assert info.cursor >= max(d.event["id"] for d in got)
        # the waker signals a parked delivery once: a second wake finds it woken
        assert store.wake_webhook(hook.run_id) and not store.wake_webhook(hook.run_id)
        steps = len(store.get_tasks(hook.run_id))
    for _ in range(2):  # woken, it delivers nothing and parks again: woken anew
        run_until(backend.url, parked_again(backend.url, hook.run_id, steps))
        with backend.open() as store:
            steps = len(store.get_tasks(hook.run_id))
            assert store.wake_webhook(hook.run_id)
    with backend.open() as store:
        # each wake deleted the spent ones but the newest: two rows, however many wakes
        kept = store.run_signals(hook.run_id)
        assert len(kept) == 2 and kept[0].id > kept[1].id


def parked_again(url: str, run_id: int, steps: int) -> Callable[[], bool]:
    """Parked, after a step more than ``steps``: it ran since it was woken."""

    def done() -> bool:
        with open_store(url) as store:
            return len(store.get_tasks(run_id)) > steps and parked(url)

    return done


def parked(url: str) -> bool:
    with open_store(url) as store:
        return all(i.status == "waiting" for i in store.webhooks())


def test_the_delivery_runs_own_events_are_never_delivered(
    backend: Backend, receiver: Receiver
) -> None:
    with backend.open() as store:
        hook = store.add_webhook("all", receiver.url, secret=SECRET, after=0)
        store.start_run("noop")
    run_until(backend.url, lambda: parked(backend.url) and len(receiver.accepted()) >= 4)
    got = [d.event for d in receiver.all()]
    assert hook.run_id not in {e["run_id"] for e in got}
    assert DELIVERY_TASK not in {e["task"] for e in got}
    kinds = [e["kind"] for e in got]
    assert kinds == ["run.enqueued", "step.claimed", "step.committed", "run.succeeded"], kinds


def test_a_failing_receiver_is_retried_with_backoff_then_dead_lettered(
    db_path: str, receiver: Receiver
) -> None:
    receiver.fail_share = 1.0
    with open_store(db_path) as store:
        store.add_webhook("flaky", receiver.url, secret=SECRET, kinds=["run.succeeded"], retry=FAST)
        run = store.start_run("noop")

    def dead() -> bool:
        with open_store(db_path) as store:
            return store.webhooks()[0].dead_total == 1 and parked(db_path)

    run_until(db_path, dead)
    tries = receiver.all()
    assert len(tries) == FAST.max_failures and not any(d.accepted for d in tries)
    assert {d.event["run_id"] for d in tries} == {run} and all(d.signed for d in tries)
    with open_store(db_path) as store:
        (info,) = store.webhooks()
        (letter,) = info.dead
        assert (letter.event, letter.run_id, letter.kind, letter.error) == (
            tries[0].event["id"],
            run,
            "run.succeeded",
            "HTTP 503",
        )
        assert info.failures == 0 and info.cursor >= letter.event
        assert info.last_error == f"event {letter.event}: HTTP 503"
        # the next event is delivered normally once the receiver is back
        receiver.fail_share = 0.0
        store.start_run("noop")
    run_until(db_path, lambda: len(receiver.accepted()) == 1 and parked(db_path))


def test_a_receiver_that_is_down_is_retried_until_it_is_back(
    db_path: str, receiver: Receiver
) -> None:
    url = receiver.url
    receiver.down()
    # a backoff above INLINE_RETRY: each failure is committed, and tried again by a new task
    retry = RetryNumbers(max_failures=1000, backoff=1.5, backoff_max=1.5, timeout=2.0)
    with open_store(db_path) as store:
        store.add_webhook("down", url, secret=SECRET, kinds=["run.succeeded"], retry=retry)
        store.start_run("noop")

    def failing() -> bool:
        with open_store(db_path) as store:
            return store.webhooks()[0].failures >= 2

    run_until(db_path, failing)
    with open_store(db_path) as store:
        assert "ConnectError" in (store.webhooks()[0].last_error or "")
    receiver.up()
    run_until(db_path, lambda: len(receiver.accepted()) == 1 and parked(db_path))


def test_dead_letters_keep_the_newest(db_path: str) -> None:
    state: dict[str, Any] = {}
    hook = type("H", (), {"name": "h", "retry": FAST})()
    event = type("E", (), {"id": 0, "run_id": 1, "kind": "run.failed"})
    for i in range(MAX_DEAD + 5):
        Deliverer._dead(state, hook, event(), f"e{i}")  # type: ignore[arg-type]
    assert state["dead_total"] == MAX_DEAD + 5 and len(state["dead"]) == MAX_DEAD
    assert state["dead"][-1]["error"] == f"e{MAX_DEAD + 4}"
