"""An attempt is spent only by a handler that began (docs/protocol.md, B3).

The database knows whether a lease's handler began: a claim for a slot that starts it at once
records it as begun; a claim that only holds it waiting (a prefetch, ``start=0``) does not, and
the renewal that confirms its start records it (``renew(..., start=True)``). A takeover of a
lease that never began moves ``attempt_base`` with ``attempts``, like a hand-back: the fencing
token still moves on (R2), and R6 still bounds the handlers that began. Every backend, with the
fake clock: no test sleeps for a ttl.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import ledger
import pg_session
import psutil
import psycopg
import pytest
from attempts_helpers import PAUSE, WORKER, Renewals, lapse, pause, stopped
from helpers import FakeClock, reports, wait_for
from procs import Proc, spawn_worker
from store_backends import TTL, claim, finish

from workerproc.execution import Execution, Mode
from workerproc.heartbeat import Heartbeat
from workerproc.holdings import Holdings
from workerproc.store import (
    CasResult,
    ClaimRequest,
    Commit,
    Lease,
    Run,
    Store,
    StoreUnavailable,
    open_store,
)


def test_a_lease_that_lapses_before_its_start_spends_no_attempt(s: Store, clock: FakeClock) -> None:
    run_id = s.start_run("t")
    waiting = s.claim("w1", TTL, start=0)  # held waiting: its handler has not begun
    assert waiting is not None and waiting.tries == 1 and not waiting.started
    lapse(clock)
    taken = claim(s, "w2")
    assert (taken.attempt, taken.tries, taken.takeover) == (2, 1, True)  # the token moved on
    assert taken.started
    (task,) = s.get_tasks(run_id)
    assert (task.attempts, task.attempt_base) == (2, 1)
    ended = [(a.attempt, a.outcome, a.taken_by) for a in s.attempt_history(run_id)]
    assert ended == [(1, "unstarted", "w2")]
    # the zombie of the unstarted lease can never write (R2)
    assert not s.renew(waiting, TTL) and not s.ack(waiting)
    assert finish(s, taken, 0, {"done": True}) is CasResult.OK


def test_a_started_lease_that_lapses_spends_its_attempt(s: Store, clock: FakeClock) -> None:
    run_id = s.start_run("t")
    first = claim(s, "w1")  # begins at once: the pinned claim's caller runs it
    assert first.started
    lapse(clock)
    taken = claim(s, "w2")
    assert (taken.attempt, taken.tries) == (2, 2)
    assert [a.outcome for a in s.attempt_history(run_id)] == ["taken_over"]


def test_the_renewal_that_confirms_a_start_records_it(s: Store, clock: FakeClock) -> None:
    run_id = s.start_run("t")
    waiting = s.claim("w1", TTL, start=0)
    assert waiting is not None
    clock.advance(TTL / 2)
    assert s.renew(waiting, TTL)  # a plain renewal keeps it waiting
    lapse(clock)
    assert claim(s, "w2", TTL, start=0).tries == 1  # not counted, and waits in its turn
    lapse(clock)
    again = claim(s, "w3", TTL, start=0)
    assert again.tries == 1
    assert s.renew(again, TTL, start=True)  # its handler begins on this answer
    lapse(clock)
    assert claim(s, "w4").tries == 2  # that one began: it counts
    outcomes = [a.outcome for a in s.attempt_history(run_id)]
    assert outcomes == ["unstarted", "unstarted", "taken_over"]


def test_r6_still_bounds_the_handlers_that_began(s: Store, clock: FakeClock) -> None:
    """Lapses before a start never fail a run, however many; three that began do."""
    run_id = s.start_run("t")
    for _ in range(5):
        assert s.claim("w1", TTL, max_attempts=3, start=0) is not None
        lapse(clock)
    for expected, owner in ((1, "w2"), (2, "w3"), (3, "w2")):  # (not its own: B3)
        assert claim(s, owner, max_attempts=3).tries == expected
        lapse(clock)
    assert s.claim("w1", TTL, max_attempts=3) is None  # the fourth that would begin
    run = s.get_run(run_id)
    assert run is not None and run.status == "failed"
    assert run.failure_reason == "task_attempts_exhausted"
    (task,) = s.get_tasks(run_id)
    assert task.attempts == 9  # every claim moved the fencing token, counted or not


def test_a_batched_claim_records_only_its_first_leases_as_begun(s: Store, clock: FakeClock) -> None:
    """``ClaimRequest.start``: the first leases begin at once, the rest (a prefetch) wait."""
    for i in range(4):
        s.start_run("t", {"i": i})
    out = s.commit_many((), claim=ClaimRequest("w1", TTL, limit=4, start=1))
    assert [lease.started for lease in out.leases] == [True, False, False, False]
    assert [lease.payload["i"] for lease in out.leases] == [0, 1, 2, 3]  # claim order holds
    assert s.renew_each(out.leases, TTL, starting=out.leases[1:2])  # the second begins now
    lapse(clock)
    again = s.commit_many((), claim=ClaimRequest("w2", TTL, limit=4))
    assert [lease.tries for lease in again.leases] == [2, 2, 1, 1]


def test_a_hand_back_after_the_start_was_recorded_still_spends_nothing(
    s: Store, clock: FakeClock
) -> None:
    """A hand-back (B3) un-spends whatever the database thought: the worker knows it did
    not begin (its last check refused a late start)."""
    s.start_run("t")
    lease = claim(s, "w1")
    assert s.commit_many([Commit(lease, "handback")]).results == (CasResult.OK,)
    assert claim(s, "w2").tries == 1


# -- real workers ----------------------------------------------------------------------------------
def ended(store: Store, run_id: int) -> Run | None:
    run = store.get_run(run_id)
    return run if run is not None and run.terminal else None


def test_a_worker_paused_past_its_lease_takes_it_over_itself_and_runs_it_once(
    tmp_path: Path, db: str
) -> None:
    """Paused inside a handler deaf to its lease, a worker wakes, claims the task
    again itself (its own lease lapsed) and must run that attempt once the old handler ends,
    renewing it meanwhile. It used to lose track of it (the old attempt's ending untracked the
    new one), never start it, let it lapse, and fail the run with ``task_attempts_exhausted``
    after one pause."""
    path = tmp_path / "ledger.jsonl"
    store = open_store(db)
    try:
        run_id = store.start_run("deaf", {"ledger": str(path), "seconds": 2.0})
        worker = spawn_worker(db, tmp_path, *WORKER)
        try:
            wait_for(lambda: ledger.read(path), timeout=30, what="the handler started")
            pause(worker)
            try:
                run = wait_for(lambda: ended(store, run_id), timeout=60, what="the run ended")
            except AssertionError as e:
                raise AssertionError(f"{e}\n{store.get_tasks(run_id)}\n{worker.output()}") from None
            assert run.status == "succeeded", (run, worker.output())
            assert worker.popen.poll() is None, worker.output()
        finally:
            worker.kill()
        entries = ledger.read(path)
        starts = [e for e in entries if e.ev == "start"]
        assert [e.attempt for e in starts] == [1, 2], entries
        (first_end,) = [e for e in entries if e.ev == "end" and e.attempt == 1]
        assert starts[1].t >= first_end.t, "attempt 2 began while attempt 1 still ran here"
        assert run.state == {"attempt": 2}
        (task,) = store.get_tasks(run_id)
        assert task.attempts - task.attempt_base == 2  # the paused one, and the one that ran
    finally:
        store.close()


def sessions_in_transaction(admin: psycopg.Connection[Any], pid: int) -> list[int]:
    """The server's pids of the sessions of process ``pid`` that are inside a transaction."""
    try:
        ports = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
                 if c.raddr and c.raddr.port == 5432}  # fmt: skip
    except psutil.Error:
        return []
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s) "
        "AND xact_start IS NOT NULL", (sorted(ports),),
    ).fetchall()  # fmt: skip
    return [row[0] for row in rows]


