"""R4's start rule: a handler starts only on a lease the database confirmed a moment ago.

The rule's arithmetic (pure, no clock), the heartbeat's synchronous confirmation (fake stores,
real threads), and a real worker process frozen between the exchange that claimed a task and
that task's start, whose task another worker takes over meanwhile: on every slot kind and both
backends, the frozen worker must never start it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import ledger
import psutil
import pytest
from apps.ledger_app import note
from helpers import Drains, reports, wait_for
from procs import Proc, spawn_worker

from workerproc.heartbeat import Heartbeat
from workerproc.startrule import StartRule
from workerproc.store import Lease, Renewal, Store, StoreUnavailable, open_store

LEASE = Lease(1, 1, "t", None, 1, "me", 0.0, 0.0)


# -- the rule -------------------------------------------------------------------------------------
def test_a_fresh_lease_starts_and_an_older_one_is_renewed_first():
    rule = StartRule(ttl=60.0)
    assert rule.fresh == 1.0  # a tenth of the ttl, at most a second
    assert rule.is_fresh(100.0, 100.0) and rule.is_fresh(100.0, 101.0)
    assert not rule.is_fresh(100.0, 101.01) and not rule.is_fresh(100.0, 700.0)
    short = StartRule(ttl=1.0)
    assert short.fresh == pytest.approx(0.1)
    assert short.is_fresh(100.0, 100.09) and not short.is_fresh(100.0, 100.11)


def test_a_handler_begins_with_at_least_half_its_ttl_left():
    rule = StartRule(ttl=10.0)
    assert rule.late == 5.0
    assert rule.begin_by(100.0) == 105.0  # confirmed at 100: it may not begin after 105
    assert rule.fresh < rule.late  # dispatch asks more than the last check


# -- the heartbeat's synchronous confirmation -----------------------------------------------------
class Renewals:
    """A store stand-in for the heartbeat: answers renewals as scripted, records when."""

    def __init__(self, refuse: set[int] = frozenset(), busy: bool = False) -> None:  # type: ignore[assignment]
        self.refuse = set(refuse)
        self.busy = busy
        self.sent: list[float] = []

    def renew_each(self, leases: list[Lease], ttl: float, *, starting: Any = ()) -> list[Renewal]:
        self.sent.append(time.monotonic())
        if self.busy:
            raise StoreUnavailable("database is locked")
        return [Renewal(None if lease.task_id in self.refuse else time.time() + ttl)
                for lease in leases]  # fmt: skip

    def close(self) -> None:
        pass


def heartbeat(store: Any, lost: list[int], ttl: float = 30.0) -> Heartbeat:
    return Heartbeat(
        lambda: store,
        ttl=ttl,
        interval=ttl / 3,
        post=reports(
            on_lost=lambda lease, why: lost.append(lease.task_id),
            on_death=lambda exc: lost.append(-1),
        ),
    )


def test_confirm_renews_every_lease_now_in_one_statement_and_waits_for_it():
    store = Renewals(refuse={2})
    lost: list[int] = []
    hb = heartbeat(store, lost)
    hb.start()
    try:
        leases = [Lease(i, i, "t", None, 1, "me", 0.0, 0.0) for i in (1, 2, 3)]
        old = time.monotonic() - 20.0  # claimed long ago (the ttl is 30: not yet due)
        for lease in leases:
            hb.track(lease, old)
        assert hb.confirmed_at(leases[0]) == old
        asked = time.monotonic()
        confirmed = hb.confirm(leases[:2], timeout=10.0)
        assert set(confirmed) == {1}  # 2 was refused: lost, never to start
        assert confirmed[1] >= asked  # sent after the question, not an old answer
        assert len(store.sent) == 1  # one statement renewed all three
        assert lost == [2] and hb.confirmed_at(leases[1]) is None
        renewed = hb.confirmed_at(leases[2])
        assert renewed is not None and renewed >= asked  # renewed with the others
    finally:
        hb.close()


def test_confirm_never_counts_a_renewal_sent_before_it_was_asked():
    release = threading.Event()

    class Slow(Renewals):
        def renew_each(
            self, leases: list[Lease], ttl: float, *, starting: Any = ()
        ) -> list[Renewal]:
            if not self.sent:  # the first round is in flight when confirm() is called
                self.sent.append(time.monotonic())
                release.wait(10)
                return [Renewal(time.time() + ttl) for _ in leases]
            return super().renew_each(leases, ttl, starting=starting)

    store = Slow()
    lost: list[int] = []
    hb = heartbeat(store, lost, ttl=0.9)  # due every 0.3 s
    hb.start()
    try:
        hb.track(LEASE, time.monotonic())
        wait_for(lambda: store.sent, timeout=10, what="a renewal in flight")
        threading.Timer(0.2, release.set).start()
        confirmed = hb.confirm([LEASE], timeout=10.0)
        assert 1 in confirmed and len(store.sent) == 2  # it waited for a second round
        assert confirmed[1] > store.sent[0]  # the round sent after the question
    finally:
        release.set()
        hb.close()


def test_confirm_gives_up_within_its_timeout_when_the_database_is_busy():
    store = Renewals(busy=True)
    hb = heartbeat(store, [])
    hb.start()
    try:
        hb.track(LEASE, time.monotonic() - 20.0)
        begun = time.monotonic()
        assert hb.confirm([LEASE], timeout=0.5) == {}
        assert time.monotonic() - begun < 5.0
        assert hb.confirmed_at(LEASE) is not None  # busy is not lost: it waits for the next turn
    finally:
        hb.close()


def test_confirm_with_nothing_held_answers_at_once():
    hb = heartbeat(Renewals(), [])
    hb.start()
    try:
        begun = time.monotonic()
        assert hb.confirm([LEASE], timeout=10.0) == {}
        assert time.monotonic() - begun < 5.0
    finally:
        hb.close()


# -- a real worker, frozen between its claim and the start ----------------------------------------
def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


SLOTS = {  # slot kind -> the freezing task, a neighbour on the other slot, the victim, options
    "inline": ("freeze", None, "mark", ["--concurrency", "1", "--prefetch", "1"]),
    "thread": ("freeze", "nap", "mark", ["--concurrency", "2", "--prefetch", "2"]),
    "async": ("afreeze", "anap", "amark", ["--concurrency", "2", "--prefetch", "2"]),
}


class FrozenWithTheLock(Exception):
    """The freeze landed while another thread of the worker held SQLite's write lock: nobody
    can claim until the worker wakes, so this round proves nothing and is played again."""


@pytest.mark.slow
@pytest.mark.parametrize("slots", sorted(SLOTS))
def test_a_worker_frozen_after_its_claim_never_starts_a_task_taken_over_meanwhile(
    tmp_path: Path, db: str, slots: str
) -> None:
    """The worker claims a task that freezes it and, in the same exchange, the task ``mark``
    (prefetched behind it). Frozen for longer than the ttl, its leases expire and another
    worker takes ``mark`` over and starts it. Woken, the frozen worker must never begin
    ``mark``'s old attempt: its lease is renewed before any start, and the renewal is refused.

    A process that stops itself can stop while its heartbeat or a neighbour's commit holds
    SQLite's write lock; such a round is played again on a fresh database (at most 5 rounds)."""
    for round_ in range(5):
        where = db if db.startswith("postgresql") else str(tmp_path / f"lk{round_}.db")
        try:
            return frozen_round(tmp_path / f"round{round_}", where, slots)
        except FrozenWithTheLock:
            continue
    pytest.fail("every round froze the worker inside a write transaction")


