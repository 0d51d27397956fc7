"""An idle worker's threads sleep on what can wake them, never on a short timer: the heartbeat
and the overdue watch, with nothing held, until the next presence beat (the first lease tracked
wakes both at once); the webhooks' waker, with a parked webhook, on the store's change watch
and its stop pipe (it woke every 0.1 s to look at its stop), and it looks again only when an
event committed (``events_mark``; it looked every second, on PostgreSQL with a write to number
the events). Counted, not timed: the waits each thread asks for, and what the waker reads in a
window with no commit."""

from __future__ import annotations

import threading
import time
from typing import Any

from helpers import reports, wait_for
from store_backends import Backend
from webhook_receiver import SECRET, Receiver

from workerproc.courier import QUIET, Courier
from workerproc.heartbeat import Heartbeat
from workerproc.outage import Outage
from workerproc.overdue import IDLE_WAIT, MAX_WAIT
from workerproc.store import Lease, Renewal

LEASE = Lease(1, 1, "t", None, 1, "me", 0.0, 0.0)


class Recording(threading.Condition):
    """A condition that records each wait's timeout, by the waiting thread's name."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[str, float | None]] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append((threading.current_thread().name, timeout))
        return super().wait(timeout)

    def of(self, name: str) -> list[float | None]:
        return [t for who, t in list(self.waits) if who == name]


class Renewals:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def renew_each(self, leases: list[Lease], ttl: float, *, starting: Any = ()) -> list[Renewal]:
        self.calls.append(time.monotonic())
        return [Renewal(time.time() + ttl) for _ in leases]

    def close(self) -> None:
        pass


def test_an_idle_heartbeat_sleeps_without_a_tick_and_the_first_lease_wakes_it() -> None:
    store = Renewals()
    lost: list[str] = []
    hb = Heartbeat(lambda: store, ttl=10.0, interval=0.2,
                   post=reports(on_lost=lambda lease, why: lost.append(why)))  # fmt: skip
    cond = Recording()
    hb._cond = hb._watch._cond = cond  # (before start: both threads wait on this one)
    hb.start()
    try:
        wait_for(lambda: cond.of("heartbeat") and cond.of("overdue-watch"), timeout=30,
                 what="both threads asleep")  # fmt: skip
        idle = cond.of("heartbeat") + cond.of("overdue-watch")
        # ticking, they waited idle_wait (0.1 s here) and MAX_WAIT (1 s) and looked again
        assert all(t is not None and t >= IDLE_WAIT - 1 for t in idle), idle
        before = len(cond.waits)
        tracked = time.monotonic()
        hb.track(LEASE, tracked)
        # woken at once: the watch now looks at the lease, the heartbeat renews it on time
        # (its first renewal is due an interval after the claim, not a 30 s sleep later)
        wait_for(lambda: any(t is not None and t <= MAX_WAIT
                             for _, t in cond.waits[before:]), timeout=30)  # fmt: skip
        renewed = wait_for(lambda: store.calls and store.calls[0], timeout=30, what="a renewal")
        assert renewed - tracked < IDLE_WAIT / 2
        assert not lost
    finally:
        hb.close()


class Counting:
    """A store whose change-token reads are counted (everything else passes through)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.reads = 0
        self.looks = 0
        self.marks = 0  # reads of the events' mark

    def events(self, *args: Any, **kw: Any) -> Any:
        self.looks += 1
        return self.store.events(*args, **kw)

    def events_mark(self) -> int:
        self.marks += 1
        return int(self.store.events_mark())

    def change_token(self) -> int:
        self.reads += 1
        return int(self.store.change_token())

    def wait_change(self, token: int, timeout: float) -> int:
        self.reads += 1
        return int(self.store.wait_change(token, timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_parked_webhooks_waker_sleeps_on_the_change_watch_and_wakes_for_a_commit(
    backend: Backend, receiver: Receiver
) -> None:
    from test_webhooks import parked, run_until  # noqa: PLC0415 - the webhook tests' helpers

    with backend.open() as store:
        store.add_webhook("idle", receiver.url, secret=SECRET)
    run_until(backend.url, lambda: parked(backend.url))  # delivered all there is: parked
    counting = Counting(backend.open())
    courier = Courier(lambda: counting, Outage())
    courier.start()
    try:
        wait_for(lambda: counting.looks, timeout=30, what="the waker's first look")
        counting.reads = counting.looks = 0
        window = 2.5
        time.sleep(window)  # (no commit meanwhile: what it reads now is its timer's doing)
        # a mark every WATCH (1 s) and a token every WATCHED_CHECK (0.5 s) while it watches:
        # about 3 a second; in 0.1 s slices it read about 11 a second, and it looked (read the
        # events) every second; now only after a commit, or REFRESH (5 s) after its last look
        assert counting.reads <= 5 * window, counting.reads
        assert counting.looks == 0, counting.looks
        with backend.open() as store:
            store.start_run("noop")  # run.enqueued: an event the parked webhook wants
        wait_for(lambda: courier.woken >= 1, timeout=30, what="the parked webhook woken")
    finally:
        courier.close()


def test_a_quiet_waker_reads_the_mark_less_and_less_and_an_unnotified_event_still_wakes(
    backend: Backend, receiver: Receiver
) -> None:
    """With nothing committing, the waker neither looks nor reads the events' mark every
    second: on SQLite (every commit moves the change token) it reads nothing while the token
    stands still; on PostgreSQL (an event's commit notifies nobody) it reads the mark after
    1, 2, 4, 4 ... seconds. It read the mark every second and looked every 5 s on both. An
    event that commits with no notification after that quiet spell (a claimed run's end) still
    wakes its webhook (within ``QUIET`` seconds on PostgreSQL: not timed here)."""
    from test_webhooks import parked, run_until  # noqa: PLC0415 - the webhook tests' helpers

    with backend.open() as store:
        store.add_webhook("ends", receiver.url, secret=SECRET, kinds=["run.succeeded"])
        run_id = store.start_run("noop")
        (lease,) = store.claim("elsewhere", 300.0, limit=1, queues=["default"])
    run_until(backend.url, lambda: parked(backend.url))  # (it takes no run.enqueued: parked)
    counting = Counting(backend.open())
    courier = Courier(lambda: counting, Outage())
    courier.start()
    try:
        wait_for(lambda: counting.looks, timeout=30, what="the waker's first look")
        time.sleep(0.5)  # (its first watch began)
        counting.marks = counting.looks = 0
        window = 8.0
        time.sleep(window)  # nothing commits meanwhile
        if backend.name != "pgbouncer":  # (its token polls the server's snapshot, which
            # any transaction on the server moves: the mark is read when it moves)
            quiet_marks = 0 if backend.name == "sqlite" else 4  # (after 1 + 2 + 4 + ... s)
            assert counting.marks <= quiet_marks, counting.marks
            assert counting.looks == 0, counting.looks
        with backend.open() as store:
            assert store.get_run(run_id) is not None and store.ack(lease)  # (no NOTIFY)
        wait_for(lambda: courier.woken >= 1, timeout=30 + QUIET, what="the webhook woken")
    finally:
        courier.close()
