"""The producer side of the store, on every backend: idempotency keys (with a race of many
processes), bulk starts, transactional enqueue (commit and rollback), waiting for a result,
queues and priorities."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from typing import Any

import pg_session
import psycopg
import pytest
from helpers import FakeClock
from store_backends import TTL, Backend, advance, claim, commit, fail_run, finish

from workerproc.store import CasResult, Commit, InvalidPayload, Store, StoreError, open_store


# -- idempotency keys ----------------------------------------------------------------------------
def test_a_key_makes_the_start_idempotent(s: Store) -> None:
    first = s.start_run("charge", {"amount": 5}, key="order-17")
    again = s.start_run("charge", {"amount": 999}, key="order-17", queue="other", priority=9)
    assert again == first
    assert len(s.list_runs()) == 1
    (task,) = s.get_tasks(first)
    assert task.payload == {"amount": 5}  # nothing of the second start was written
    run = s.get_run(first)
    assert run is not None and (run.key, run.queue, run.priority) == ("order-17", "default", 0)
    assert s.start_run("charge", key="order-18") != first


def test_a_key_survives_the_runs_end(s: Store) -> None:
    run_id = s.start_run("t", key="k")
    lease = claim(s)
    assert finish(s, lease, lease.revision, {"done": True}) is CasResult.OK
    assert s.start_run("t", key="k") == run_id  # finished, not pruned: still the same run
    assert len(s.list_runs()) == 1


def _start_with_key(url: str, barrier: Any, out: Any) -> None:
    store = open_store(url)  # opened in the child, after fork
    barrier.wait(30)
    out.put([store.start_run("charge", {"i": i}, key=f"request-{i}") for i in range(50)])
    store.close()


@pytest.mark.slow
def test_concurrent_starts_with_one_key_make_one_run(backend: Backend) -> None:
    """Eight processes retry the same 50 requests at once: 50 runs, and every process was
    answered with the same id for the same key."""
    backend.open().close()  # migrate first, so the race is about the keys
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_start_with_key, args=(backend.url, barrier, out))
             for _ in range(8)]  # fmt: skip
    for p in procs:
        p.start()
    answers = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 8
    assert all(a == answers[0] for a in answers)
    store = backend.open()
    try:
        assert len(store.list_runs(limit=1000)) == 50
        assert len(set(answers[0])) == 50
    finally:
        store.close()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"key": ""}, "key must be"),
        ({"key": "k" * 256}, "key must be"),
        ({"queue": ""}, "queue must be"),
        ({"queue": "a b"}, "queue must be"),
        ({"priority": 1001}, "priority must be"),
        ({"priority": 1.5}, "priority must be"),
        ({"delay": float("inf")}, "delay must be"),
        ({"delay": -1}, "delay must be"),
    ],
)
def test_run_options_are_checked(s: Store, kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidPayload, match=words):
        s.start_run("t", **kwargs)
    assert s.list_runs() == []


# -- bulk starts -----------------------------------------------------------------------------------
def test_start_runs_returns_ids_in_order_and_keeps_keys(s: Store) -> None:
    existing = s.start_run("t", key="dup")
    ids = s.start_runs(
        [
            {"task": "a", "payload": {"n": 1}},
            {"task": "b", "key": "dup"},
            {"task": "c", "state": {"s": 1}, "queue": "q", "priority": 3, "delay": 5},
            {"task": "d", "key": "new"},
            {"task": "e", "key": "new"},  # a key twice in one batch: one run
        ]
    )
    assert ids[1] == existing and ids[3] == ids[4]
    assert len(set(ids)) == 4 and ids[0] < ids[2] < ids[3]
    run = s.get_run(ids[2])
    assert run is not None and (run.state, run.queue, run.priority) == ({"s": 1}, "q", 3)
    assert [t.name for t in s.get_tasks(ids[0])] == ["a"]


def test_start_runs_is_one_transaction(s: Store) -> None:
    with pytest.raises(InvalidPayload):
        s.start_runs([{"task": "ok"}, {"task": "bad", "payload": float("nan")}])
    with pytest.raises(InvalidPayload, match="unknown fields"):
        s.start_runs([{"task": "ok"}, {"task": "x", "colour": "red"}])
    assert s.list_runs() == []


def test_ten_thousand_runs_start_in_one_call(backend: Backend) -> None:
    """One call, one transaction, every id distinct (how fast: scripts/bench_store, never a
    timed test)."""
    store = backend.open()
    try:
        items = [{"task": "import", "payload": {"row": i}} for i in range(10_000)]
        ids = store.start_runs(items)
        assert len(ids) == len(set(ids)) == 10_000
        assert store.stats().runs["pending"] == 10_000
    finally:
        store.close()


# -- transactional enqueue -------------------------------------------------------------------------
def test_a_run_started_in_the_callers_transaction_exists_iff_it_commits(
    s: Store, backend: Backend
) -> None:
    conn = backend.app_connection()
    try:
        backend.app_table(conn)
        conn.execute("INSERT INTO orders (item) VALUES ('book')")
        kept = s.start_run("ship", {"order": 1}, tx=conn)
        more = s.start_runs([{"task": "mail", "key": "m1"}], tx=conn)
        assert s.get_run(kept) is None  # not visible to others before the commit
        conn.commit()
        assert s.get_run(kept) is not None and s.get_run(more[0]) is not None
        assert claim(s).run_id == kept  # and claimable like any other

        conn.execute("INSERT INTO orders (item) VALUES ('lamp')")
        dropped = s.start_run("ship", {"order": 2}, tx=conn)
        conn.rollback()
        assert s.get_run(dropped) is None
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
        assert len(s.list_runs()) == 2
    finally:
        conn.close()


def test_transactional_enqueue_refuses_another_database_or_autocommit(
    s: Store, backend: Backend, tmp_path: Any
) -> None:
    with pytest.raises(StoreError, match="tx must be"):
        s.start_run("t", tx=object())
    if backend.name == "sqlite":
        other = sqlite3.connect(str(tmp_path / "other.db"))
        with pytest.raises(StoreError, match="not"):
            s.start_run("t", tx=other)
        other.close()
        auto = sqlite3.connect(backend.path, isolation_level=None)  # type: ignore[attr-defined]
        with pytest.raises(StoreError, match="autocommit"):
            s.start_run("t", tx=auto)
        auto.close()
    if backend.name == "postgres":
        other = psycopg.connect(pg_session.ADMIN_URL)  # the server's database, not the store's
        with other, pytest.raises(StoreError, match="not"):
            s.start_run("t", tx=other)
        with psycopg.connect(pg_session.database_url(), autocommit=True) as auto:
            with pytest.raises(StoreError, match="autocommit"):
                s.start_run("t", tx=auto)
            with auto.transaction():  # an explicit transaction on an autocommit connection
                s.start_run("t", tx=auto)
                with pytest.raises(psycopg.errors.DivisionByZero):
                    auto.execute("SELECT 1 / 0")
        assert s.list_runs() == []  # rolled back with the failed transaction
        with psycopg.connect(pg_session.database_url()) as failed:
            with pytest.raises(psycopg.errors.DivisionByZero):
                failed.execute("SELECT 1 / 0")
            with pytest.raises(StoreError, match="failed"):
                s.start_run("t", tx=failed)
    assert s.list_runs() == []


# -- waiting for a result --------------------------------------------------------------------------
@pytest.mark.parametrize("ending", ["succeeded", "failed", "cancelled"])
def test_wait_returns_when_the_run_ends(backend: Backend, ending: str) -> None:
    store = backend.open()
    run_id = store.start_run("t")
    lease = claim(store)

    def finish_soon() -> None:
        other = backend.open()  # another connection: the waiter learns of it by the token
        try:
            time.sleep(0.2)
            if ending == "succeeded":
                finish(other, lease, lease.revision, {"ok": 1}, result="done")
            elif ending == "failed":
                fail_run(other, run_id, "boom")
            else:
                other.cancel_run(run_id)
        finally:
            other.close()

    t = threading.Thread(target=finish_soon)
    t.start()
    try:
        run = store.wait(run_id, timeout=30)
        assert run.status == ending
        if ending == "succeeded":
            assert run.result == "done"
    finally:
        t.join(30)
        store.close()


def test_wait_times_out(s: Store) -> None:
    run_id = s.start_run("t")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still pending"):
        s.wait(run_id, timeout=0.2)
    assert time.monotonic() - started >= 0.2


def test_wait_for_an_unknown_run(s: Store) -> None:
    with pytest.raises(StoreError, match="no run with id 999"):
        s.wait(999, timeout=1)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, "soon"])
def test_wait_refuses_a_timeout_that_is_no_number_of_seconds(s: Store, timeout: Any) -> None:
    run_id = s.start_run("t")
    started = time.monotonic()
    with pytest.raises(ValueError, match="timeout must be from 0 to"):
        s.wait(run_id, timeout=timeout)
    assert time.monotonic() - started < 1.0  # refused, not waited on (nor spun)


def test_start_runs_in_the_callers_transaction_is_all_or_nothing(
    s: Store, backend: Backend
) -> None:
    """A bad item anywhere in the batch: none of the batch exists when the caller commits, and
    the caller's own work in that transaction is untouched."""
    conn = backend.app_connection()
    try:
        backend.app_table(conn)
        conn.execute("INSERT INTO orders (item) VALUES ('book')")
        with pytest.raises(InvalidPayload):
            s.start_runs([{"task": "ship"}, {"task": "bad\ud800"}], tx=conn)
        conn.commit()
        assert s.list_runs() == []
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    finally:
        conn.close()


