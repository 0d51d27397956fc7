"""The outbox (docs/protocol.md B18), on both backends: every transition writes
exactly one event in its own transaction (none when it rolls back, only its refusal when it is
refused), ids in commit order (PostgreSQL: a transaction that commits after a later id is not
missed), named consumers, following, retention."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from helpers import FakeClock
from store_backends import TTL, Backend, advance, claim, commit, finish, renew_until

from workerproc.store import (
    CasResult,
    Commit,
    Event,
    InvalidOption,
    Store,
    open_async_store,
    open_store,
)
from workerproc.store.dialect import Tx
from workerproc.store.protocol.events import emit
from workerproc.store.protocol.operators import status


def kinds(s: Store, run_id: int | None = None) -> list[str]:
    return [e.kind for e in s.events(run=run_id)]


def test_every_transition_writes_one_event_with_its_details(s: Store, clock: FakeClock) -> None:
    run = s.start_run("first", {"n": 1}, key="k1", queue="q1")
    s.start_run("first", key="k1", queue="q1")  # the key is taken: nothing happens, no event
    (enqueued,) = s.events()
    assert (enqueued.kind, enqueued.run_id, enqueued.task, enqueued.attempt) == (
        "run.enqueued", run, "first", None)  # fmt: skip
    assert enqueued.data == {"queue": "q1", "key": "k1"}

    a = claim(s, "w1")
    assert advance(s, a, 0, {"step": 1}, "second") is CasResult.OK
    b = claim(s, "w1")
    assert commit(s, Commit(b, "release", error="boom", delay=0)).result is CasResult.OK
    c = claim(s, "w1")
    assert commit(s, Commit(c, "handback")).result is CasResult.OK
    d = claim(s, "w1")
    clock.advance(TTL + 1)  # w1's lease expires: w2 takes it over, w1 is a zombie now
    e = claim(s, "w2")
    assert finish(s, d, 1, {"late": True}) is CasResult.LEASE_LOST
    assert finish(s, e, 1, {"done": True}) is CasResult.OK

    events = s.events(run=run)
    assert [x.kind for x in events] == [
        "run.enqueued", "step.claimed", "step.committed", "step.claimed", "step.released",
        "step.claimed", "step.handed_back", "step.claimed", "lease.taken_over",
        "write.refused", "step.committed", "run.succeeded",
    ]  # fmt: skip
    by = {x.kind: x for x in events}
    assert [x.id for x in events] == sorted(x.id for x in events)
    claimed = events[1]
    assert (claimed.task, claimed.attempt, claimed.data["owner"]) == ("first", a.attempt, "w1")
    assert events[2].data["next"] == "second" and events[2].attempt == a.attempt
    assert (events[4].task, events[4].data["error"]) == ("second", "boom")
    assert events[6].data["owner"] == "w1" and events[6].attempt == c.attempt
    took = by["lease.taken_over"]
    assert (took.attempt, took.data["owner"]) == (e.attempt, "w2")
    assert (took.data["previous_owner"], took.data["previous_attempt"]) == ("w1", d.attempt)
    refused = by["write.refused"]
    assert (refused.attempt, refused.data["owner"], refused.data["op"]) == (d.attempt, "w1",
                                                                           "finish")  # fmt: skip
    assert by["run.succeeded"].attempt == e.attempt
    assert all(x.at > 0 for x in events)


def test_failures_cancels_retries_and_exhausted_claims_write_their_events(
    s: Store, clock: FakeClock
) -> None:
    failed = s.start_run("f")
    lease = claim(s)
    commit(s, Commit(lease, "fail", reason="bad_input", error="no"))
    assert kinds(s, failed) == ["run.enqueued", "step.claimed", "run.failed"]
    last = s.events(run=failed)[-1]
    assert last.data == {"reason": "bad_input", "error": "no"} and last.attempt == lease.attempt

    cancelled = s.start_run("c")
    assert s.cancel_run(cancelled) and not s.cancel_run(cancelled)  # the second changes nothing
    assert kinds(s, cancelled) == ["run.enqueued", "run.cancelled"]
    assert s.retry_run(cancelled)
    assert kinds(s, cancelled)[-1] == "run.retried"

    exhausted = s.start_run("x")
    s.cancel_run(cancelled)
    for owner in ("w2", "w3"):  # two workers die holding it (one's own takeover would wait)
        claim(s, owner, max_attempts=2)
        clock.advance(TTL + 1)
    assert s.claim("w1", TTL, max_attempts=2) is None  # attempt 3 fails the run instead
    assert kinds(s, exhausted) == ["run.enqueued", "step.claimed", "lease.taken_over",
                                   "run.failed"]  # fmt: skip
    assert s.events(run=exhausted)[-1].data["reason"] == "task_attempts_exhausted"


def test_the_pinned_single_lease_calls_write_their_events(s: Store, clock: FakeClock) -> None:
    run = s.start_run("t")
    lease = claim(s)
    assert s.ack(lease) and not s.ack(lease)  # the second is refused: only its refusal
    assert kinds(s, run) == ["run.enqueued", "step.claimed", "step.committed", "run.succeeded",
                             "write.refused"]  # fmt: skip
    other = s.start_run("t")
    lease = claim(s)
    clock.advance(TTL + 1)
    assert renew_until(s, lease, TTL) is None  # an expired lease is not renewed: refused
    assert s.compare_and_set(lease, 0, {}) is CasResult.LEASE_LOST
    assert s.release(lease) is False
    refusals = [e for e in s.events(run=other) if e.kind == "write.refused"]
    assert [e.data["op"] for e in refusals] == ["renew", "compare_and_set", "release"]
    assert len(s.fence_rejections()) == 4  # each refusal's evidence beside its event


def test_a_transition_that_rolls_back_writes_no_event(s: Store, backend: Backend) -> None:
    run = s.start_run("t")
    before = s.events()

    def cancel_then_fail(tx: Tx) -> None:
        status(tx, run)  # the run held first, as cancel_run holds it
        tx.count("CANCEL_RUN", {"run_id": run, "now": tx.now})
        emit(tx, "run.cancelled", run)
        raise RuntimeError("the transaction fails after its transition")

    with pytest.raises(RuntimeError):
        s.dialect.write(cancel_then_fail, runs=[run])
    assert s.get_run(run).status == "pending"  # type: ignore[union-attr]
    assert s.events() == before

    conn = backend.app_connection()  # the caller's own transaction decides
    try:
        backend.app_table(conn)
        conn.execute("INSERT INTO orders (item) VALUES ('lamp')")  # (opens the transaction)
        dropped = s.start_run("ship", tx=conn)
        conn.rollback()
        conn.execute("INSERT INTO orders (item) VALUES ('book')")
        kept = s.start_runs([{"task": "ship"}, {"task": "mail"}], tx=conn)
        conn.commit()
    finally:
        conn.close()
    enqueued = [(e.run_id, e.task) for e in s.events() if e.kind == "run.enqueued"]
    assert enqueued == [(run, "t"), (kept[0], "ship"), (kept[1], "mail")]
    assert dropped not in kept or backend.name == "sqlite"  # (SQLite may give its id again)


def test_a_batch_of_commits_writes_one_event_each(s: Store) -> None:
    runs = s.start_runs([{"task": "t"} for _ in range(6)])
    leases = s.claim("w1", TTL, limit=6)
    assert len(leases) == 6
    stale = Commit(leases[5], "finish", expected_revision=7)  # a conflict: no event at all
    out = s.commit_many(
        [Commit(x, "finish", new_state={"i": i}) for i, x in enumerate(leases[:3])]
        + [Commit(leases[3], "release", error="e"), Commit(leases[4], "handback"), stale],
        claim=None,
    )
    assert out.results[:5] == (CasResult.OK,) * 5 and out.results[5] is CasResult.CONFLICT
    for run in runs[:3]:
        assert kinds(s, run)[-2:] == ["step.committed", "run.succeeded"]
    assert kinds(s, runs[3])[-1] == "step.released"
    assert kinds(s, runs[4])[-1] == "step.handed_back"
    assert kinds(s, runs[5]) == ["run.enqueued", "step.claimed"]


def test_named_consumers_move_only_when_they_acknowledge(s: Store, clock: FakeClock) -> None:
    s.start_runs([{"task": "t"} for _ in range(5)])
    first = s.events(consumer="billing", limit=2)
    assert len(first) == 2
    assert s.events(consumer="billing", limit=2) == first  # reading moves nothing
    assert s.ack_events("billing", first[-1].id) == first[-1].id
    rest = s.events(consumer="billing")
    assert [e.id for e in rest] == [e.id for e in s.events(after=first[-1].id)]
    assert len(rest) == 3
    assert s.ack_events("billing", 1) == first[-1].id  # never moves back
    assert s.consumer_position("audit") == 0  # a new consumer starts at 0, and is kept
    with pytest.raises(InvalidOption):
        s.events(consumer="no spaces")
    with pytest.raises(InvalidOption):
        s.ack_events("billing", -1)
    with pytest.raises(InvalidOption):
        s.events(limit=0)

    clock.advance(3600)
    s.prune(60)  # every event is old; "audit" has acknowledged none: all stay
    assert len(s.events()) == 5
    s.ack_events("audit", rest[1].id)
    s.prune(60)  # up to the slowest consumer's position: billing's
    assert [e.id for e in s.events()] == [e.id for e in rest]
    s.ack_events("billing", rest[0].id)
    s.prune(60)
    assert [e.id for e in s.events()] == [e.id for e in rest[1:]]
    s.prune(60, force=True)  # every one but the newest: the next id counts on from it
    assert [e.id for e in s.events()] == [rest[-1].id]
    s.start_run("t")
    assert [e.id for e in s.events()] == [rest[-1].id, rest[-1].id + 1]
    assert s.drop_consumer("audit") and not s.drop_consumer("audit")


def test_follow_waits_for_new_events_without_spinning(s: Store) -> None:
    s.start_run("t")
    seen: list[Event] = []

    def follow() -> None:
        for event in s.follow(after=0, poll=5.0):
            seen.append(event)
            if len(seen) == 3:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    with open_store(s.url) as other:  # another store on the database starts what it sees
        other.start_runs([{"task": "t"}, {"task": "u"}])
    follower.join(10)
    assert not follower.is_alive()
    assert [e.task for e in seen] == ["t", "t", "u"]


@pytest.mark.parametrize("consumer", [None, "async-billing"])
def test_the_async_store_follows_events(s: Store, consumer: str | None) -> None:
    async def main() -> list[Any]:
        async with await open_async_store(s.url) as store:
            got: list[Any] = []
            await store.start_run("a")

            async def produce() -> None:
                await asyncio.sleep(0.2)
                await store.start_runs([{"task": "b"}, {"task": "c"}])

            producer = asyncio.create_task(produce())
            async for event in store.follow(consumer=consumer, poll=5.0):
                got.append((event.task, event.kind))
                if consumer:
                    await store.ack_events(consumer, event.id)
                if len(got) == 3:
                    break
            await producer
            if consumer:
                assert await store.events(consumer=consumer) == []
                assert await store.consumer_position(consumer) == (await store.events())[-1].id
            return got

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert got == [("a", "run.enqueued"), ("b", "run.enqueued"), ("c", "run.enqueued")]


def test_postgres_a_transaction_that_commits_after_a_later_one_is_not_missed(
    s: Store, backend: Backend
) -> None:
    """The race a plain sequence loses: T1 writes its event first (its ``seq`` is smaller) but
    commits after T2; a reader that stored "after T2's id" still reads T1's, numbered after."""
    if backend.name != "postgres":
        pytest.skip("SQLite's single writer orders ids by commit: T2 would wait for T1")
    conn = backend.app_connection()
    try:
        backend.app_table(conn)
        early = s.start_run("early", tx=conn)  # T1: written, not committed
        late = s.start_run("late")  # T2: commits first
        seen = s.events()
        assert [(e.run_id, e.task) for e in seen] == [(late, "late")]
        cursor = seen[-1].id
        conn.commit()  # T1 commits now
    finally:
        conn.close()
    after = s.events(after=cursor)
    assert [(e.run_id, e.task) for e in after] == [(early, "early")]
    assert after[0].id > cursor
    with backend.connect() as raw:  # the order they were written in is the other one
        rows = raw.execute("SELECT run_id FROM events ORDER BY seq").fetchall()
    assert [r[0] for r in rows] == [early, late]