def frozen_round(tmp_path: Path, db: str, slots: str) -> None:
    tmp_path.mkdir()
    freeze, neighbour, mark, options = SLOTS[slots]
    path = tmp_path / "ledger.jsonl"
    payload = {"ledger": str(path), "seconds": 0.5}
    store: Store = open_store(db)
    try:
        frozen_run = store.start_run(freeze, payload)
        if neighbour:  # busy on the other slot when the process freezes, done after it wakes
            store.start_run(neighbour, payload)
        victim = store.start_run(mark, payload)
        worker = spawn_worker(db, tmp_path, "--app", "apps.ledger_app:app", "--lease-ttl", "1",
                              "--poll-interval", "0.05", *options)  # fmt: skip
        try:
            wait_for(lambda: stopped(worker.pid), timeout=30, what="the worker frozen")
            (task,) = store.get_tasks(victim)
            assert task.attempts == 1 and task.done_at is None, "mark was not claimed with it"

            def take_over() -> bool:
                try:
                    taken = store.claim("thief", 60.0, limit=10)
                except StoreUnavailable as e:  # the lock stays held until the worker wakes
                    raise FrozenWithTheLock from e
                return any(lease.task_id == task.id for lease in taken)

            wait_for(take_over, timeout=30, interval=0.05, what="mark taken over")
            note(str(path), "start", {"task": task.id, "attempt": 2, "run": victim})
            worker.signal(signal.SIGCONT)
            # the woken worker meets the fence for the old attempt (a refused renewal or
            # hand-back; or, on a machine so loaded that a renewal outlived the 1 s ttl, the
            # lease lost at its local deadline), and its frozen handler's commit is refused
            # too: then it has had every chance to start what it must not
            frozen = {t.id for t in store.get_tasks(frozen_run)}
            wait_for(lambda: refused(store, task.id) or lost_locally(worker, task.id),
                     timeout=30, what="the old lease refused")  # fmt: skip
            wait_for(lambda: [r for r in store.fence_rejections() if r.task_id in frozen],
                     timeout=30, what="the frozen handler's commit refused")  # fmt: skip
            assert_alive(worker)
        finally:
            worker.kill()
        entries = ledger.read(path)
        assert ledger.late_starts(entries) == []
        assert not [e for e in entries if e.task == task.id and e.attempt == 1], (
            entries,
            worker.output(),
        )
    finally:
        store.close()