def activity(admin: psycopg.Connection[Any], backends: list[int]) -> list[tuple[Any, ...]]:
    """What the server says those sessions are doing (for a failure's message)."""
    return admin.execute(
        "SELECT pid, state, wait_event_type, wait_event, now() - state_change, query "
        "FROM pg_stat_activity WHERE pid = ANY(%s)", (backends,),
    ).fetchall()  # fmt: skip


def alive(admin: psycopg.Connection[Any], backends: list[int]) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (backends,)
    ).fetchone()
    return bool(row and row[0])


def pause_inside_a_transaction(worker: Proc, admin: psycopg.Connection[Any]) -> None:
    """Stop the worker at a moment one of its sessions is inside a transaction (an exchange,
    a renewal), and keep it stopped past the ttl: the server ends that session under it once it
    has been idle in its transaction for ``idle_in_transaction`` (a quarter ttl)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        worker.signal(signal.SIGSTOP)
        wait_for(lambda: stopped(worker.pid), timeout=10, interval=0.001, what="stopped")
        caught = sessions_in_transaction(admin, worker.pid)
        if caught:
            began = time.monotonic()
            try:  # a session waiting on another's lock ends later: bound the wait generously
                wait_for(lambda c=caught: not alive(admin, c), timeout=30, interval=0.05,
                         what="the server ending the stopped worker's transaction")  # fmt: skip
            except AssertionError as e:
                raise AssertionError(f"{e}: {activity(admin, caught)}") from None
            time.sleep(max(0.0, PAUSE - (time.monotonic() - began)))  # the pause under test
            worker.signal(signal.SIGCONT)
            return
        worker.signal(signal.SIGCONT)
        time.sleep(0.003)
    pytest.fail("the worker was never caught inside a transaction")


def test_a_postgres_worker_paused_inside_a_transaction_reconnects_and_its_runs_succeed(
    tmp_path: Path,
) -> None:
    """On PostgreSQL: a worker stopped inside a transaction past
    ``idle_in_transaction_session_timeout`` finds that connection closed when it wakes. It
    reconnects and goes on: two such pauses (what chaos may do to a task under
    ``--max-attempts 3``) fail no run."""
    url = pg_session.schema_url("att")
    path = tmp_path / "ledger.jsonl"
    store = open_store(url)
    admin = psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True)
    try:
        deaf = store.start_run("deaf", {"ledger": str(path), "seconds": 2.0})
        runs = [deaf, *(store.start_run("short", {"seconds": 0.01}) for _ in range(400))]
        worker = spawn_worker(url, tmp_path, *WORKER[:-1], "4")
        try:
            wait_for(lambda: ledger.read(path), timeout=30, what="the deaf handler started")
            for _ in range(2):
                done = store.stats().runs.get("succeeded", 0)
                pause_inside_a_transaction(worker, admin)
                wait_for(lambda d=done: store.stats().runs.get("succeeded", 0) > d, timeout=30,
                         what="the woken worker committing again")  # fmt: skip
            for run_id in runs:
                run = wait_for(lambda r=run_id: ended(store, r), timeout=90, what="every run")
                assert run.status == "succeeded", (run, worker.output())
            assert worker.popen.poll() is None, worker.output()  # the same process went on
        finally:
            worker.kill()
        assert "Traceback" not in worker.output(), worker.output()
    finally:
        admin.close()
        store.close()


class FrozenWithTheLock(Exception):
    """The worker froze while its heartbeat held SQLite's write lock: nobody can claim until it
    wakes, so the round proves nothing and is played again."""


def test_a_prefetched_lease_of_a_frozen_worker_is_taken_over_without_spending_an_attempt(
    tmp_path: Path, db: str
) -> None:
    """A worker claims ``freeze`` for its slot and ``mark`` as its prefetch (recorded waiting),
    then freezes itself inside ``freeze``. Both leases lapse; another claimer takes both over:
    ``freeze`` began, so its attempt counts; ``mark`` never began, so it does not."""
    for round_ in range(3):
        where = db if db.startswith("postgresql") else str(tmp_path / f"lk{round_}.db")
        try:
            return prefetch_round(tmp_path / f"round{round_}", where)
        except FrozenWithTheLock:
            continue
    pytest.fail("every round froze the worker inside a write transaction")


def prefetch_round(tmp_path: Path, db: str) -> None:
    tmp_path.mkdir()
    path = tmp_path / "ledger.jsonl"
    store = open_store(db)
    try:
        frozen = store.start_run("freeze", {"ledger": str(path)})
        victim = store.start_run("mark", {"ledger": str(path)})
        worker = spawn_worker(db, tmp_path, "--app", "apps.ledger_app:app", "--lease-ttl", "1",
                              "--poll-interval", "0.05", "--concurrency", "1",
                              "--prefetch", "1")  # fmt: skip
        try:
            wait_for(lambda: stopped(worker.pid), timeout=30, what="the worker frozen")
            (task,) = store.get_tasks(victim)
            assert task.attempts == 1, "mark was not claimed with freeze"
            taken: dict[int, Lease] = {}

            def take_over() -> bool:
                try:
                    leases = store.claim("thief", 60.0, limit=10)
                except StoreUnavailable as e:  # the lock stays held until the worker wakes
                    raise FrozenWithTheLock from e
                taken.update((lease.run_id, lease) for lease in leases)
                return len(taken) == 2

            wait_for(take_over, timeout=30, interval=0.05, what="both taken over")
        finally:
            worker.kill()
        assert (taken[frozen].attempt, taken[frozen].tries) == (2, 2)
        assert (taken[victim].attempt, taken[victim].tries) == (2, 1)
        assert [a.outcome for a in store.attempt_history(victim)] == ["unstarted"]
        assert [a.outcome for a in store.attempt_history(frozen)] == ["taken_over"]
    finally:
        store.close()


# -- the worker's own bookkeeping ------------------------------------------------------------------
def heartbeat(store: Any, lost: list[tuple[int, int]]) -> Heartbeat:
    return Heartbeat(lambda: store, ttl=30.0, interval=10.0, post=reports(
                     on_lost=lambda lease, why: lost.append((lease.task_id, lease.attempt)),
                     on_death=lambda exc: lost.append((-1, -1))))  # fmt: skip


def test_the_heartbeat_keeps_two_attempts_of_one_task_apart() -> None:
    """The worker took its own lapsed lease over: the older attempt is lost, and what is said of
    it (its handler finished, its lease untracked) never touches the newer one."""
    lost: list[tuple[int, int]] = []
    hb = heartbeat(Renewals(), lost)  # never started: no thread, the calls alone
    old, new = (Lease(7, 7, "t", None, n, "me", 0.0, 0.0) for n in (1, 2))
    now = time.monotonic()
    hb.track(old, now)
    hb.track(new, now)
    assert lost == [(7, 1)]  # taken over by this very claim
    hb.started(old)
    hb.finished(old)
    hb.untrack([old], wait=False)
    assert hb.confirmed_at(new) == now and hb.recorded(new) and not hb.is_lost(new)


def test_a_lease_claimed_waiting_is_recorded_by_the_round_that_confirms_it() -> None:
    store = Renewals()
    hb = heartbeat(store, [])
    hb.start()
    try:
        waiting = Lease(3, 3, "t", None, 1, "me", 0.0, 0.0, started=False)
        begun = Lease(4, 4, "t", None, 1, "me", 0.0, 0.0)
        for lease in (waiting, begun):
            hb.track(lease, time.monotonic())
        assert not hb.recorded(waiting) and hb.recorded(begun)
        assert set(hb.confirm([waiting, begun], timeout=10.0)) == {3, 4}
        assert hb.recorded(waiting)
        assert store.starting[-1] == [3]  # only the one the database did not know began
    finally:
        hb.close()


def test_a_lease_waits_while_an_older_attempt_of_its_task_still_runs_here() -> None:
    holdings = Holdings()
    old, new, other = (Lease(t, t, "t", None, n, "me", 0.0, 0.0) for t, n in ((7, 1), (7, 2),
                                                                             (8, 1)))  # fmt: skip
    running = Execution(old, lambda ctx: None, Mode.THREAD)
    holdings.running[7] = running
    holdings.add_waiting([new, other])
    with holdings.lock:
        assert holdings.startable() is other  # the next task goes first
    holdings.running[7] = Execution(new, lambda ctx: None, Mode.THREAD)  # as a start would
    holdings.end(running)  # the old attempt ends: the newer one's slot stays
    assert holdings.running[7].lease is new
