"""A webhook delivery's window (docs/protocol.md B20): several POSTs in flight across runs,
each run's events one at a time in table order, the position moved to the contiguous
acknowledged event, a failing event holding its run's later events (other runs go on until the
window is full), at most ``WINDOW`` events open (what a fault re-sends). The bookkeeping alone
(``Window``), then whole deliveries on every backend."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from helpers import FakeClock
from webhook_receiver import Receiver

from workerproc.context import TaskContext as Context
from workerproc.delivery import Deliverer
from workerproc.store import Store
from workerproc.store.types import Event
from workerproc.store.webhooks import WEBHOOK_QUEUE, RetryNumbers
from workerproc.window import ACKED, FAILED, FLIGHT, PASSED, WAITING, WINDOW, Window

SECRET = "window-secret"
FAST = RetryNumbers(max_failures=5, backoff=0.01, backoff_max=0.02, timeout=5.0)


def ev(id_: int, run: int | None) -> Event:
    return Event(id=id_, at=0.0, run_id=run, kind="run.succeeded", task=None, attempt=None, data={})


def takes(event: Event) -> bool:
    return event.run_id is not None


def sendable(w: Window, now: float = 0.0) -> list[int]:
    out = []
    for slot in w.sendable(now):
        w.sent(slot)
        out.append(slot.event.id)
    return out


# -- the bookkeeping ---------------------------------------------------------------------------
def test_runs_interleave_and_each_runs_events_wait_for_its_previous_one() -> None:
    w = Window(position=0, size=8)
    w.add([ev(1, 10), ev(2, 20), ev(3, 10), ev(4, None), ev(5, 30), ev(6, 20)], takes)
    slots = {s.event.id: s for s in w._slots}
    assert sendable(w) == [1, 2, 5], "one event per run at a time, in table order"
    w.acked(slots[2])
    assert sendable(w) == [6], "run 20's next once its previous one was acknowledged"
    w.acked(slots[5])
    assert sendable(w) == [], "run 10's next waits for event 1"
    assert w.advance() == (0, 0), "nothing moves past event 1 while it is in flight"
    w.acked(slots[1])
    assert sendable(w) == [3]


def test_the_position_moves_to_the_contiguous_acknowledged_event() -> None:
    w = Window(position=100, size=8)
    w.add([ev(101, 1), ev(102, 2), ev(103, None), ev(104, 3), ev(105, 4)], takes)
    slots = {s.event.id: s for s in w._slots}
    assert sendable(w) == [101, 102, 104, 105]
    for late in (105, 104, 102):  # answers out of order: the gap at 101 holds the position
        w.acked(slots[late])
        assert w.advance() == (100, 0)
    w.acked(slots[101])
    assert w.advance() == (105, 4), "past them all, the passed-over 103 too, four POSTs counted"
    assert w.cursor() == 105 and len(w) == 0


def test_a_failing_event_holds_its_runs_later_events_and_the_window_then_stalls() -> None:
    w = Window(position=0, size=3)
    w.add([ev(1, 1), ev(2, 1), ev(3, 2), ev(4, 3), ev(5, 4), ev(6, 5)], takes)
    slots = {s.event.id: s for s in w._slots}
    assert sendable(w) == [1, 3, 4], "three open at most"
    w.failed(slots[1], due=5.0)
    assert sendable(w, now=1.0) == [], "full: events 1, 3, 4 are open"
    w.acked(slots[3])
    w.acked(slots[4])
    assert w.advance() == (0, 0), "acknowledged past the failure: not moved"
    assert sendable(w, now=1.0) == [], "still full: what a fault re-sends stays within 3"
    assert sendable(w, now=5.0) == [1], "the failed event again once its moment came (not 2)"
    w.acked(slots[1])
    assert w.advance() == (1, 1), "3 and 4 wait behind event 2, not sent yet"
    assert sendable(w, now=5.0) == [2], "its run's next; 3 and 4 still hold the window's room"
    w.acked(slots[2])
    assert w.advance() == (4, 3)
    assert sendable(w, now=5.0) == [5, 6]


def test_a_dead_letter_is_passed_by_the_cursor_not_by_the_position() -> None:
    w = Window(position=0, size=8)
    w.add([ev(1, 1), ev(2, 2), ev(3, 1)], takes, carry=2)
    slots = {s.event.id: s for s in w._slots}
    assert slots[1].failures == 2, "the first event wanted carries the committed failures"
    assert sendable(w) == [1, 2]
    w.dead(slots[1])
    w.acked(slots[2])
    assert w.advance() == (0, 0), "the row moves past a dead letter only once it is committed"
    assert w.cursor() == 2 and w.failures_after(2) == 0, "event 3 starts from none"


def expected_sendable(w: Window, now: float) -> list[int]:
    """The rule, written out plainly over every slot: the first unfinished event of each run,
    a failed one once due, a waiting one while fewer than ``size`` are open."""
    busy: set[int | None] = set()
    room = w.size - w._open
    out = []
    for slot in w._slots:
        if slot.status in (PASSED, ACKED) or slot.event.run_id in busy:
            continue
        busy.add(slot.event.run_id)
        if slot.status == FAILED and slot.due <= now:
            out.append(slot.event.id)
        elif slot.status == WAITING and room > 0:
            out.append(slot.event.id)
            room -= 1
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_look_that_ends_at_a_full_window_lets_the_same_events_go(seed: int) -> None:
    """``sendable`` stops looking once the window is full and no failed slot is left behind
    (it was a scan of the whole read batch after every round of answers): the same events go
    as by the rule over every slot, through random answers, failures and moves."""
    rng = random.Random(seed)
    w = Window(position=0, size=rng.choice((1, 3, 8)))
    next_id, now = 1, 0.0
    for _ in range(300):
        if len(w) < 40:
            batch = [ev(next_id + i, rng.choice((1, 2, 3, 4, 5, None))) for i in range(8)]
            w.add(batch, lambda e: e.run_id != 5)  # (run 5's: passed over)
            next_id += 8
        now += rng.random()
        want = expected_sendable(w, now)
        assert sendable(w, now) == want
        flying = [slot for slot in w._slots if slot.status == FLIGHT]
        for slot in rng.sample(flying, rng.randint(0, len(flying))):
            if rng.random() < 0.2:
                w.failed(slot, due=now + rng.random() * 2)
            else:
                w.acked(slot)
        w.advance()
        assert w.next_due() == min((s.due for s in w._slots if s.status == FAILED), default=None)
        assert w.waiting() == any(s.status in (WAITING, FAILED) for s in w._slots)


# -- whole deliveries, on every backend ----------------------------------------------------------
def finished_runs(s: Store, n: int) -> list[int]:
    """``n`` runs, each claimed and finished: events of several kinds each, interleaved."""
    runs = s.start_runs([{"task": "noop"}] * n)
    leases = s.claim("w", 30.0, limit=n, queues=["default"])
    assert isinstance(leases, list) and len(leases) == n
    for lease in leases:
        assert s.ack(lease)
    return runs


class Watching(Deliverer):
    """POSTs for real, each after a short pause that shuffles the answers, and records which
    events were in flight together."""

    def __init__(self, s: Store, last: int = 0, others: int = 0) -> None:
        super().__init__(lambda: s)
        self.lock = threading.Lock()
        self.flying: dict[int, int | None] = {}  # event id -> run
        self.most = 0
        self.overlap: list[tuple[int, int]] = []  # two events of one run in flight together
        self.ended: dict[int, float] = {}  # event id -> when its POST returned
        self.last, self.others = last, others  # an event answered after ``others`` others

    def _post(self, poster: Any, hook: Any, event: Any) -> str | None:
        with self.lock:
            self.overlap += [(event.id, e) for e, r in self.flying.items() if r == event.run_id]
            self.flying[event.id] = event.run_id
            self.most = max(self.most, len(self.flying))
        if event.id == self.last:  # answered once every other one was (or after 10 s)
            deadline = time.monotonic() + 10.0
            while len(self.ended) < self.others and time.monotonic() < deadline:
                time.sleep(0.01)
        time.sleep(0.002 * (event.id % 5))
        try:
            return super()._post(poster, hook, event)
        finally:
            with self.lock:
                del self.flying[event.id]
                self.ended[event.id] = time.monotonic()


def deliver(s: Store, deliverer: Deliverer, store: Any = None) -> Context:
    (lease,) = s.claim("d", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    ctx = Context(lease, threading.Event())
    deliverer.deliver(ctx, store or s)
    return ctx


@pytest.fixture(autouse=True)
def _budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # (one execution delivers for 1 s; on a loaded machine these may outlast it, and it then
    # advances instead of parking: what is tested here is one execution's window)
    monkeypatch.setattr("workerproc.delivery.BUDGET", 60.0)


def test_a_delivery_interleaves_runs_and_keeps_each_runs_order(s: Store) -> None:
    receiver = Receiver(SECRET)
    try:
        s.add_webhook("w", receiver.url, secret=SECRET, kinds=["run.*", "step.*"])
        runs = finished_runs(s, 12)
        table = [e for e in s.events(limit=1000)
                 if e.run_id in runs and e.kind.split(".")[0] in ("run", "step")]  # fmt: skip
        deliverer = Watching(s)
        ctx = deliver(s, deliverer)
        got = [d.event for d in receiver.all()]
    finally:
        receiver.down()
    assert sorted(e["id"] for e in got) == [e.id for e in table], "each event once"
    for run in runs:
        assert [e["id"] for e in got if e["run_id"] == run] == [
            e.id for e in table if e.run_id == run
        ], f"run {run}'s events in table order"
    assert deliverer.overlap == [], "never two events of one run in flight together"
    assert 1 < deliverer.most <= WINDOW, "several POSTs in flight, the window at most"
    assert ctx.commit is not None and ctx.commit.kind == "wait"
    (info,) = s.webhooks()
    assert info.delivered == len(table) and info.cursor == s.last_event_id()


class Recording:
    """A store that records each position its delivery moves to (and when)."""

    def __init__(self, s: Store) -> None:
        self._s = s
        self.moves: list[tuple[int, float]] = []

    def move_webhook(self, lease: Any, position: int, delivered: int = 0) -> bool:
        self.moves.append((position, time.monotonic()))
        return self._s.move_webhook(lease, position, delivered)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def test_the_position_never_passes_an_event_still_in_flight(s: Store) -> None:
    receiver = Receiver(SECRET)
    try:
        s.add_webhook("w", receiver.url, secret=SECRET, kinds=["run.succeeded"])
        finished_runs(s, 6)
        first = next(e.id for e in s.events(limit=100) if e.kind == "run.succeeded")
        deliverer = Watching(s, last=first, others=5)  # answered after the five others
        store = Recording(s)
        deliver(s, deliverer, store)
    finally:
        receiver.down()
    done = deliverer.ended[first]
    assert max(t for t in deliverer.ended.values()) == done, "the others were answered first"
    assert all(position < first for position, at in store.moves if at < done)
    assert store.moves[-1][0] == s.last_event_id()


def test_a_failing_event_holds_its_runs_later_events_while_other_runs_go_on(
    s: Store, clock: FakeClock
) -> None:
    receiver = Receiver(SECRET)
    try:
        kinds = ["run.enqueued", "run.succeeded"]
        s.add_webhook("w", receiver.url, secret=SECRET, kinds=kinds, retry=FAST)
        runs = finished_runs(s, 4)
        events = [e for e in s.events(limit=100) if e.kind in kinds]
        held = events[0]  # run 1's enqueued: refused twice, then taken
        tries: list[int] = []

        answered = threading.Event()  # another run's event was answered

        class Refusing(Deliverer):
            """Refuses the held event twice; its second refusal only once another run's event
            was answered (the window went on past it: else it is refused after 10 s)."""

            def _post(self, poster: Any, hook: Any, event: Any) -> str | None:
                if event.id == held.id and tries.count(held.id) < 2:
                    if tries.count(held.id) == 1:
                        answered.wait(10.0)
                    tries.append(event.id)
                    return "HTTP 503"
                tries.append(event.id)
                try:
                    return super()._post(poster, hook, event)
                finally:
                    if event.run_id != held.run_id:
                        answered.set()

        ctx = deliver(s, Refusing(lambda: s))
        got = [d.event["id"] for d in receiver.all()]
    finally:
        receiver.down()
    later = [e.id for e in events if e.run_id == held.run_id and e.id != held.id]
    assert tries.count(held.id) == 3 and got.index(held.id) < min(got.index(i) for i in later)
    last_try = max(n for n, t in enumerate(tries) if t == held.id)
    assert all(tries.index(i) > last_try for i in later), "its run's next only after it"
    others = [e.id for e in events if e.run_id != held.run_id]
    assert answered.is_set() and any(tries.index(i) < last_try for i in others), "others went on"
    assert sorted(got) == sorted(e.id for e in events) and runs
    assert ctx.commit is not None
    (info,) = s.webhooks()
    assert info.failures == 0 and info.delivered == len(events)


def test_events_a_commit_kept_as_acknowledged_are_not_sent_again() -> None:
    """An execution that ends (its budget spent, a long backoff) with events acknowledged behind
    one still unacknowledged commits them (``acked``): the next one sends only the gap."""
    w = Window(position=0, size=8)
    w.add([ev(1, 1), ev(2, 1), ev(3, 2), ev(4, 3)], takes)
    slots = {s.event.id: s for s in w._slots}
    assert sendable(w) == [1, 3, 4]
    w.acked(slots[1])
    w.acked(slots[4])
    assert w.advance() == (1, 1) and w.acked_after(w.cursor()) == [4], "3 is still in flight"
    nxt = Window(position=1, size=8)
    nxt.add([ev(2, 1), ev(3, 2), ev(4, 3)], takes, carry=0, done=frozenset({4}))
    assert sendable(nxt) == [2, 3], "event 4 is not sent again"
    for slot in list(nxt._slots)[:2]:
        nxt.acked(slot)
    assert nxt.advance() == (4, 3), "and is counted once the position passes it"


def test_a_webhooks_in_flight_bounds_the_posts_open_at_its_receiver(s: Store) -> None:
    """Each webhook's window is its own (``in_flight``): one at 1 never has two POSTs open at
    its receiver, one at 4 has several, delivered by one lane thread after the other (its
    senders sized to each webhook in turn)."""
    wide, narrow = Receiver(SECRET, hold=0.05), Receiver(SECRET, hold=0.05)
    try:
        for name, receiver, n in (("wide", wide, 4), ("narrow", narrow, 1)):
            s.add_webhook(name, receiver.url, secret=SECRET, kinds=["run.*"],
                          retry=RetryNumbers(in_flight=n))  # fmt: skip
        runs = finished_runs(s, 8)
        table = [e.id for e in s.events(limit=1000) if e.run_id in runs and e.kind[:4] == "run."]
        deliverer = Deliverer(lambda: s)
        for _ in range(2):
            deliver(s, deliverer)
    finally:
        wide.down()
        narrow.down()
    for receiver in (wide, narrow):
        assert sorted(d.event["id"] for d in receiver.all()) == table, "each event once"
    assert narrow.most == 1, "a window of 1: one POST at a time"
    assert 1 < wide.most <= 4, "a window of 4: several at once, 4 at most"
    assert {h.name: h.retry.in_flight for h in s.webhook_list()} == {"narrow": 1, "wide": 4}
