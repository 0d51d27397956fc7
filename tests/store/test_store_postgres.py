"""What only PostgreSQL has: the database clock against skewed hosts, migrations racing under the
advisory lock, lost connections (``pg_terminate_backend``) under load, the LISTEN connection
behind ``change_token``, and the schema checks. The protocol itself runs on both backends in
test_store_protocol / _operations / _stateful / _multiprocess / _audit."""

from __future__ import annotations

import json
import multiprocessing
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pg_session
import psycopg
import pytest
from helpers import wait_for
from pg_counting import CountingDialect, counting_store
from store_backends import PostgresBackend, advance, finish, renew_until

from supervisor.loop.storegate import StoreGate
from workerproc.store import (
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    open_store,
)
from workerproc.store.postgres.dialect import PostgresDialect
from workerproc.store.postgres.schema import SCHEMA_VERSION, VERSION_TABLE


def terminate(pg: PostgresBackend, *, except_pid: int | None = None) -> int:
    """End every leasekeeper session on the test database (as a server restart would)."""
    with pg.connect() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = 'leasekeeper' "
            "AND pid <> pg_backend_pid() AND pid IS DISTINCT FROM %s",
            (except_pid,),
        ).fetchall()
    return len(rows)


# -- the database clock --------------------------------------------------------------------------
SKEWED = textwrap.dedent(
    """
    import json, sys, time
    real = time.time
    skew = float(sys.argv[2])
    time.time = lambda: real() + skew          # this host's clock is minutes off
    time.time_ns = lambda: int((real() + skew) * 1e9)
    from workerproc.store import open_store
    store = open_store(sys.argv[1])
    out = {"host_now": time.time()}
    for line in sys.stdin:
        op = json.loads(line)
        if op["do"] == "claim":
            lease = store.claim("skewed", op["ttl"])
            out = {"lease": None if lease is None else
                   {k: v for k, v in lease.__dict__.items() if k != "options"}}
        elif op["do"] == "renew":
            from workerproc.store import Lease
            out = {"renewed": store.renew_many([Lease(**op["lease"])], op["ttl"])[0]}
        elif op["do"] == "now":
            out = {"store_now": store.now(), "host_now": time.time()}
        print(json.dumps(out), flush=True)
    """
)


class Skewed:
    """A store in another process whose host clock is ``skew`` seconds off."""

    def __init__(self, url: str, skew: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SKEWED, url, str(skew)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, **op: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(op) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the skewed process died"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def skewed(pg: PostgresBackend) -> Any:
    made: list[Skewed] = []

    def make(skew: float) -> Skewed:
        made.append(Skewed(pg.url, skew))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_host_ten_minutes_ahead_can_neither_steal_a_lease_nor_stamp_its_own_time(
    pg: PostgresBackend, skewed: Any
) -> None:
    store = pg.open()
    store.start_run("t")
    held = store.claim("honest", 30)
    assert held is not None
    ahead = skewed(600.0)
    assert ahead.ask(do="now")["host_now"] - store.now() > 590  # the skew is real
    assert ahead.ask(do="claim", ttl=30)["lease"] is None  # the live lease is not "expired"
    assert store.release(held)
    lease = ahead.ask(do="claim", ttl=30)["lease"]
    assert lease is not None and lease["attempt"] == 2
    now = store.now()
    assert abs(lease["claimed_at"] - now) < 5  # the database's time, not the host's
    assert abs(lease["expires_at"] - (now + 30)) < 5
    assert store.claim("honest", 30) is None  # and the lease holds for everyone
    store.close()


def test_a_host_ten_minutes_behind_cannot_keep_an_expired_lease(
    pg: PostgresBackend, skewed: Any
) -> None:
    store = pg.open()
    store.start_run("t")
    behind = skewed(-600.0)
    lease = behind.ask(do="claim", ttl=1.0)["lease"]
    assert lease is not None and abs(lease["claimed_at"] - store.now()) < 5
    # to that host its lease has ten minutes left; to the database it ends in one second
    taken = wait_for(lambda: store.claim("honest", 30), timeout=30, what="the takeover")
    assert taken.attempt == 2 and taken.takeover
    assert behind.ask(do="renew", lease=lease, ttl=30)["renewed"] is None
    assert [r.op for r in store.fence_rejections()] == ["renew"]
    store.close()


# -- migrations ----------------------------------------------------------------------------------
def _open_and_close(url: str, barrier: Any) -> None:
    barrier.wait(30)
    open_store(url).close()


def test_hosts_starting_at_once_migrate_once(pg: PostgresBackend) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_and_close, args=(pg.url, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    with pg.connect() as conn:
        rows = conn.execute(f"SELECT version FROM {VERSION_TABLE} ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    store = pg.open()
    assert store.start_run("t") == 1
    store.close()


def test_a_newer_schema_is_refused(pg: PostgresBackend) -> None:
    pg.open().close()
    with pg.connect() as conn:
        conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew, match="newer"):
        pg.open()


def test_a_foreign_runs_table_is_not_taken_for_ours(pg: PostgresBackend) -> None:
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg.schema}")
        conn.execute(f"CREATE TABLE {pg.schema}.runs (id int)")
    with pytest.raises(StoreCorrupt, match="not leasekeeper's"):
        pg.open()


def test_readers_may_refuse_to_create_the_schema(pg: PostgresBackend) -> None:
    with pytest.raises(StoreError, match="no leasekeeper schema"):
        open_store(pg.url, migrate=False)
    pg.open().close()
    open_store(pg.url, migrate=False).close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u@127.0.0.1/x?schema=Bad-Name", "schema must match"),
        ("postgresql://u@127.0.0.1/x?busy_timeout=0", "busy_timeout must be above 0"),
        ("postgresql://u@127.0.0.1/x?busy_timeout=soon", "busy_timeout must be a number"),
    ],
)
def test_bad_options_are_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        open_store(url)


