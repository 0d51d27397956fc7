"""--drain ends when its last run commits, not at its next periodic look: on SQLite the loop
sleeps on the database's inotify watch, and a commit wakes it for a quick look. Without a watch
(PostgreSQL) the drain looks every ``drain_check`` as before."""

from __future__ import annotations

import dataclasses
import time

from helpers import FakeClock
from supervisor_fakes import FakeProcs, make_arbiter

from supervisor.loop.arbiter import Arbiter
from supervisor.loop.report import (
    DRAIN_SOONEST,
    _drain_look,
    stop_when_drained,
    unwatch_drain,
    watch_drain,
)
from supervisor.loop.storegate import StoreGate
from workerproc.store import open_store, watch_file
from workerproc.store.dialect import SETTLE

LONG = 60.0  # a drain_check no test waits for


def drain_arbiter(db: str, drain_check: float) -> Arbiter:
    arb = make_arbiter(FakeClock(), FakeProcs(), drain=True)
    arb.config = dataclasses.replace(
        arb.config,
        worker=dataclasses.replace(arb.config.worker, db=db),
        timing=dataclasses.replace(arb.config.timing, drain_check=drain_check),
    )
    arb.gate = StoreGate(db)
    arb.app.task("t")(lambda ctx: None)  # a task the pool serves: the drain waits for its run
    arb.clock = time.monotonic
    return arb


def test_the_last_commit_wakes_the_drain_which_ends_at_once(db: str) -> None:
    store = open_store(db)
    run_id = store.start_run("t", {})
    arb = drain_arbiter(db, LONG if watch_file(db) is not None else 0.05)
    try:
        close_in_child = watch_drain(arb)
        stop_when_drained(arb)  # the first look: the run is left
        assert not arb.stopping
        store.cancel_run(run_id)  # its last commit
        deadline = time.monotonic() + 10.0
        while not arb.stopping and time.monotonic() < deadline:
            arb.inbox.wait(max(0.0, min(arb._wake_at, deadline) - time.monotonic()))
            arb._wake_at = time.monotonic() + LONG
            stop_when_drained(arb)
        assert arb.stopping, "the drain did not see its last commit"
        stop_when_drained(arb)  # stopping: the watch wakes the loop no more
        assert arb.drain_watch is None and arb.inbox.extra_fds == set()
        close_in_child()  # (the parent no longer holds one: closes nothing)
    finally:
        store.close()
        unwatch_drain(arb)
        arb.gate.close_kept()
        arb.inbox.close()


def test_a_last_commit_just_after_a_quick_look_is_seen_within_drain_soonest(db_path: str) -> None:
    """A one-run drain commits twice in a few milliseconds (the claim, then the finish): the
    first commit's quick look finds the run left, and the loop sleeps at most DRAIN_SOONEST
    before it looks again after the second (it slept up to 25 ms: a tenth of a one-run drain)."""
    store = open_store(db_path)
    first, last = store.start_run("t", {}), store.start_run("t", {})
    arb = drain_arbiter(db_path, LONG)
    try:
        watch_drain(arb)
        stop_when_drained(arb)  # the first, full look: runs are left
        store.cancel_run(first)  # a commit: the quick look finds the other run left
        waits: list[float] = []  # what the loop asked to sleep after the last commit
        deadline = time.monotonic() + 10.0
        while not arb.stopping and time.monotonic() < deadline:
            arb.inbox.wait(max(0.0, min(arb._wake_at, deadline) - time.monotonic()))
            arb._wake_at = time.monotonic() + LONG
            stop_when_drained(arb)
            if waits:
                waits.append(arb._wake_at - time.monotonic())
            elif arb.last_run.get("drain-soon") is not None:
                store.cancel_run(last)  # the last commit, right after that quick look
                waits.append(0.0)
        assert arb.stopping, "the drain did not see its last commit"
        assert max(waits[:-1]) <= DRAIN_SOONEST, waits
    finally:
        store.close()
        unwatch_drain(arb)
        arb.gate.close_kept()
        arb.inbox.close()


class OneWrite:
    """A watch that saw one write, then none."""

    def __init__(self) -> None:
        self.writes = 1

    def drain(self) -> bool:
        seen, self.writes = bool(self.writes), 0
        return seen

    def fileno(self) -> int:
        return -1


def test_after_a_write_the_quick_looks_go_on_while_the_commit_settles() -> None:
    """The watch sees the write-ahead log written, not the commit marked done: a look at once
    may find the run still left, and no later write would announce the commit. So the quick
    looks go on every DRAIN_SOONEST for SETTLE after the write, then stop."""
    clock = FakeClock()
    arb = make_arbiter(clock, FakeProcs(), drain=True)
    arb.config = dataclasses.replace(
        arb.config, timing=dataclasses.replace(arb.config.timing, drain_check=LONG)
    )
    try:
        assert _drain_look(arb) == "full"  # (the first look)
        arb.drain_watch = OneWrite()  # type: ignore[assignment]
        looks = []
        for _ in range(round(2 * SETTLE / DRAIN_SOONEST)):
            looks.append(_drain_look(arb))
            clock.advance(DRAIN_SOONEST)
        settling = round(SETTLE / DRAIN_SOONEST)
        assert looks[:settling] == ["quick"] * settling, looks
        assert set(looks[settling + 1 :]) == {None}, looks
    finally:
        arb.inbox.close()


def test_a_sqlite_database_has_a_watch_and_postgres_none(db: str) -> None:
    watch = watch_file(db)
    try:
        assert (watch is None) == db.startswith("postgres")
    finally:
        if watch is not None:
            watch.close()
