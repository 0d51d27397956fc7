"""An idle worker looks before it claims (R7): at each poll interval one read (``ready_in``:
``NEXT_READY`` and the clock it judged by; on PostgreSQL one statement) says whether anything of
its queues is claimable now, and it claims only then. Counted, not timed: the exchanges (claims)
and, on PostgreSQL, the statements the worker's own thread sends per poll interval. And R7
still holds without any change notice: work written while the worker sleeps is claimed at the
next interval's look."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers import wait_for
from worker_fakes import Spy, config

from workerproc import App, TaskContext, exitcodes
from workerproc.store import open_store
from workerproc.worker import Worker

POLL = 0.1  # seconds: the workers' poll interval here
LOOKS = 8  # poll intervals watched idle
# per idle poll interval on PostgreSQL: NEXT_READY, and at most once a second the claims'
# floor refound (``floors``). Before this rule: BEGIN, the claims, OPEN_GATES and the clock,
# COMMIT, NEXT_READY, and the limits' declarations every other interval (8 to 10).
MAX_STATEMENTS_PER_POLL = 2

app = App()


@app.task
def t(ctx: TaskContext) -> str:
    return "done"


class Looks(Spy):
    """The real store, counting its claims (``Spy``) and the idle worker's looks."""

    def __init__(self, db: str) -> None:
        super().__init__(db)
        self.looks = 0

    def ready_in(self, queues: Any = None) -> float | None:
        self.looks += 1
        return super().ready_in(queues)


class Deaf(Looks):
    """No change notice ever reaches the worker: a token that never moves, no watch. Only the
    poll interval's look can find new work."""

    def change_token(self) -> int:
        return 0

    def change_watch(self) -> None:
        return None


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the test's main thread (the worker's conductor) sends to PostgreSQL, a statement
    per entry (a batch of ``EXECUTE``s counts each)."""
    sent: list[str] = []
    main = threading.main_thread()
    for cls in (psycopg.Cursor, psycopg.Connection):
        original = cls.execute

        def execute(self: Any, query: Any, *args: Any, _o: Any = original, **kw: Any) -> Any:
            if threading.current_thread() is main:
                sent.extend(part for part in str(query).split(";") if part.strip())
            return _o(self, query, *args, **kw)

        monkeypatch.setattr(cls, "execute", execute)
    yield sent


def run_until(w: Worker, done: Callable[[], bool]) -> int:
    """Run ``w`` on this thread until ``done()`` (checked from another thread), then TERM."""

    def watch() -> None:
        try:
            wait_for(done, timeout=60, what="the worker's idle polls")
        finally:
            w.signals.stop = signal.SIGTERM
            w.waker.wake()

    helper = threading.Thread(target=watch, daemon=True)
    helper.start()
    code = w.run()
    helper.join(10)
    return code


def idle_worker(db: str, store: Looks) -> Worker:
    return Worker(store, app, config(db, poll_interval=POLL), owner="host:1:1.00:w",
                  open_store=lambda: open_store(db))  # fmt: skip


def test_ready_in_reads_the_database_clock_in_the_same_read(db: str) -> None:
    """Without an injected clock: on PostgreSQL the statement's own clock (its second column),
    on SQLite the host's."""
    with open_store(db) as s:
        assert s.ready_in() is None
        s.start_run("t", delay=30)
        due_in = s.ready_in()
        assert due_in is not None and 25 < due_in <= 30
        s.start_run("t")
        assert s.ready_in() <= 0  # type: ignore[operator]


def test_an_idle_worker_looks_at_each_poll_interval_and_claims_nothing(db: str) -> None:
    store = Looks(db)
    w = idle_worker(db, store)
    marks: dict[str, int] = {}

    def idle_for_a_while() -> bool:
        if "looks" not in marks:
            if store.looks < 2:  # (booted, claimed once, waiting)
                return False
            marks.update(looks=store.looks, exchanges=len(store.exchanges))
        return store.looks >= marks["looks"] + LOOKS

    assert run_until(w, idle_for_a_while) == exitcodes.OK
    # not one claim while nothing was claimable, over LOOKS poll intervals
    assert len(store.exchanges) == marks["exchanges"], store.exchanges
    store.close()


def test_an_idle_poll_sends_at_most_two_statements_on_postgresql(
    db: str, statements: list[str]
) -> None:
    if not db.startswith("postgresql"):
        pytest.skip("statements are counted on PostgreSQL (SQLite's claim is the write lock)")
    store = Looks(db)
    w = idle_worker(db, store)
    marks: dict[str, int] = {}

    def idle_for_a_while() -> bool:
        if "looks" not in marks:
            if store.looks < 2:
                return False
            marks.update(looks=store.looks, sent=len(statements))
        return store.looks >= marks["looks"] + LOOKS

    assert run_until(w, idle_for_a_while) == exitcodes.OK
    looks = store.looks - marks["looks"]
    sent = statements[marks["sent"] :]
    # (the window may end mid-interval: one look's statements of slack)
    assert len(sent) <= MAX_STATEMENTS_PER_POLL * (looks + 1), sent
    assert not any(s.strip().upper().startswith("BEGIN") for s in sent), "no transaction"
    store.close()


def test_work_written_unnoticed_is_claimed_at_the_next_poll_interval(db: str) -> None:
    """R7 without any change notice: a run started by another connection is found by the poll
    interval's look (nothing else tells this worker), and claimed."""
    store = Deaf(db)
    w = idle_worker(db, store)
    other = open_store(db)
    started: list[int] = []

    def claimed_it() -> bool:
        if not started:
            if store.looks < 2:  # idle: it claimed once, found nothing, and looks
                return False
            started.append(other.start_run("t"))
            return False
        run = other.get_run(started[0])
        return run is not None and run.status == "succeeded"

    began = time.monotonic()
    assert run_until(w, claimed_it) == exitcodes.OK
    assert time.monotonic() - began < 60
    other.close()
    store.close()
