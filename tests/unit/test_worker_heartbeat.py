"""Worker pieces in-process: the heartbeat's single flight, its death, and signal races."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from helpers import reports, wait_for

from workerproc import App, exitcodes
from workerproc.app import LeaseLost, TaskContext
from workerproc.config import WorkerConfig
from workerproc.execution import Execution, Mode
from workerproc.heartbeat import Heartbeat
from workerproc.signals import INTERRUPT, Waker
from workerproc.status import DURATION_BOUNDS, Counters, StatusBoard
from workerproc.store import Lease, Renewal, Store, StoreUnavailable, open_store
from workerproc.worker import Worker

LEASE = Lease(1, 1, "t", None, 1, "me", 0.0, 0.0)


def wconfig(db: str) -> WorkerConfig:
    return WorkerConfig(db=db, app="tests:app")


class SlowRenewals:
    """A store stand-in for the heartbeat only: renewals take longer than the interval."""

    def __init__(self, duration: float, fail_first: int = 0) -> None:
        self.duration = duration
        self.fail_first = fail_first
        self.active = 0
        self.max_active = 0
        self.calls: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def renew_each(self, leases: list[Lease], ttl: float, *, starting: Any = ()) -> list[Renewal]:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        start = time.monotonic()
        try:
            time.sleep(self.duration)
            if len(self.calls) < self.fail_first:
                raise StoreUnavailable("database is locked")
            return [Renewal(time.time() + ttl) for _ in leases]
        finally:
            self.calls.append((start, time.monotonic()))
            with self.lock:
                self.active -= 1

    def close(self) -> None:
        pass


def make_heartbeat(store: Any, lost: list[str], **kw: Any) -> Heartbeat:
    return Heartbeat(
        lambda: store,
        ttl=kw.pop("ttl", 10.0),
        interval=kw.pop("interval", 0.02),
        post=reports(
            on_lost=lambda lease, why: lost.append(why),
            on_timeout=lambda lease: lost.append("timeout"),
            on_death=lambda exc: lost.append(f"death {exc!r}"),
            on_stuck=kw.pop("on_stuck", None),
        ),
        **kw,
    )


def test_r4_heartbeat_is_single_flight():
    store = SlowRenewals(duration=0.15)  # each renewal outlasts several intervals
    lost: list[str] = []
    hb = make_heartbeat(store, lost)
    hb.start()
    hb.track(LEASE, time.monotonic())
    wait_for(lambda: len(store.calls) >= 4, timeout=10, what="four renewals")
    hb.untrack([LEASE])
    hb.close()
    assert store.max_active == 1
    for (_, end), (start, _) in zip(store.calls, store.calls[1:], strict=False):
        assert start >= end  # the next renewal only after the previous returned
    assert not lost


def test_busy_renewal_is_retried_not_a_lost_lease():
    store = SlowRenewals(duration=0.0, fail_first=3)
    lost: list[str] = []
    hb = make_heartbeat(store, lost, ttl=10.0)
    hb.start()
    hb.track(LEASE, time.monotonic())
    wait_for(lambda: hb.renewals >= 1, timeout=10, what="a renewal after three busy errors")
    hb.close()
    assert len(store.calls) >= 4 and not lost


def test_local_deadline_passing_while_busy_is_a_lost_lease():
    store = SlowRenewals(duration=0.0, fail_first=10_000)
    lost: list[str] = []
    hb = make_heartbeat(store, lost, ttl=0.3)
    hb.start()
    hb.track(LEASE, time.monotonic())
    wait_for(lambda: lost, timeout=10, what="lease declared lost")
    hb.close()
    assert "deadline" in lost[0]


def test_a_renewal_that_hangs_past_the_local_deadline_loses_the_lease_at_the_deadline():
    """A renewal sent into a silent network hangs (here: 3 s); the handler must learn of its
    loss at the local deadline (0.3 s after the claim), while that call is still in flight,
    not when it returns: by then another host may have taken the task over."""
    store = SlowRenewals(duration=3.0)
    lost: list[str] = []
    hb = make_heartbeat(store, lost, ttl=0.3, interval=0.1)
    hb.start()
    claimed = time.monotonic()
    hb.track(LEASE, claimed)
    wait_for(lambda: lost, timeout=10, what="lease declared lost")
    declared = time.monotonic()
    assert store.active == 1  # the hung renewal has not returned yet
    assert "hung" in lost[0]
    assert declared - claimed < 2.5
    hb.close()
    assert lost == [lost[0]]  # told once, though the call then fails or returns


def test_the_overdue_watch_looks_often_while_a_call_is_in_flight_so_it_sees_a_pause() -> None:
    """A deadline 0.9 s away while a renewal is in flight: the watch still looks within
    ``LATE / 2``. Had it slept until the deadline, a process frozen meanwhile and resumed just
    after that deadline would wake the watch on time (not ``LATE``), and it would take the pause
    for a hung call and lose the lease itself, where the database must judge (and record) it."""
    from workerproc.held import LATE, Held  # noqa: PLC0415
    from workerproc.overdue import overdue  # noqa: PLC0415

    held = [Held(LEASE, confirmed=100.0, due=100.3)]
    wake, lost = overdue(held, 100.1, 1.0, busy=True, after=100.0)
    assert lost == [] and wake <= 100.1 + LATE / 2
    wake, lost = overdue(held, 100.1, 1.0, busy=False, after=100.0)
    assert lost == [] and wake == 101.0  # idle: nothing to judge until the deadline
    wake, lost = overdue(held, 101.05, 1.0, busy=True, after=100.5)
    assert lost == held  # the deadline passed during the call


def test_heartbeat_death_stops_the_worker(db_path: str):
    store = open_store(db_path)
    store.start_run("noop")

    def broken_store() -> Store:
        raise RuntimeError("heartbeat cannot start")

    app = App()
    app.task("noop")(lambda ctx: None)
    worker = Worker(store, app, wconfig(db_path), owner="w", open_store=broken_store)
    started = time.monotonic()
    assert worker.run() == exitcodes.HEARTBEAT_DIED
    assert time.monotonic() - started < 10
    store.close()


@pytest.fixture
def worker_signals(db_path: str):
    touched = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, INTERRUPT, signal.SIGHUP,
               signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR2, signal.SIGCHLD)  # fmt: skip
    saved = {s: signal.getsignal(s) for s in touched}
    store = open_store(db_path)
    waker = Waker()
    worker = Worker(store, App(), wconfig(db_path), owner="w", open_store=lambda: store,
                    waker=waker)  # fmt: skip
    old_fd = signal.set_wakeup_fd(-1)
    worker.signals.install(waker)
    yield worker, waker
    signal.set_wakeup_fd(old_fd)
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    waker.close()
    store.close()


def test_sigterm_with_the_interrupt_is_never_lost(worker_signals):
    """The heartbeat's interrupt raises LeaseLost from a signal handler; a TERM landing at the
    same moment must still stop the worker (Python handler or the wakeup fd, either way)."""
    worker, waker = worker_signals
    both = {INTERRUPT, signal.SIGTERM}

    def handler(_: TaskContext) -> None:
        worker.signals.interrupt = LeaseLost  # what the heartbeat thread sets on a lost lease
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both land inside the handler
        time.sleep(1)

    for _ in range(50):
        worker.signals.stop = None
        signal.pthread_sigmask(signal.SIG_BLOCK, both)
        signal.pthread_kill(threading.main_thread().ident or 0, INTERRUPT)  # as the heartbeat does
        os.kill(os.getpid(), signal.SIGTERM)
        ex = Execution(LEASE, handler, Mode.INLINE)
        worker.executors[Mode.INLINE].submit(ex)
        assert ex.commit is None  # LeaseLost: whatever it would have written is discarded
        worker.signals.absorb(waker.drain())
        assert worker.signals.stop == signal.SIGTERM


def test_interrupt_outside_the_handler_is_ignored(worker_signals):
    worker, _ = worker_signals
    worker.signals.interrupt = LeaseLost
    handled = threading.Event()

    def spy(signum: int, frame: Any) -> None:  # the worker's own handler, then a mark
        try:
            worker.signals.on_interrupt(signum, frame)
        finally:
            handled.set()

    signal.signal(INTERRUPT, spy)
    signal.pthread_kill(threading.main_thread().ident or 0, INTERRUPT)  # never in bookkeeping
    wait_for(handled.is_set, timeout=10, what="the interrupt handler to run")
    assert worker.signals.interrupt is LeaseLost


def test_status_slot_counters_round_trip_and_belong_to_one_pid():
    board = StatusBoard(2)
    counted = Counters(claims=3, takeovers=1)
    counted.batch_done(64)
    counted.batch_done(30)
    counted.task_done(0.003)
    counted.task_done(0.2)
    counted.task_done(1e6)  # past the last bound: the +Inf bucket
    board.slot(1).publish_counters(4242, counted)
    got = board.slot(1).read_counters(4242)
    assert got == counted and got.done == 3 and got.buckets[-1] == 1
    assert (got.batches, got.batch_items) == (2, 94)
    assert got.buckets[0] == 1 and sum(got.buckets) == 3
    assert len(got.buckets) == len(DURATION_BOUNDS) + 1
    assert board.slot(1).read_counters(4243) is None  # another pid's slot
    assert board.slot(0).read_counters(4242) is None
    board.slot(1).clear()
    assert board.slot(1).read_counters(4242) is None


def test_worker_counts_claims_and_handler_time_into_its_slot(db_path: str):
    store = open_store(db_path)
    for _ in range(5):
        store.start_run("noop")
    app = App()
    app.task("noop")(lambda ctx: None)
    board = StatusBoard(1)

    class Once(Worker):
        def _wait(self, want: int) -> None:
            self.signals.stop = signal.SIGTERM

    worker = Once(store, app, wconfig(db_path), owner="w", open_store=lambda: store,
                  slot=board.slot(0))  # fmt: skip
    assert worker.run() == exitcodes.OK
    counted = board.slot(0).read_counters(os.getpid())
    assert counted is not None and counted.claims == 5 and counted.done == 5
    assert counted.takeovers == 0 and sum(counted.buckets) == 5
    store.close()


class ScriptedRenewals:
    """Refuses renewals of the leases in ``refuse``; records every renewal with its time."""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.calls: list[tuple[int, float]] = []

    def renew_each(self, leases: list[Lease], ttl: float, *, starting: Any = ()) -> list[Renewal]:
        now = time.monotonic()
        self.calls += [(lease.task_id, now) for lease in leases]
        return [Renewal(None if lease.task_id in self.refuse else time.time() + ttl)
                for lease in leases]  # fmt: skip

    def close(self) -> None:
        pass


def test_after_a_lost_lease_the_next_lease_is_renewed_on_time():
    """A lost lease must not put the heartbeat to sleep for a ttl (the next task would lapse)."""
    store = ScriptedRenewals(refuse={1})
    lost: list[str] = []
    hb = make_heartbeat(store, lost, ttl=3.0, interval=0.2, on_stuck=lambda lease: None)
    hb.start()
    first = Lease(1, 1, "t", None, 1, "me", 0.0, 0.0)
    hb.track(first, time.monotonic())
    wait_for(lambda: lost, timeout=10, what="the first lease lost")
    hb.untrack([LEASE])
    second = Lease(2, 2, "t", None, 1, "me", 0.0, 0.0)
    tracked_at = time.monotonic()
    hb.track(second, tracked_at)
    when = wait_for(lambda: next((t for i, t in store.calls if i == 2), None), timeout=10)
    hb.close()
    assert when - tracked_at < 1.5  # one interval (0.2 s) plus slack, never the 3 s ttl


def test_untrack_waits_while_the_timeout_path_ends_the_process():
    """on_timeout exits the process; until it does, the main thread must not commit and claim
    the next task (it would be killed inside it)."""
    finished: list[float] = []
    exiting = threading.Event()

    def slow_exit(lease: Lease) -> None:
        exiting.set()
        time.sleep(0.5)  # the real one releases the lease, then os._exit()s
        finished.append(time.monotonic())

    hb = Heartbeat(
        lambda: ScriptedRenewals(set()),
        ttl=10.0,
        interval=1.0,
        post=reports(on_timeout=slow_exit),
        task_timeout=0.1,
    )
    hb.start()
    hb.track(LEASE, time.monotonic())
    hb.started(LEASE)  # the task timeout counts from the handler's start
    assert exiting.wait(10)  # the timeout fired and the exit path is under way
    hb.untrack([LEASE])
    returned = time.monotonic()
    hb.close()
    assert finished and returned >= finished[0]


def test_a_committed_lease_is_never_released_again_on_exit(db_path: str):
    """QUIT while a handler finishes: its commit lands, and nothing is refused afterwards."""
    store = open_store(db_path)
    store.start_run("noop")
    app = App()
    holder: list[Worker] = []

    def handler(ctx: TaskContext) -> None:
        holder[0].signals.quit = True  # QUIT recorded while the handler ran

    app.task("noop")(handler)
    worker = Worker(
        store,
        app,
        wconfig(db_path),
        owner="w",
        open_store=lambda: open_store(db_path),
    )
    holder.append(worker)
    assert worker.run() == exitcodes.OK
    assert store.stats().runs == {"succeeded": 1}
    assert store.fence_rejections() == []  # no false evidence of a zombie
    store.close()


def test_a_store_error_while_settling_a_conflict_does_not_stop_the_worker(db_path: str):
    store = open_store(db_path)
    run_id = store.start_run("noop")
    other = open_store(db_path)
    app = App()

    def handler(ctx: TaskContext) -> None:
        other.cancel_run(run_id)  # the run moves under the handler: its commit is a conflict

    app.task("noop")(handler)

    def broken_get_run(run_id: int) -> None:
        raise StoreUnavailable("database is locked")

    class Once(Worker):
        def _wait(self, want: int) -> None:
            self.signals.stop = signal.SIGTERM

    store.get_run = broken_get_run  # type: ignore[method-assign]
    worker = Once(store, app, wconfig(db_path), owner="w", open_store=lambda: other)
    assert worker.run() == exitcodes.OK
    other.close()
    store.close()
