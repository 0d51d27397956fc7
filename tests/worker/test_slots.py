"""Slots per worker, in-process with a real SQLite store: plain handlers on threads, async ones on
an event loop, one app mixing both; batched claims and commits; prefetch and hand-back; a lost
lease, a timeout and QUIT per slot; errors of every kind recorded on the task."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
import time
from typing import Any

from helpers import Drains, wait_for
from worker_fakes import worker

from workerproc import App, TaskContext, exitcodes
from workerproc.app import LeaseLost
from workerproc.execution import Execution, Mode
from workerproc.policy import SLOW_BEHIND
from workerproc.store import open_store
from workerproc.worker import Worker


class Peak:
    """How many handlers run at once, at most."""

    def __init__(self) -> None:
        self.now = self.max = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def statuses(db: str) -> dict[str, int]:
    with open_store(db) as store:
        return store.stats().runs


# -- concurrency ---------------------------------------------------------------------------------
def test_plain_handlers_run_on_threads_up_to_the_concurrency(db_path: str) -> None:
    app, peak = App(), Peak()

    @app.task
    def nap(ctx: TaskContext) -> None:
        with peak:
            time.sleep(0.2)

    with open_store(db_path) as s:
        s.start_runs([{"task": "nap"}] * 12)
    w, spy = worker(db_path, app, concurrency=4)
    started = time.monotonic()
    assert w.run() == exitcodes.OK
    assert peak.max == 4  # four at once, never more
    assert time.monotonic() - started < 0.2 * 12 / 2  # far less than one at a time
    assert statuses(db_path) == {"succeeded": 12}
    assert max(limit for _, limit in spy.exchanges) >= 4  # one claim for several slots
    assert max(n for n, _ in spy.exchanges) >= 2  # one commit for several slots


def test_async_handlers_share_one_loop_and_mix_with_plain_ones(db_path: str) -> None:
    app, peak = App(), Peak()
    loop_threads: set[int] = set()

    @app.task
    async def fetch(ctx: TaskContext) -> str:
        loop_threads.add(threading.get_ident())
        with peak:
            await asyncio.sleep(0.3)
        ctx.finish({"fetched": ctx.payload}, result="ok")
        return "ignored"

    @app.task
    def plain(ctx: TaskContext) -> int:
        return 7

    with open_store(db_path) as s:
        ids = s.start_runs([{"task": "fetch", "payload": i} for i in range(20)])
        s.start_runs([{"task": "plain"}] * 5)
    w, _ = worker(db_path, app, concurrency=20)
    started = time.monotonic()
    assert w.run() == exitcodes.OK
    assert peak.max == 20 and len(loop_threads) == 1
    assert time.monotonic() - started < 20 * 0.3 / 4
    with open_store(db_path) as s:
        assert s.stats().runs == {"succeeded": 25}
        run = s.get_run(ids[3])
        assert run is not None and run.state == {"fetched": 3} and run.result == "ok"


class Chains(Drains):
    """Counts the tasks slot threads started themselves, without a conductor turn."""

    chained = 0

    def _follow(self) -> Execution | None:
        nxt = super()._follow()
        if nxt is not None:
            assert nxt.mode is Mode.THREAD
            with self.holdings.lock:
                self.chained += 1
        return nxt


def test_slot_threads_start_prefetched_tasks_themselves_within_the_concurrency(
    db_path: str,
) -> None:
    """A slot thread whose handler ended starts the next prefetched plain task itself; async
    tasks in the same prefetch wait for the conductor, and the slots never exceed the
    concurrency, whoever starts them. (A task the app has no handler for is never claimed at
    all, B22.)"""
    app, peak = App(), Peak()

    @app.task
    def short(ctx: TaskContext) -> None:
        with peak:
            time.sleep(0.001)

    @app.task
    async def later(ctx: TaskContext) -> None:
        with peak:
            await asyncio.sleep(0.001)

    with open_store(db_path) as s:
        runs = [{"task": "short"}] * 150 + [{"task": "later"}] * 20
        runs = runs[::7] + runs[::-4] + runs  # interleaved, then in blocks
        s.start_runs(runs)
    w, _ = worker(db_path, app, cls=Chains, concurrency=3, prefetch=30)
    assert w.run() == exitcodes.OK
    assert peak.max <= 3
    assert isinstance(w, Chains) and w.chained > 20
    with open_store(db_path) as s:
        assert s.stats().runs == {"succeeded": len(runs)}
        done = s.list_runs(status="succeeded", limit=1000)
        assert [r.last_error for r in done] == [None] * len(done)  # each ran once, as written


# -- errors of every kind are the task's ---------------------------------------------------------
def test_handler_errors_of_any_kind_are_recorded_on_the_task(db_path: str) -> None:
    app = App()

    @app.task
    def interrupted(ctx: TaskContext) -> None:
        raise KeyboardInterrupt("not from a signal: from the handler")

    @app.task
    def exits(ctx: TaskContext) -> None:
        raise SystemExit(3)

    @app.task
    async def broken(ctx: TaskContext) -> None:
        raise ValueError("async bug")

    for concurrency in (1, 4):
        with open_store(db_path) as s:
            runs = [s.start_run(name) for name in ("interrupted", "exits", "broken")]
        w, _ = worker(db_path, app, concurrency=concurrency, max_attempts=1)
        assert w.run() == exitcodes.OK
        with open_store(db_path) as s:
            for run_id, words in zip(runs, ("KeyboardInterrupt", "SystemExit", "ValueError"),
                                     strict=True):  # fmt: skip
                run = s.get_run(run_id)
                assert run is not None and run.status == "failed"
                assert run.failure_reason == "task_attempts_exhausted"
                assert (run.last_error or "").startswith(words), run.last_error


# -- prefetch and hand-back ------------------------------------------------------------------------
def test_short_handlers_earn_a_prefetch_so_one_slot_batches(db_path: str) -> None:
    app = App()
    app.task("noop")(lambda ctx: None)
    with open_store(db_path) as s:
        s.start_runs([{"task": "noop"}] * 300)
    w, spy = worker(db_path, app)  # one slot, adaptive prefetch
    assert w.run() == exitcodes.OK
    assert statuses(db_path) == {"succeeded": 300}
    assert len(spy.exchanges) < 300 / 3  # several tasks per transaction, not one
    assert max(limit for _, limit in spy.exchanges) > 1


def test_a_prefetched_task_behind_a_slow_handler_goes_back_at_once(db_path: str) -> None:
    """One slot, prefetch 3: the first handler turns out slow, so the three tasks claimed behind
    it go back unstarted (their attempt budget intact) for another worker to take."""
    app = App()
    other_took: list[int] = []

    @app.task
    def slow(ctx: TaskContext) -> None:
        wait_for(lambda: len(other_took) == 3 or None, timeout=20, what="the others taken")

    app.task("next")(lambda ctx: None)  # (served, so claimed: B22; the thief runs them)
    with open_store(db_path) as s:
        s.start_runs([{"task": "slow"}] + [{"task": "next", "payload": i} for i in range(3)])

    def thief() -> None:
        with open_store(db_path) as s:  # only once the worker holds all four
            wait_for(lambda: s.stats().leased == 4, timeout=20, what="four leases held")
            while len(other_took) < 3:
                lease = s.claim("host:2:2.00:thief", 30)
                if lease is None:
                    time.sleep(0.005)
                    continue
                assert lease.tries == 1  # the hand-back spent no attempt
                other_took.append(lease.task_id)
                assert s.ack(lease)

    w, _ = worker(db_path, app, prefetch=3)
    t = threading.Thread(target=thief)
    t.start()
    started = time.monotonic()
    assert w.run() == exitcodes.OK
    t.join(30)
    assert len(other_took) == 3
    assert time.monotonic() - started < 10
    assert statuses(db_path) == {"succeeded": 4}
    assert SLOW_BEHIND < 1  # "at once": within tens of milliseconds, measured by the thief


def test_an_explicit_prefetch_is_not_claimed_again_while_the_slots_stay_slow(
    db_path: str,
) -> None:
    """--prefetch 1 behind two slow slots: the prefetched task goes back once, and is not
    claimed and handed back again and again (a hot loop on the write lock) while they run."""
    app = App()
    app.task("slow")(lambda ctx: time.sleep(0.6))
    with open_store(db_path) as s:
        s.start_runs([{"task": "slow"}] * 3)
    w, spy = worker(db_path, app, concurrency=2, prefetch=1)
    assert w.run() == exitcodes.OK
    assert statuses(db_path) == {"succeeded": 3}
    assert len(spy.exchanges) < 15, spy.exchanges


def test_stopping_hands_back_what_waits_unstarted(db_path: str) -> None:
    app = App()
    w_holder: list[Worker] = []

    @app.task
    def first(ctx: TaskContext) -> None:
        w_holder[0].signals.stop = signal.SIGTERM  # TERM while three wait behind it

    app.task("other")(lambda ctx: None)  # (served, so claimed behind it: B22)
    with open_store(db_path) as s:
        s.start_runs([{"task": "first"}] + [{"task": "other"}] * 3)
    w, _ = worker(db_path, app, cls=Worker, prefetch=3)
    w_holder.append(w)
    assert w.run() == exitcodes.OK
    with open_store(db_path) as s:
        stats = s.stats()
        assert stats.runs.get("succeeded") == 1 and stats.ready == 3 and stats.leased == 0
        lease = s.claim("host:2:2.00:next", 30)
        assert lease is not None and lease.tries == 1 and lease.attempt == 2


# -- lease loss, timeout, QUIT, per slot -----------------------------------------------------------
def test_a_lost_lease_stops_only_its_slot(db_path: str) -> None:
    """A thread learns at its next ctx call, an async handler is cancelled; the others go on."""
    app = App()
    seen: list[str] = []

    @app.task
    def looping(ctx: TaskContext) -> None:
        try:
            while True:
                ctx.raise_if_lost()
                time.sleep(0.01)
        except LeaseLost:
            seen.append("thread")
            raise

    @app.task
    async def waiting(ctx: TaskContext) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("async")
            raise

    @app.task
    def fine(ctx: TaskContext) -> None:
        wait_for(lambda: len(seen) == 2 or None, timeout=20, what="both lost")

    with open_store(db_path) as s:
        lost_ids = s.start_runs([{"task": "looping"}, {"task": "waiting"}])
        ok_id = s.start_run("fine")
    w, _ = worker(db_path, app, concurrency=3, lease_ttl=0.6, max_attempts=1)

    def expire_two() -> None:  # their leases end behind the worker's back: renewals are refused
        with open_store(db_path) as s:
            wait_for(lambda: s.stats().leased == 3, timeout=20, what="three leases")
        with sqlite3.connect(db_path) as conn:
            marks = ",".join("?" * len(lost_ids))
            conn.execute(f"UPDATE leases SET expires_at = 0 WHERE run_id IN ({marks})",
                         lost_ids)  # fmt: skip
        conn.close()

    t = threading.Thread(target=expire_two)
    t.start()
    code = w.run()
    t.join(30)
    assert code == exitcodes.OK
    assert sorted(seen) == ["async", "thread"]
    with open_store(db_path) as s:
        run = s.get_run(ok_id)
        assert run is not None and run.status == "succeeded"
        assert {s.get_run(r).status for r in lost_ids} == {"failed"}  # type: ignore[union-attr]


def test_quit_gives_every_lease_back_at_once(db_path: str) -> None:
    app = App()
    holder: list[Worker] = []
    started = threading.Event()

    @app.task
    def long(ctx: TaskContext) -> None:
        started.set()
        time.sleep(30)

    with open_store(db_path) as s:
        s.start_runs([{"task": "long"}] * 3)

    def quit_soon() -> None:
        started.wait(20)
        time.sleep(0.1)
        holder[0].signals.quit = True
        holder[0].waker.wake()

    w, _ = worker(db_path, app, cls=Worker, concurrency=3)
    holder.append(w)
    t = threading.Thread(target=quit_soon)
    t.start()
    begun = time.monotonic()
    assert w.run() == exitcodes.OK
    t.join(30)
    assert time.monotonic() - begun < 10  # not after the handlers' 30 s
    with open_store(db_path) as s:
        stats = s.stats()
        assert stats.leased == 0 and stats.ready == 3
        assert all(t.last_error and "WorkerStopped" in t.last_error
                   for r in s.list_runs() for t in s.get_tasks(r.id))  # fmt: skip


def test_async_timeout_cancels_and_releases_the_worker_goes_on(db_path: str) -> None:
    app = App()

    @app.task
    async def hang(ctx: TaskContext) -> None:
        await asyncio.sleep(60)

    @app.task
    async def quick(ctx: TaskContext) -> None:
        await asyncio.sleep(0)

    with open_store(db_path) as s:
        hung = s.start_run("hang")
        s.start_run("quick")
    w, _ = worker(db_path, app, concurrency=2, task_timeout=0.3, max_attempts=1)
    assert w.run() == exitcodes.OK
    with open_store(db_path) as s:
        run = s.get_run(hung)
        assert run is not None and run.status == "failed"
        assert "TaskTimeout" in (run.last_error or "")
        assert s.stats().runs == {"failed": 1, "succeeded": 1}


def test_thread_timeout_releases_at_once_and_exits_after_the_other_slots(db_path: str) -> None:
    """``hang`` outlives its 1 s timeout on a thread that cannot be stopped: its task is released
    at once (the database says so while ``other`` still runs), and the worker exits with
    TASK_TIMEOUT only after ``other``, running on the second slot, has finished."""
    app = App()
    released_while_other_ran = threading.Event()
    other_done = threading.Event()

    def hang_released() -> bool:
        with open_store(db_path) as s:
            (task,) = s.get_tasks(hung)
            return task.lease_owner is None and "TaskTimeout" in (task.last_error or "")

    @app.task
    def hang(ctx: TaskContext) -> None:
        time.sleep(60)  # a thread cannot be stopped

    @app.task(timeout=60.0)
    def other(ctx: TaskContext) -> None:
        wait_for(hang_released, timeout=30, interval=0.05, what="hang released")
        released_while_other_ran.set()
        time.sleep(0.3)  # still running after the timeout: the worker must wait for it
        other_done.set()

    with open_store(db_path) as s:
        hung = s.start_run("hang")
        s.start_run("other")
    w, _ = worker(db_path, app, cls=Worker, concurrency=2, task_timeout=1.0)
    assert w.run() == exitcodes.TASK_TIMEOUT
    assert released_while_other_ran.is_set() and other_done.is_set()
    with open_store(db_path) as s:
        assert hang_released()
        assert s.stats().runs.get("succeeded") == 1


def test_the_worker_serves_only_its_queues(db_path: str) -> None:
    app = App()
    app.task("t")(lambda ctx: None)
    with open_store(db_path) as s:
        mine = s.start_runs([{"task": "t", "queue": "model"}] * 3)
        theirs = s.start_runs([{"task": "t", "queue": "cheap"}] * 2)

    class UntilMineDone(Worker):
        def _wait(self, want: int) -> None:
            with open_store(db_path) as s:
                if all(s.get_run(r).status == "succeeded" for r in mine):  # type: ignore[union-attr]
                    self.signals.stop = signal.SIGTERM
                    return
            super()._wait(want)

    w, _ = worker(db_path, app, cls=UntilMineDone, queues=("model",))
    assert w.run() == exitcodes.OK
    with open_store(db_path) as s:
        assert {s.get_run(r).status for r in theirs} == {"pending"}  # type: ignore[union-attr]


def test_a_worker_of_plain_handlers_never_imports_asyncio_or_filelock(tmp_path: Any) -> None:
    """asyncio (with the ssl it pulls in) and filelock (hashlib, decimal, ast…) cost a worker
    several MB: a worker process of plain handlers on a current database loads neither, even
    with slot threads; its first ``async def`` handler loads asyncio."""
    from procs import spawn_worker  # noqa: PLC0415 - the process helpers

    db = str(tmp_path / "lazy.db")
    store = open_store(db)  # migrated here: the workers find the schema current
    try:
        plain = store.start_run("modules")
        worker = spawn_worker(db, tmp_path, "--app", "apps.lazy_app:app", "--concurrency", "4",
                              "--max-tasks", "1")  # fmt: skip
        assert worker.wait(60) == exitcodes.RECYCLE, worker.output()
        assert store.get_run(plain).result == {"asyncio": False, "filelock": False}
        coro = store.start_run("modules_async")
        worker = spawn_worker(db, tmp_path, "--app", "apps.lazy_app:app", "--concurrency", "4",
                              "--max-tasks", "1")  # fmt: skip
        assert worker.wait(60) == exitcodes.RECYCLE, worker.output()
        assert store.get_run(coro).result == {"asyncio": True, "filelock": False}
    finally:
        store.close()
