"""The outbox (B18) and the idle worker's cheap reads: ``events`` (with a consumer's cursor,
``ack_events``), ``events_mark``, ``change_token``, ``wait_change``, ``commits_move_token``."""

from __future__ import annotations

import select
import threading
import time

import pytest

from workerproc.store import CasResult, ClaimRequest, Commit
from workerproc.store.errors import InvalidOption

from .kit import Driver, verb


@verb("events")
def test_every_transition_writes_one_event_in_commit_order(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t", {"p": 1})
    assert driver.finish(lease) is CasResult.OK
    got = s.events()
    assert [e.kind for e in got] == ["run.enqueued", "step.claimed", "step.committed",
                                     "run.succeeded"]  # fmt: skip
    assert [e.id for e in got] == sorted({e.id for e in got})
    claimed = got[1]
    assert (claimed.run_id, claimed.task, claimed.attempt) == (lease.run_id, "t", 1)
    assert s.events(after=got[1].id, limit=1) == [got[2]]
    assert s.events(run=lease.run_id + 1) == []


@verb("events")
def test_an_events_text_goes_in_and_comes_out_as_written(driver: Driver) -> None:
    # quotes, backslashes, braces, commas, a name that reads NULL, non-ASCII: every column of
    # an event is written as the transition gave it (PostgreSQL sends them as array literals)
    s = driver.store
    odd = 'a"b\\c,{d} é'
    lease = driver.lease(odd)
    error = 'it said "no" \\ {1,2} NULL é'
    assert driver.commit(Commit(lease, "fail", reason="gave_up", error=error)).value == "ok"
    failed = [e for e in s.events(run=lease.run_id) if e.kind == "run.failed"]
    assert [(e.task, e.attempt, e.data["error"]) for e in failed] == [(odd, 1, error)]
    names = ["NULL", "x\\"]
    for name in names:
        s.start_run(name, state={"k": 'v"\\{,}', "n": None})
    got = s.events(after=failed[0].id)
    assert [(e.kind, e.task) for e in got] == [("run.enqueued", n) for n in names]
    assert all(e.run_id is not None and e.attempt is None for e in got)


@verb("events")
def test_a_consumers_cursor_moves_only_when_it_acknowledges(driver: Driver) -> None:
    s = driver.store
    for task in ("a", "b", "c"):
        s.start_run(task)
    first = s.events(consumer="billing")
    assert len(first) == 3 and s.consumer_position("billing") == 0
    assert s.ack_events("billing", first[1].id) == first[1].id
    assert s.events(consumer="billing") == first[2:]
    assert s.ack_events("billing", first[0].id) == first[1].id  # never back
    with pytest.raises(InvalidOption):
        s.ack_events("billing", first[2].id + 100)  # past the newest: refused


@verb("events")
def test_events_refuses_bad_cursors_limits_and_consumer_names(driver: Driver) -> None:
    s = driver.store
    for kwargs in ({"after": -1}, {"limit": 0}, {"limit": 10_001}, {"consumer": "bad name"},
                   {"run": -3}, {"after": True}):  # fmt: skip
        with pytest.raises(InvalidOption):
            s.events(**kwargs)  # type: ignore[arg-type]


@verb("events")
def test_a_system_runs_events_are_read_only_when_asked(driver: Driver) -> None:
    s = driver.store
    hook = s.add_webhook("h", "https://example.test/", secret="s3cret-for-the-suite")
    assert s.events() == []
    assert [e.run_id for e in s.events(system=True)] == [hook.run_id]
    assert len(s.events(run=hook.run_id)) == 1


@verb("events_mark")
def test_the_events_mark_moves_with_every_committed_event_and_writes_nothing(
    driver: Driver,
) -> None:
    """What the webhooks' waker reads between its looks: the same while nothing commits, moved
    by a committed event (on PostgreSQL -1 until a reader numbers it), and a read only: reading
    it numbers nothing."""
    s = driver.store
    before = s.events_mark()
    assert s.events_mark() == before, "nothing committed: the same mark"
    s.start_run("t")
    after = s.events_mark()
    assert after != before
    assert s.events_mark() == after, "a read: it numbered nothing"
    newest = s.last_event_id()  # (PostgreSQL: numbers it)
    assert s.events_mark() == newest != before


@verb("change_watch")
def test_the_change_watch_wakes_a_waiter_when_another_connection_commits(driver: Driver) -> None:
    """What an idle worker sleeps on beside its self-pipe (SQLite: an inotify watch of the
    database's files; PostgreSQL: the LISTEN socket): readable once another connection
    committed, its token moved; quiet (or saying nothing moved) otherwise."""
    s = driver.store
    watch = s.change_watch()
    assert watch is not None and s.change_watch() is watch  # (one per process, kept)
    token = s.change_token()
    fd = watch.fileno()
    assert fd is not None
    select.select([fd], [], [], 0.05)
    watch.drain()  # whatever opening it left behind
    driver.open().start_run("t")
    deadline = time.monotonic() + 30
    moved = False
    while not moved and time.monotonic() < deadline:
        fd = watch.fileno()
        assert fd is not None
        ready, _, _ = select.select([fd], [], [], 1.0)
        moved = bool(ready) and watch.drain()
    assert moved and s.change_token() != token


@verb("change_token", "wait_change")
def test_the_change_token_moves_when_another_connection_commits(driver: Driver) -> None:
    s = driver.store
    token = s.change_token()
    assert s.wait_change(token, 0.05) == token  # nothing committed: the timeout
    other = driver.open()
    woke: list[tuple[int, int]] = []
    ready = threading.Event()

    def wait() -> None:  # a token is its connection's: this thread reads its own first
        mine = s.change_token()
        ready.set()
        woke.append((mine, s.wait_change(mine, 30)))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert ready.wait(30)
    other.start_run("t")
    waiter.join(30)
    assert woke and woke[0][1] != woke[0][0] and s.change_token() != token


@verb("commits_move_token")
def test_where_every_commit_moves_the_token_a_finish_that_notifies_nobody_moves_it(
    driver: Driver,
) -> None:
    """What the webhooks' waker trusts to read nothing while the token stands still: a store
    that says every commit moves its change token (SQLite, PostgreSQL polled through a pooler)
    sees another connection's finish, which wakes no worker; PostgreSQL over LISTEN says no
    (only new work and watched runs' ends notify), so the waker reads the events' mark."""
    s = driver.store
    other = driver.open()
    other.start_run("t")
    (lease,) = other.commit_many((), claim=ClaimRequest("w1", 30.0)).leases
    token = s.change_token()
    assert list(other.commit_many((Commit(lease, "ack"),)).results) == [CasResult.OK]
    assert s.commits_move_token() is (driver.name == "sqlite") or driver.name == "pgbouncer"
    if s.commits_move_token():  # (PgBouncer: only when it polls, with no LISTEN beside it)
        assert s.wait_change(token, 30) != token