def test_concurrent_writers_and_a_reader_after_its_cursor_miss_nothing(s: Store) -> None:
    """Writers whose transactions overlap and commit in any order; a reader that only ever
    asks "after the last id I saw" sees every event exactly once, in increasing ids."""
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        with open_store(s.url) as mine:
            cursor = 0
            while True:
                done = stop.is_set()  # the last pass starts after every writer finished
                for event in mine.events(after=cursor):
                    seen.append(event.id)
                    cursor = event.id
                if done:
                    return

    def write(i: int) -> None:
        with open_store(s.url) as mine:
            for j in range(15):

                def slow(tx: Tx, j: int = j) -> None:
                    emit(tx, "run.enqueued", None, f"w{i}", j)
                    tx.flush()  # written now, committed after the pause
                    time.sleep(0.001 * ((i * 7 + j * 3) % 5))

                mine.dialect.write(slow)

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    stop.set()
    reader.join(60)
    everything = [e.id for e in s.events(limit=1000)]
    assert len(everything) == 60
    assert seen == everything  # each once, in order, none missed


def test_event_data_keeps_any_text_exactly(s: Store) -> None:
    """Errors are written as they were said (quotes, backslashes, braces, percent signs,
    non-ASCII), whatever way the backend sends the event (PostgreSQL: bound by the driver)."""
    run = s.start_run("t")
    lease = claim(s)
    error = 'it\'s \\ a {weird} %(error)s %s; COMMIT; -- ünïcødé ☃ "quoted"\n' * 20
    assert commit(s, Commit(lease, "release", error=error)).result is CasResult.OK
    (released,) = [e for e in s.events(run=run) if e.kind == "step.released"]
    assert released.data["error"] == s.get_run(run).last_error  # type: ignore[union-attr]
    assert "ünïcødé ☃" in released.data["error"] and "%(error)s" in released.data["error"]
