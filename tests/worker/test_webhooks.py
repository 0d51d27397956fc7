"""Webhooks (docs/protocol.md B20) on every backend: declared in the database,
delivered by a leased delivery run to a real local receiver, signed, in order; a zombie's
delivery moves no cursor; failures back off and become dead letters; the waker signals a parked
delivery once. The chaos acceptance is in test_webhooks_chaos.py."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import FakeClock
from store_backends import Backend
from webhook_receiver import Receiver

from workerproc import App, TaskContext
from workerproc.config import WorkerConfig
from workerproc.context import LeaseLost
from workerproc.context import TaskContext as Context
from workerproc.courier import REFRESH, Courier
from workerproc.delivery import BATCH, PARK, Deliverer, backoff, body_of
from workerproc.outage import Outage
from workerproc.store import CasResult, InvalidOption, Store, open_store
from workerproc.store.protocol.events import KINDS
from workerproc.store.types import SYSTEM_RUNS
from workerproc.store.webhooks import (
    DELIVERY_TASK,
    MAX_DEAD,
    WEBHOOK_QUEUE,
    RetryNumbers,
    check_kinds,
)
from workerproc.window import WINDOW
from workerproc.worker import Worker

SECRET = "s3cret-for-tests"
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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.down()


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


# -- fenced ---------------------------------------------------------------------------------------
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
