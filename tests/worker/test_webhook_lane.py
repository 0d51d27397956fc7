"""Deliveries never take the users' slots (docs/protocol.md B20): a worker's
webhook deliveries run on a lane of their own (``LANE`` threads beside ``--concurrency``, never
counted against it), claimed in the same transaction as the users' work by a claim of their
own, so a pool with receivers that never answer drains the users' runs as fast as one without.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sv_harness import Supervisor

from workerproc.config import WorkerConfig
from workerproc.delivery import LANE, on_lane
from workerproc.execution import Execution, Mode
from workerproc.holdings import Holdings
from workerproc.policy import LANE_LOOK, Policy, View
from workerproc.signals import Signals
from workerproc.store import ClaimRequest, Lease, Store, open_store
from workerproc.store.webhooks import DELIVERY_TASK, WEBHOOK_QUEUE

SECRET = "lane-secret"


# -- the store: one claim skips the webhooks' queue, another takes only it ----------------------
def test_a_claim_skips_a_queue_and_a_second_claim_takes_it_in_the_same_transaction(
    s: Store,
) -> None:
    s.add_webhook("h", "https://example.test/h", secret=SECRET)  # its delivery run: pending
    users = s.start_runs([{"task": "t"}, {"task": "t", "queue": "other"}])
    users_only = ClaimRequest("w", 30.0, limit=10, skip=(WEBHOOK_QUEUE,))
    leases = s.commit_many([], claim=users_only).leases
    assert sorted(lease.run_id for lease in leases) == sorted(users)
    assert all(lease.queue != WEBHOOK_QUEUE for lease in leases)
    # the named queues lose the skipped one too
    named = ClaimRequest("w2", 30.0, limit=10, queues=(WEBHOOK_QUEUE,), skip=(WEBHOOK_QUEUE,))
    assert s.commit_many([], claim=named).leases == ()
    more = s.start_run("t")
    lane = ClaimRequest("w3", 30.0, limit=1, queues=(WEBHOOK_QUEUE,))
    both = ClaimRequest("w3", 30.0, limit=5, skip=(WEBHOOK_QUEUE,), also=lane)
    first, second = s.commit_many([], claim=both).leases
    assert (first.run_id, second.task) == (more, DELIVERY_TASK), "the users', then the lane's"
    lane_only = ClaimRequest("w4", 30.0, limit=0, also=ClaimRequest("w4", 30.0, limit=1))
    assert s.commit_many([], claim=lane_only).leases == ()  # (everything is leased now)


# -- the policy: the lane is counted apart ---------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_lane_is_counted_apart_from_the_users_slots() -> None:
    clock = Clock()
    config = WorkerConfig(db="x.db", app="m:app", concurrency=1, prefetch=0)
    p = Policy(config, Signals(), clock=clock, lane=2)
    turn = p.turn(View())
    assert (turn.want, turn.lane, turn.talks_to_store) == (1, 2, True)
    # two deliveries running: the users' one slot is still free, and wanted
    turn = p.turn(View(running=0, lane=2))
    assert (turn.want, turn.lane) == (1, 0)
    # the users' slot busy, one lane slot free: the lane alone claims
    turn = p.turn(View(running=1, lane=1, youngest=clock.now))
    assert (turn.want, turn.claim, turn.lane, turn.talks_to_store) == (0, False, 1, True)
    p.lane_claimed(1, 0)  # nothing there: ask again only after LANE_LOOK (or a change)
    assert p.turn(View(running=1, lane=1, youngest=clock.now)).talks_to_store is False
    clock.now += LANE_LOOK
    assert p.turn(View(running=1, lane=1, youngest=clock.now)).lane == 1
    p.lane_claimed(1, 0)
    p.watched()  # something changed
    assert p.turn(View(running=1, lane=1, youngest=clock.now)).lane == 1
    assert not p.slow_behind(View(running=0, lane=2), clock.now + 10), "deliveries are no slots"
    p.drain(0)
    assert p.turn(View()).lane == 0, "a stopping worker claims no delivery"
    turn = p.turn(View(lane=1, lane_waiting=1))
    assert turn.hand_back, "nor keeps one it claimed and has not started: it goes back"
    none = Policy(config, Signals(), clock=clock)  # a worker that delivers no webhooks
    assert none.turn(View()).lane == 0


def test_an_idle_look_that_finds_nothing_due_keeps_the_lane_from_claiming() -> None:
    """R7: the idle worker's look at its poll interval covers the lane's queue too; nothing
    due, neither the slots nor the lane claim (its LANE_LOOK starts again from the look)."""
    clock = Clock()
    config = WorkerConfig(db="x.db", app="m:app", concurrency=1, prefetch=0)
    p = Policy(config, Signals(), clock=clock, lane=1)
    p.claimed(1, 0)
    p.lane_claimed(1, 0)
    clock.now += LANE_LOOK  # the poll interval passed: the lane's own look is due
    p.nothing_due()
    assert p.turn(View()).talks_to_store is False
    clock.now += LANE_LOOK  # busy elsewhere that long: the lane looks again on its own
    assert p.turn(View()).lane == 1
    p.watched()  # the look found something: both claim
    turn = p.turn(View())
    assert (turn.claim, turn.lane) == (True, 1)


def test_the_holdings_count_the_lane_apart_and_start_its_leases_first() -> None:
    def lease(task_id: int, queue: str) -> Lease:
        return Lease(task_id, task_id, "t", None, 1, "me", 0.0, 0.0, queue=queue)

    h = Holdings(on_lane)
    user, delivery = lease(1, "default"), lease(2, WEBHOOK_QUEUE)
    h.add_waiting([user, delivery])
    view = h.view(1, 0, None)
    assert (view.running, view.waiting, view.lane, view.lane_waiting) == (0, 1, 1, 1)
    with h.lock:
        assert h.startable(users=False, lane=True) is delivery
        assert h.startable(users=True, lane=False) is user
        assert h.startable(users=False, lane=False) is None
        h.take(delivery)
        h.begin(Execution(delivery, lambda ctx: None, Mode.LANE))
    view = h.view(1, 0, None)
    assert (view.running, view.waiting, view.lane, view.lane_waiting) == (0, 1, 1, 0)
    assert h.busy()
    ended = h.clear()[0]
    h.end(ended[0])  # an ending after QUIT took everything: the lane's count stays at 0
    assert h.lane == 0 and not h.running


def test_a_turn_without_a_delivery_waiting_looks_at_no_waiting_lease() -> None:
    """The lane's waiting leases are counted as they come and go: a start with no delivery
    waiting (or no slot free) asks ``on_lane`` nothing, where it used to scan every waiting
    lease at every start (most of a busy worker's Python time with dozens prefetched)."""
    asked: list[Lease] = []

    def counting(lease: Lease) -> bool:
        asked.append(lease)
        return on_lane(lease)

    def lease(task_id: int, queue: str = "default") -> Lease:
        return Lease(task_id, task_id, "t", None, 1, "me", 0.0, 0.0, queue=queue)

    h = Holdings(counting)
    users = [lease(k) for k in range(1, 41)]
    h.add_waiting(users)
    asked.clear()
    with h.lock:
        assert h.startable(users=False, lane=True) is None
        assert h.startable(users=False, lane=False) is None
    assert h.view(16, 0, None).lane_waiting == 0
    assert asked == []
    deliveries = [lease(100, WEBHOOK_QUEUE), lease(101, WEBHOOK_QUEUE)]
    h.add_waiting(deliveries)
    assert h.view(16, 0, None).lane_waiting == 2
    with h.lock:
        assert h.startable(users=False, lane=True) is deliveries[0]
        h.take(deliveries[0])
        h.take(users[0])
    assert h.view(16, 0, None).lane_waiting == 1
    assert h.drop_waiting(deliveries[1]) and h.view(16, 0, None).lane_waiting == 0
    h.add_waiting([lease(102, WEBHOOK_QUEUE)])
    assert h.find(lease(102, WEBHOOK_QUEUE)) == (None, True)
    assert h.view(16, 0, None).lane_waiting == 0
    h.add_waiting([lease(103, WEBHOOK_QUEUE)])
    h.take_waiting()
    assert h.view(16, 0, None).lane_waiting == 0


# -- a real pool: dead receivers cost the users nothing --------------------------------------------
@pytest.fixture
def silent() -> Iterator[list[str]]:
    """Three receivers that accept every connection and never answer."""
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    held: list[socket.socket] = []

    def take(server: socket.socket) -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # (closed: the test is over)
                return

    for server in servers:
        threading.Thread(target=take, args=(server,), daemon=True).start()
    yield [f"http://127.0.0.1:{server.getsockname()[1]}/hook" for server in servers]
    for server in servers:
        server.close()
    for conn in held:
        conn.close()


def _drain_seconds(tmp_path: Path, name: str, receivers: list[str], runs: int) -> float:
    """A one-worker pool (``-n 1``, the case where a delivery took the only slot): how long
    ``runs`` no-op runs enqueued at once take to succeed, once the pool is warm and every
    webhook's delivery is in flight (its POST held by a receiver that never answers)."""
    url = str(tmp_path / f"{name}.db")
    with open_store(url) as store:
        for i, receiver in enumerate(receivers):
            store.add_webhook(f"dead{i}", receiver, secret=SECRET)  # the default 10 s deadline
    sv = Supervisor(tmp_path, name)
    sv.db = url
    try:
        sv.start("--poll-interval", "0.2", app="apps.sv_app:app", n=1)
        with open_store(url) as store:
            store.start_run("noop")  # warm: the worker is up, the deliveries are woken
            _wait(lambda: store.stats().runs.get("succeeded", 0) == 1, 60.0, sv)
            if receivers:  # (at least one delivery holds a POST)
                _wait(lambda: store.stats().queues.get(WEBHOOK_QUEUE, _NONE).leased > 0, 30.0, sv)
            began = time.monotonic()
            store.start_runs([{"task": "noop"}] * runs)
            _wait(lambda: store.stats().runs.get("succeeded", 0) == runs + 1, 120.0, sv)
            took = time.monotonic() - began
            # the lane's own budget: at most LANE deliveries at once in a worker
            assert store.stats().queues.get(WEBHOOK_QUEUE, _NONE).leased <= LANE
            return took
    finally:
        sv.kill_all()


class _Nothing:
    leased = 0


_NONE = _Nothing()


def _wait(done: object, timeout: float, sv: Supervisor) -> None:
    end = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < end, sv.text()[-3000:]
        time.sleep(0.02)


@pytest.mark.slow
def test_dead_receivers_do_not_slow_the_users_runs(tmp_path: Path, silent: list[str]) -> None:
    """Three receivers that never answer; ``-n 1``; 5,000 no-op runs. Before: each delivery held
    the only slot for a POST timeout (10 s), so the runs waited behind them (as measured: 41 runs,
    33 s, against 1.3 s without). The bound: within 10 % of the same pool's time without them,
    or 1 s, whichever is larger (a loaded 2-core machine's scheduling noise on a run this
    short is about that)."""
    runs = 5000
    without = _drain_seconds(tmp_path, "none", [], runs)
    with_dead = _drain_seconds(tmp_path, "dead", silent, runs)
    allowed = max(without * 1.10, without + 1.0)
    print(f"\n{runs} no-op runs, -n 1: {without:.2f} s without webhooks, "
          f"{with_dead:.2f} s with three dead receivers (allowed {allowed:.2f} s)")  # fmt: skip
    assert with_dead <= allowed, (without, with_dead)
    assert math.isfinite(with_dead)