def refused(store: Store, task_id: int) -> bool:
    return any(r.task_id == task_id and r.attempt == 1 for r in store.fence_rejections())


def lost_locally(worker: Proc, task_id: int) -> bool:
    return any(f" task {task_id} attempt 1 " in line and "lease lost" in line
               for line in worker.output().splitlines())  # fmt: skip


def assert_alive(worker: Proc) -> None:
    code = worker.popen.poll()
    assert code is None, f"the worker exited {code}:\n{worker.output()}"
    assert "Traceback" not in worker.output(), worker.output()
    assert os.path.exists(worker.log)


# -- a slow database does not keep a renewed lease from starting ----------------------------------
def test_a_lease_renewed_at_the_turns_request_starts_however_slow_the_renewal(
    tmp_path: Path,
) -> None:
    """Renewals slower than ``fresh`` (0.1 s at a 1 s ttl): the leases prefetched deep behind
    short handlers go stale while they wait, are renewed for their start, and start on that
    renewal's answer; they are not renewed again and again for being older than ``fresh`` by
    the time the answer came."""
    from workerproc import App, exitcodes  # noqa: PLC0415
    from workerproc.config import WorkerConfig  # noqa: PLC0415
    from workerproc.store import Store  # noqa: PLC0415

    db = str(tmp_path / "lk.db")
    renewals: list[int] = []

    class SlowRenewals(Store):
        def __init__(self, db: str) -> None:
            super().__init__(open_store(db).dialect)

        def renew_each(self, leases: Any, ttl: float, *, starting: Any = ()) -> list[Renewal]:
            renewals.append(len(leases))
            time.sleep(0.15)
            return super().renew_each(leases, ttl, starting=starting)

    app = App()
    app.task("short")(lambda ctx: time.sleep(0.005))
    with open_store(db) as s:
        s.start_runs([{"task": "short"}] * 40)
    config = WorkerConfig(
        db=db,
        app="tests:app",
        lease_ttl=1.0,
        prefetch=40,
        poll_interval=0.05,
        heartbeat_interval=0.9,
    )  # no periodic renewal comes to the rescue
    store = open_store(db)
    worker = Drains(store, app, config, owner="host:1:1.00:w",
                    open_store=lambda: SlowRenewals(db))  # fmt: skip
    begun = time.monotonic()
    try:
        assert worker.run() == exitcodes.OK
    finally:
        store.close()
    assert time.monotonic() - begun < 30
    assert renewals, "no lease went stale: the test proves nothing"
    with open_store(db) as s:
        assert s.stats().runs == {"succeeded": 40}
        assert s.fence_rejections() == []