def test_an_unreachable_server_is_unavailable_and_the_password_stays_secret() -> None:
    url = "postgresql://someone:hunter2@127.0.0.1:1/none?busy_timeout=0.3"
    with pytest.raises(StoreUnavailable) as info:
        open_store(url)
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


# -- a worker frozen inside a transaction --------------------------------------------------------
def test_an_exchange_frozen_mid_transaction_frees_its_run_within_the_idle_bound(
    pg: PostgresBackend,
) -> None:
    """R4's bound on PostgreSQL: a worker stopped inside its exchange (here: a transaction that
    locked the run and then sleeps, as a SIGSTOPped process would) holds the run's row lock no
    longer than ``idle_in_transaction``; the server ends that session, so another worker takes
    the expired lease over long before the frozen one wakes, and the frozen one's commit
    fails instead of landing."""
    frozen = open_store(pg.url, idle_in_transaction=0.3)
    other = pg.open()
    run_id = other.start_run("t")
    lease = frozen.claim("frozen", 0.5)
    assert lease is not None
    outcome: list[BaseException | None] = []

    def stall(c: Any, now: float | None) -> None:  # the exchange locks the run, then freezes
        c.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run_id,))
        time.sleep(4.0)

    def exchange() -> None:
        try:
            frozen.dialect.write(lambda tx: stall(tx.cur, tx.now), runs=[run_id])  # type: ignore[attr-defined]
            outcome.append(None)
        except StoreError as exc:
            outcome.append(exc)

    t = threading.Thread(target=exchange)
    began = time.monotonic()
    t.start()
    taken = wait_for(lambda: other.claim("other", 30.0), timeout=10, interval=0.02,
                     what="the run taken over")  # fmt: skip
    took = time.monotonic() - began
    t.join(10)
    assert taken.run_id == run_id and taken.attempt == 2
    assert took < 3.0, f"the frozen transaction held the run for {took:.1f} s"
    assert outcome and isinstance(outcome[0], StoreError)  # its session was ended: no commit
    frozen.close()
    other.close()


@pytest.mark.parametrize("value", ["0", "soon", "nan"])
def test_the_idle_in_transaction_bound_has_a_range(pg: PostgresBackend, value: str) -> None:
    with pytest.raises(StoreError, match="idle_in_transaction must be"):
        open_store(f"{pg.url}&idle_in_transaction={value}")


# -- lost connections ----------------------------------------------------------------------------
def test_a_terminated_connection_is_replaced_and_nothing_is_lost(pg: PostgresBackend) -> None:
    store = pg.open()
    store.start_run("t")
    lease = store.claim("w", 30)
    assert lease is not None
    assert terminate(pg) >= 1
    assert store.renew(lease, 30)  # the transaction never reached COMMIT: retried, once
    assert terminate(pg) >= 1
    assert store.ack(lease)
    run = store.get_run(lease.run_id)
    assert run is not None and run.status == "succeeded"
    store.close()


def test_a_renewal_without_a_connection_is_an_error_not_a_lost_lease(pg: PostgresBackend) -> None:
    store = open_store(pg.url + "&busy_timeout=0.5")
    assert isinstance(store.dialect, PostgresDialect)
    store.start_run("t")
    lease = store.claim("w", 30)
    assert lease is not None
    store.dialect.conninfo = "postgresql://postgres@127.0.0.1:1/nowhere"  # the server is gone
    terminate(pg)
    with pytest.raises(StoreUnavailable):
        renew_until(store, lease, 30)
    store.close()
    assert pg.open().renew(lease, 30)  # the lease itself was never lost


