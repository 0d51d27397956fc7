"""The schedules' firer of a worker (``workerproc/ticker.py``) with a fake store: it fires what
is due, then sleeps until the earliest next tick (bounded by ``REFRESH``), never busy-polls
when a tick stays due, backs off after a failing database, and stops at once when closed; and
which workers of a pool run one (``Worker._start_schedules``)."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import wait_for

from workerproc import App
from workerproc.config import WorkerConfig
from workerproc.outage import Outage
from workerproc.status import StatusBoard
from workerproc.store import StoreUnavailable, open_store
from workerproc.store.schedules import Fired
from workerproc.ticker import MIN_WAIT, REFRESH, RETRY, Ticker
from workerproc.worker import Worker


class FakeStore:
    def __init__(self, due: float | None, now: float = 100.0) -> None:
        self.due, self.clock, self.fail = due, now, False
        self.fires = 0
        self.closed = threading.Event()

    def fire_schedules(self) -> list[Fired]:
        self.fires += 1
        if self.fail:
            raise StoreUnavailable("the database is gone")
        return [Fired("r", [self.clock], [self.fires], self.clock + 1)]

    def next_schedule_at(self) -> float | None:
        return self.due

    def now(self) -> float:
        return self.clock

    def close(self) -> None:
        self.closed.set()


def ticker(store: FakeStore) -> Ticker:
    return Ticker(lambda: store, Outage())  # type: ignore[arg-type, return-value]


def test_it_sleeps_until_the_next_tick_and_at_most_refresh() -> None:
    store = FakeStore(due=100.4)
    t = ticker(store)
    assert abs(t.step(store) - 0.4) < 1e-9  # type: ignore[arg-type]
    assert t.fired == 1
    store.due = 100.0 + 3600
    assert t.step(store) == REFRESH  # type: ignore[arg-type]
    store.due = None  # no schedule in the database: one cheap look every REFRESH
    assert t.step(store) == REFRESH  # type: ignore[arg-type]


def test_a_tick_still_due_is_looked_at_again_soon_not_at_once() -> None:
    store = FakeStore(due=99.0)  # another firer holds it, or more are due than one look takes
    assert ticker(store).step(store) == MIN_WAIT  # type: ignore[arg-type]


def test_a_failing_database_is_retried_after_a_pause() -> None:
    store = FakeStore(due=100.5)
    store.fail = True
    outage = Outage()
    t = Ticker(lambda: store, outage)  # type: ignore[arg-type, return-value]
    assert t.step(store) == RETRY  # type: ignore[arg-type]
    assert outage.since is not None  # told once per incident
    store.fail = False
    t.step(store)  # type: ignore[arg-type]
    assert outage.since is None


def test_a_schedule_it_cannot_read_is_told_once_and_looked_at_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore(due=100.5)
    t = ticker(store)

    def broken() -> list[Fired]:
        raise ValueError("Bad minute")  # what cronsim says of a hand-edited expression

    store.fire_schedules = broken  # type: ignore[method-assign]
    assert t.step(store) == t.step(store) == REFRESH  # type: ignore[arg-type]
    assert sum("cannot fire the schedules" in r.getMessage() for r in caplog.records) == 1


def test_the_thread_fires_on_its_own_store_and_stops_when_closed() -> None:
    store = FakeStore(due=None)
    t = ticker(store)
    t.start()
    deadline = time.monotonic() + 10
    while store.fires == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    t.close()  # it sleeps for REFRESH: the close wakes it
    assert time.monotonic() - began < 2 and store.closed.is_set() and store.fires == 1


@pytest.mark.parametrize(("index", "fires"), [(None, True), (0, True), (1, True), (2, False)])
def test_the_first_two_workers_of_a_pool_fire_and_every_worker_declares(
    db_path: str, index: int | None, fires: bool
) -> None:
    app = App()
    app.schedule("* * * * * *", task="tick", catch_up="all")
    app.task("tick")(lambda ctx: None)
    store = open_store(db_path)
    board = StatusBoard(4)
    worker = Worker(store, app, WorkerConfig(db=db_path, app="tests:app"), owner="w",
                    open_store=lambda: open_store(db_path),
                    slot=None if index is None else board.slot(index))  # fmt: skip
    try:
        worker._start_schedules()
        assert [s.name for s in store.schedules()] == ["tick"]  # declared either way
        assert (worker.ticker is not None) is fires
        if worker.ticker is not None:
            wait_for(lambda: store.list_runs(), timeout=10, what="a tick's run")
            run = store.list_runs()[0]
            assert (run.key or "").startswith("schedule:tick:") and run.task == "tick"
    finally:
        if worker.ticker is not None:
            worker.ticker.close()
        store.close()