def test_start_runs_undoes_its_own_inserts_when_the_database_refuses_one(tmp_path: Any) -> None:
    """SQLite: the application's own trigger refuses the second run mid-batch; the first must
    not stay behind in the caller's transaction (a savepoint undoes it)."""
    path = str(tmp_path / "app.db")
    s = open_store(path)
    conn = sqlite3.connect(path, timeout=10)
    try:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        conn.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON main.runs WHEN NEW.task = 'refused' "
            "BEGIN SELECT RAISE(ABORT, 'refused by the application'); END"
        )
        conn.execute("INSERT INTO orders (item) VALUES ('book')")
        with pytest.raises(StoreError, match="refused by the application"):
            s.start_runs([{"task": "ship"}, {"task": "refused"}], tx=conn)
        conn.commit()
        assert s.list_runs() == []
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    finally:
        conn.close()
        s.close()


# -- queues and priorities -------------------------------------------------------------------------
def test_a_worker_claims_only_from_the_queues_it_serves(s: Store) -> None:
    cheap = s.start_run("t", queue="cheap")
    model = s.start_run("t", queue="model")
    assert s.claim("w", TTL, queues=["nothing"]) is None
    lease = s.claim("w", TTL, queues=["model"])
    assert lease is not None and lease.run_id == model
    assert s.claim("w", TTL, queues=["model"]) is None
    got = s.claim("w", TTL, queues=["cheap", "model"])
    assert got is not None and got.run_id == cheap