def _busy_worker(url: str, k: int, out_dir: str) -> None:
    """Claim and ack until no work is left, retrying whatever the lost connections break."""
    store = open_store(url)
    errors, done = 0, 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            lease = store.claim(f"w{k}", 5.0)
            if lease is None:
                if store.next_ready_at() is None:
                    break
                time.sleep(0.05)
                continue
            if advance(store, lease, lease.revision, {"k": k}, "again") if lease.task == "first" \
                    else finish(store, lease, lease.revision, {"k": k}):  # fmt: skip
                done += 1
        except StoreUnavailable:
            errors += 1
            time.sleep(0.05)
    store.close()
    Path(out_dir, f"{k}.json").write_text(json.dumps({"errors": errors, "done": done}))


@pytest.mark.slow
def test_workers_survive_their_backends_being_killed_under_load(
    pg: PostgresBackend, tmp_path: Path
) -> None:
    store = pg.open()
    runs = [store.start_run("first") for _ in range(400)]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_busy_worker, args=(pg.url, k, str(tmp_path))) for k in range(4)]
    for p in procs:
        p.start()
    kills = 0
    while any(p.is_alive() for p in procs) and kills < 200:
        kills += terminate(pg)
        time.sleep(0.05)
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert kills >= 5  # the load really lost its connections
    assert all(s.status == "succeeded" for s in (store.get_run(r) for r in runs) if s), runs
    assert store.stats().runs == {"succeeded": len(runs)}
    assert store.integrity_violations() == []
    store.close()


# -- change_token --------------------------------------------------------------------------------
def test_change_token_costs_no_round_trip_and_wakes_on_notify(pg: PostgresBackend) -> None:
    reader, writer = counting_store(pg.url), pg.open()
    token = reader.change_token()
    before = CountingDialect.transactions
    for _ in range(200):
        assert reader.change_token() == token  # nothing happened: no query either
    assert CountingDialect.transactions == before
    writer.start_run("a")
    wait_for(lambda: reader.change_token() != token, timeout=10, interval=0.005)
    assert CountingDialect.transactions == before
    reader.close()
    writer.close()


def test_change_token_survives_a_lost_listening_connection(pg: PostgresBackend) -> None:
    reader, writer = pg.open(), pg.open()
    token = reader.change_token()
    terminate(pg)
    # the lost connection itself moves the token (notifications may have been missed)
    token = wait_for(lambda: (t := reader.change_token()) != token and t, timeout=10)
    writer.start_run("a")
    wait_for(lambda: reader.change_token() != token, timeout=10, interval=0.005)
    reader.close()
    writer.close()


def test_integrity_reports_a_superseded_commit_and_overlapping_leases(
    pg: PostgresBackend,
) -> None:
    store = pg.open()
    one, two = store.start_run("t"), store.start_run("t")
    lease = store.claim("a", 10)
    assert lease is not None and store.ack(lease)
    with pg.connect() as conn:  # what a zombie write would leave, and what a broken claim would
        conn.execute("UPDATE tasks SET attempts = 2 WHERE run_id = %s", (one,))
        with pytest.raises(psycopg.errors.UniqueViolation):  # two leases in one run: the key
            conn.execute(
                "INSERT INTO leases (run_id, task_id, owner, attempts, attempt_base, "
                "expires_at, claimed_at) VALUES (%s, 1, 'x', 1, 0, 1e12, 0), "
                "(%s, 1, 'y', 1, 0, 1e12, 0)",
                (two, two),
            )
        # the one a broken claim could still leave: a live lease on a task that is not the
        # run's pending one
        conn.execute(
            "INSERT INTO leases (run_id, task_id, owner, attempts, attempt_base, expires_at, "
            "claimed_at) VALUES (%s, %s, 'x', 1, 0, 1e12, 0)",
            (two, lease.task_id),
        )
    found = store.integrity_violations()
    assert any("superseded" in v and f"run {one}" in v for v in found)
    assert any(f"run {two} holds 2 live leases" in v for v in found)
    store.close()


def test_one_store_serves_many_threads_each_on_its_own_connection(pg: PostgresBackend) -> None:
    store = pg.open()
    pids: set[int] = set()

    def work() -> None:
        def read(cur: Any, _now: Any) -> int:
            return int(cur.execute("SELECT pg_backend_pid()").fetchone()[0])

        pids.add(store.dialect.read(lambda tx: read(tx.cur, tx.now)))  # type: ignore[attr-defined]

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(pids) == 4
    store.close()


def test_a_starting_supervisor_releases_only_dead_owners_of_its_own_host(
    pg: PostgresBackend,
) -> None:
    """Many hosts share the database: a host whose pid 1 or a long-dead pid appears in another
    host's owner string must not release that host's live leases."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here_dead = f"{socket.gethostname()}:{dead.pid}:1.00:aa"
    elsewhere = f"not-{socket.gethostname()}:{dead.pid}:1.00:bb"
    store = pg.open()
    for owner in (here_dead, elsewhere):
        store.start_run("t")
        assert store.claim(owner, 600) is not None
    released = StoreGate(pg.url).release_dead_owners()
    assert released == {here_dead: 1}
    assert [lease.owner for lease in store.stats().leases if lease.expires_at > store.now()] == [
        elsewhere
    ]
    store.close()