def test_the_first_read_of_the_task_refuses_a_start_judged_stale_unless_renewed_since() -> None:
    """The last check, at the handler's first read of its payload or state: past the start's
    deadline with no renewal since, the lease is stale (the process stopped in between): the
    read raises and the execution counts as never begun. A renewal since the start is a fresh
    confirmation: a handler that reads its task late, its lease kept alive, goes on."""
    from workerproc.app import LeaseLost, TaskContext  # noqa: PLC0415

    newest = {"at": 100.0}
    ctx = TaskContext(LEASE, threading.Event())
    ctx.confirmed, ctx.latest = 100.0, lambda: newest["at"]
    ctx.begin_by = time.monotonic() - 1  # the start's deadline is behind us
    with pytest.raises(LeaseLost):
        ctx.payload  # noqa: B018 - the read is the check
    assert ctx.late

    ctx = TaskContext(LEASE, threading.Event())
    ctx.confirmed, ctx.latest = 100.0, lambda: newest["at"]
    ctx.begin_by = time.monotonic() - 1
    newest["at"] = 130.0  # the heartbeat renewed it since the start
    assert ctx.payload is None and not ctx.late
    ctx.begin_by = time.monotonic() - 1
    assert ctx.state is None  # checked once: later reads are reads


def test_the_lease_a_context_shows_carries_the_fence_and_not_the_runs_data() -> None:
    """``ctx.lease`` (what the webhooks' delivery fences its moves with) cannot be a way around
    the check above: the run's data is read through ``payload`` and ``state`` only."""
    from workerproc.app import LeaseLost, TaskContext  # noqa: PLC0415

    held = Lease(7, 3, "t", {"secret": 1}, 2, "me", 40.0, 10.0, state={"n": 1}, revision=4)
    lost = threading.Event()
    ctx = TaskContext(held, lost)
    ctx.confirmed, ctx.latest = 100.0, lambda: 100.0
    ctx.begin_by = time.monotonic() - 1  # (stale: reading the run's data refuses)
    assert ctx.lease.fence == held.fence == (7, "me", 2) and ctx.lease.run_id == 3
    assert (ctx.lease.payload, ctx.lease.state) == (None, None)
    assert (ctx.lease.expires_at, ctx.lease.claimed_at, ctx.lease.revision) == (40.0, 10.0, 4)
    lost.set()
    assert ctx.lease.fence == held.fence, "readable once lost (the store refuses its writes)"
    with pytest.raises(LeaseLost):
        ctx.payload  # noqa: B018 - the read is the check


@pytest.mark.slow
def test_a_handler_that_reads_its_task_late_keeps_running_on_a_renewed_lease(
    tmp_path: Path,
) -> None:
    """ttl 1 s (a start must begin within 0.5 s of its confirmation): a handler that works for
    1.5 s before it first reads ``ctx.payload`` is not refused: its heartbeat renewed it."""
    db = str(tmp_path / "lk.db")
    with open_store(db) as s:
        run_id = s.start_run("late_reader", {"ok": True})
    worker = spawn_worker(db, tmp_path, "--app", "apps.ledger_app:app", "--lease-ttl", "1",
                          "--poll-interval", "0.05")  # fmt: skip
    try:
        with open_store(db) as s:
            wait_for(lambda: (r := s.get_run(run_id)) is not None and r.terminal, timeout=30,
                     what="the run to end")  # fmt: skip
            run = s.get_run(run_id)
            assert run is not None and run.status == "succeeded", (run, worker.output())
            assert run.result == {"ok": True}
            (task,) = s.get_tasks(run_id)
            assert task.attempts == 1
    finally:
        worker.kill()


def test_a_postgres_worker_asks_the_server_to_end_its_idle_transactions_at_a_quarter_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workerproc import App, exitcodes, runner  # noqa: PLC0415
    from workerproc.config import WorkerConfig  # noqa: PLC0415
    from workerproc.store import StoreUnavailable  # noqa: PLC0415

    asked: list[dict[str, Any]] = []

    def opened(url: str, **options: Any) -> Store:
        asked.append(options)
        raise StoreUnavailable("not needed: the options are what this test reads")

    monkeypatch.setattr(runner, "open_store", opened)
    for db, expected in (("postgresql://u@127.0.0.1/x", 0.5), ("lk.db", None)):
        config = WorkerConfig(db=db, app="apps.ledger_app:app", lease_ttl=2.0)
        assert runner.run_worker(App(), config) == exitcodes.BOOT_FAILURE
        assert asked[-1].get("idle_in_transaction") == expected
        # a silent network is bounded too: a quarter ttl, at least a second
        assert asked[-1].get("network_timeout") == (None if expected is None else 1.0)