def test_higher_priority_first_then_r1_order(s: Store, clock: FakeClock) -> None:
    low = s.start_run("t", priority=-1)
    first = s.start_run("t")
    clock.advance(1)
    second = s.start_run("t")
    urgent = s.start_run("t", priority=5)
    later_urgent = s.start_run("t", priority=5, delay=10)  # not due: never blocks the others
    order = [claim(s, f"w{i}").run_id for i in range(4)]
    assert order == [urgent, first, second, low]
    assert s.claim("w", TTL) is None
    clock.advance(10)
    assert claim(s).run_id == later_urgent


def test_a_batch_claim_orders_across_queues_by_priority(s: Store) -> None:
    a = [s.start_run("t", queue="a") for _ in range(3)]
    b = s.start_run("t", queue="b", priority=2)
    leases = s.claim("w", TTL, limit=3, queues=["a", "b"])
    assert {lease.run_id for lease in leases} == {b, a[0], a[1]}


def test_advance_keeps_the_runs_queue_or_moves_it(s: Store) -> None:
    run_id = s.start_run("prepare", queue="cheap")
    lease = claim(s)
    assert advance(s, lease, lease.revision, {}, "call") is CasResult.OK
    assert s.claim("w", TTL, queues=["model"]) is None
    lease = s.claim("w", TTL, queues=["cheap"])
    assert lease is not None and lease.task == "call"
    moved = Commit(lease, "advance", expected_revision=lease.revision, new_state={},
                   next_task="render", next_queue="gpu")  # fmt: skip
    assert commit(s, moved).result is CasResult.OK
    got = s.claim("w", TTL, queues=["gpu"])
    assert got is not None and got.task == "render" and got.run_id == run_id
    run = s.get_run(run_id)
    assert run is not None and run.queue == "gpu"


def test_stats_and_listing_by_queue(s: Store) -> None:
    s.start_run("t", queue="a")
    s.start_run("t", queue="a", delay=60)
    s.start_run("t", queue="b")
    claim(s)
    stats = s.stats()
    assert set(stats.queues) == {"a", "b"}
    qa, qb = stats.queues["a"], stats.queues["b"]
    assert (qa.ready + qa.leased, qa.delayed) == (1, 1) and qb.ready + qb.leased == 1
    assert sum(qa.runs.values()) == 2
    assert [r.queue for r in s.list_runs(queue="b")] == ["b"]
    assert s.next_ready_at(["b"]) is not None
