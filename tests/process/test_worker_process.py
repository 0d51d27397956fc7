"""The worker as a real process (``python -m workerproc``): real forks, real signals, a real
SQLite file or PostgreSQL database. Short ttls, waits on state with generous bounds; no
assertion depends on tight timing."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pg_session
import psutil
import psycopg
import pytest
from helpers import wait_for
from procs import TESTS, Proc, events, spawn_worker

from workerproc import exitcodes
from workerproc.store import Store, is_postgres_url, open_store

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def write_lock_held(db: str) -> Iterator[None]:
    """Hold the database's write lock from another connection (every write waits)."""
    if is_postgres_url(db):
        with psycopg.connect(pg_session.database_url()) as conn, conn.transaction():
            schema = db.rsplit("schema=", 1)[1]
            conn.execute(f"LOCK TABLE {schema}.runs, {schema}.tasks IN EXCLUSIVE MODE")
            yield
        return
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.fixture
def real_store(db: str) -> Iterator[Store]:
    s = open_store(db)
    yield s
    s.close()


def started(workdir: Path, run_id: int, n: int = 1) -> list[list[str]]:
    return wait_for(
        lambda: (
            [e for e in events(workdir) if e[0] == "start" and int(e[1]) == run_id][:n]
            if len([e for e in events(workdir) if e[0] == "start" and int(e[1]) == run_id]) >= n
            else None
        ),
        what=f"{n} start(s) of run {run_id}",
    )


def finished(store: Store, run_id: int, status: str = "succeeded", timeout: float = 30.0) -> None:
    def check() -> bool:
        run = store.get_run(run_id)
        return run is not None and run.status == status

    wait_for(check, timeout=timeout, what=f"run {run_id} {status}")


def test_sigkill_mid_task_is_taken_over_with_next_attempt(workdir, db, real_store, procs):
    run_id = real_store.start_run("record", {"seconds": 1.0})
    a = spawn_worker(db, workdir, "--lease-ttl", "1")
    procs.append(a)
    started(workdir, run_id)
    a.signal(signal.SIGKILL)
    a.wait()
    b = spawn_worker(db, workdir, "--lease-ttl", "1")
    procs.append(b)
    finished(real_store, run_id)
    run = real_store.get_run(run_id)
    assert run is not None and run.state["attempt"] == 2 and run.state["pid"] == b.pid
    (task,) = real_store.get_tasks(run_id)
    assert task.attempts == 2


def stop_outside_a_write(proc: Proc, db: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no SQLite write transaction (its heartbeat's
    renewal, say): one stopped inside one would hold the write lock, and nobody could take
    its task over until it woke (docs/protocol.md, R4). Resumed and stopped again until then."""
    for _ in range(100):
        proc.signal(signal.SIGSTOP)
        wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED,
                 timeout=10, interval=0.001, what="stopped")  # fmt: skip
        if is_postgres_url(db):
            return  # the server ends a transaction it leaves idle: no lock outlives that
        probe = sqlite3.connect(db, isolation_level=None, timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:  # locked: it froze inside a write
            proc.signal(signal.SIGCONT)
            time.sleep(0.01)
        finally:
            probe.close()
    pytest.fail("the worker was never stopped outside a write transaction")


def test_sigstop_zombie_commit_is_refused(workdir, db, real_store, procs):
    run_id = real_store.start_run("record", {"seconds": 1.5})
    a = spawn_worker(db, workdir, "--lease-ttl", "1")
    procs.append(a)
    started(workdir, run_id)
    stop_outside_a_write(a, db)  # a pause past the ttl: A becomes a zombie
    b = spawn_worker(db, workdir, "--lease-ttl", "1")
    procs.append(b)
    started(workdir, run_id, n=2)  # B took over and runs the task under a live lease
    a.signal(signal.SIGCONT)
    # A wakes while B holds the run: its sleep is over, so it renews or commits at once, and
    # only the fence (owner + attempt) stands between it and the run's state.
    wait_for(lambda: "lease lost" in a.output() or "commit refused" in a.output(), what="refusal")
    mid = real_store.get_run(run_id)
    assert mid is not None and mid.revision == 0, "a zombie's write was accepted"
    finished(real_store, run_id)
    run = real_store.get_run(run_id)
    assert run is not None and run.state == {"attempt": 2, "pid": b.pid}
    assert run.revision == 1  # exactly one committed write


def test_long_task_keeps_its_lease_through_heartbeats(workdir, db, real_store, procs):
    run_id = real_store.start_run("record", {"seconds": 3.0})  # 6x the ttl
    a = spawn_worker(db, workdir, "--lease-ttl", "0.5")
    b = spawn_worker(db, workdir, "--lease-ttl", "0.5")
    procs += [a, b]
    finished(real_store, run_id)
    (task,) = real_store.get_tasks(run_id)
    assert task.attempts == 1
    assert len([e for e in events(workdir) if e[0] == "start"]) == 1


def test_database_locked_longer_than_heartbeat_interval_is_not_a_lost_lease(
    workdir, db, real_store, procs
):
    run_id = real_store.start_run("record", {"seconds": 3.0})
    a = spawn_worker(db, workdir, "--lease-ttl", "3")  # renew every 1 s
    procs.append(a)
    started(workdir, run_id)
    with write_lock_held(db):
        time.sleep(1.6)  # the lock itself is the fault: held past one heartbeat interval, < ttl
    finished(real_store, run_id)
    (task,) = real_store.get_tasks(run_id)
    assert task.attempts == 1
    assert "lease lost" not in a.output()


def test_killed_postgres_connections_are_not_a_lost_lease(workdir, procs):
    """Every connection of the worker (claim loop, heartbeat, listener) is terminated again and
    again while its task runs: it reconnects, keeps its lease and commits once."""
    db = pg_session.schema_url("w")
    real_store = open_store(db)
    run_id = real_store.start_run("record", {"seconds": 3.0})
    a = spawn_worker(db, workdir, "--lease-ttl", "3")  # renew every 1 s
    procs.append(a)
    started(workdir, run_id)
    deadline, killed = time.monotonic() + 2.5, 0
    with psycopg.connect(pg_session.database_url(), autocommit=True) as admin:
        while time.monotonic() < deadline:
            killed += len(admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND application_name = 'leasekeeper'"
            ).fetchall())  # fmt: skip
            time.sleep(0.2)
    finished(real_store, run_id)
    (task,) = real_store.get_tasks(run_id)
    assert task.attempts == 1
    assert "lease lost" not in a.output()
    assert killed >= 4  # the worker's connections really went, again and again
    real_store.close()


SKEW = """import time
_real = time.time
time.time = lambda: _real() + {skew}
time.time_ns = lambda: int((_real() + {skew}) * 1e9)
"""


def test_workers_with_skewed_clocks_share_leases_by_the_database_clock(workdir, procs):
    """Two workers, one ten minutes ahead and one ten minutes behind: each task is leased,
    renewed and expired by the database's clock, so they neither steal nor keep leases."""
    db = pg_session.schema_url("w")
    store = open_store(db)
    workers = []
    for name, skew in (("ahead", 600.0), ("behind", -600.0)):
        site = workdir / name
        site.mkdir()
        (site / "sitecustomize.py").write_text(SKEW.format(skew=skew))
        path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
        workers.append(spawn_worker(db, workdir, "--lease-ttl", "1", name=name,
                                    env={"PYTHONPATH": path}))  # fmt: skip
    procs += workers
    runs = [store.start_run("record", {"seconds": 1.5}) for _ in range(4)]  # > ttl: renewals
    for run_id in runs:
        finished(store, run_id, timeout=60)
    for run_id in runs:
        (task,) = store.get_tasks(run_id)
        assert task.attempts == 1  # nobody took a live lease over, nobody lost one
        assert task.claimed_at is not None and abs(task.claimed_at - time.time()) < 120
    assert store.fence_rejections() == [] and store.integrity_violations() == []
    for w in workers:
        assert "lease lost" not in w.output()
    store.close()


def test_an_idle_worker_wakes_on_new_work_long_before_its_poll_interval(
    workdir, db, real_store, procs
):
    """Idle wake-up: SQLite's data_version, PostgreSQL's LISTEN/NOTIFY. The poll interval is
    an hour: only the change token can wake the worker."""
    procs.append(spawn_worker(db, workdir, "--poll-interval", "3600"))
    first = real_store.start_run("noop")
    finished(real_store, first)  # the worker is up; it is idle from now on
    time.sleep(0.5)  # well into its idle wait
    for _ in range(3):
        finished(real_store, real_store.start_run("noop"), timeout=30)


def test_raising_handler_retries_with_backoff_then_exhausts(workdir, db, real_store, procs):
    run_id = real_store.start_run("boom")
    procs.append(spawn_worker(db, workdir, "--lease-ttl", "5", "--retry-backoff", "0.05"))
    finished(real_store, run_id, "failed")
    run = real_store.get_run(run_id)
    assert run is not None and run.failure_reason == "task_attempts_exhausted"
    assert run.last_error is not None and "RuntimeError: boom on purpose" in run.last_error
    assert "Traceback" in run.last_error
    (task,) = real_store.get_tasks(run_id)
    assert task.attempts == 3 and "boom on purpose" in (task.last_error or "")


def test_process_that_dies_on_every_attempt_fails_the_run(workdir, db, real_store, procs):
    run_id = real_store.start_run("die")
    for _ in range(6):  # what a supervisor would do: replace the dead worker
        run = real_store.get_run(run_id)
        if run is not None and run.status == "failed":
            break
        p = spawn_worker(db, workdir, "--lease-ttl", "0.5", "--poll-interval", "0.2")
        procs.append(p)
        try:
            p.wait(timeout=5)  # dies in the handler, or idles once the run failed
        except subprocess.TimeoutExpired:
            p.kill()
    run = real_store.get_run(run_id)
    assert run is not None and run.status == "failed"
    assert run.failure_reason == "task_attempts_exhausted"
    assert len([e for e in events(workdir) if e[0] == "start"]) == 3


def test_a_task_no_worker_serves_waits_unclaimed_and_wedges_nothing(workdir, db, real_store, procs):
    """B22: a worker claims only the tasks its app has: a run of another task waits (for a
    worker that serves it), no attempt spent, shown as such; the rest of the queue flows."""
    run_id = real_store.start_run("no_such_task")
    ok = real_store.start_run("noop")
    procs.append(spawn_worker(db, workdir))
    finished(real_store, ok)  # the pool is not wedged
    wait_for(lambda: real_store.unserved([run_id]), timeout=30)
    assert real_store.unserved([run_id]) == {run_id: "no worker serves task no_such_task"}
    assert real_store.get_run(run_id).status == "pending"
    assert real_store.get_tasks(run_id)[0].attempts == 0


def test_task_timeout_exits_with_its_code_and_records_the_error(workdir, db, real_store, procs):
    run_id = real_store.start_run("sleepy", {"seconds": 30})
    p = spawn_worker(db, workdir, "--lease-ttl", "5", "--task-timeout", "0.5")
    procs.append(p)
    assert p.wait(timeout=20) == exitcodes.TASK_TIMEOUT
    (task,) = real_store.get_tasks(run_id)
    assert "TaskTimeout" in (task.last_error or "")
    assert task.lease_owner is None  # released: no waiting for the ttl
    assert not [e for e in events(workdir) if e[0] == "done"]


def test_except_exception_cannot_swallow_lease_lost(workdir, db, real_store, procs):
    run_id = real_store.start_run("stubborn", {"seconds": 20})
    a = spawn_worker(db, workdir, "--lease-ttl", "0.6")
    procs.append(a)
    started(workdir, run_id)
    owner = real_store.stats().leases[0].owner
    assert real_store.release_owner(owner) == 1  # the lease is gone under the handler
    wait_for(lambda: "lease lost" in a.output(), what="lease loss noticed")
    # the handler was aborted: it neither swallowed LeaseLost nor ran to its end, and the
    # worker went on claiming (it takes the task over again with the next attempt)
    wait_for(lambda: len([e for e in events(workdir) if e[0] == "start"]) >= 2, what="reclaim")
    assert not [e for e in events(workdir) if e[0] in ("swallowed", "done")]
    assert a.popen.poll() is None


def test_sigterm_drains_the_current_task_then_exits_zero(workdir, db, real_store, procs):
    run_id = real_store.start_run("record", {"seconds": 1.0})
    later = real_store.start_run("noop", delay=0)
    a = spawn_worker(db, workdir, "--lease-ttl", "5")
    procs.append(a)
    started(workdir, run_id)
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=20) == exitcodes.OK
    run = real_store.get_run(run_id)
    assert run is not None and run.status == "succeeded"
    other = real_store.get_run(later)
    assert other is not None
    if other.status != "succeeded":  # not started before TERM: must be handed back, not held
        assert real_store.stats().leased == 0


def test_worker_dies_with_its_parent(workdir, db, real_store, procs):
    run_id = real_store.start_run("noop")  # it runs only once the worker is past its start-up
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'workerproc', '--db', sys.argv[1],"
        " '--app', 'apps.basic:app', '--exit-with-parent'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, db],
        cwd=TESTS,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        finished(real_store, run_id)  # it asked for its parent's death signal before it claimed
        parent.kill()
        parent.wait()

        def gone() -> bool:
            try:
                return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
            except Exception:
                return True

        wait_for(gone, timeout=10, what="orphaned worker exit")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


def test_handler_that_ignores_lease_lost_ends_the_process(workdir, db, real_store, procs):
    run_id = real_store.start_run("deaf", {"seconds": 30})
    a = spawn_worker(db, workdir, "--lease-ttl", "0.6")
    procs.append(a)
    started(workdir, run_id)
    owner = real_store.stats().leases[0].owner
    real_store.release_owner(owner)
    assert a.wait(timeout=20) == exitcodes.LEASE_STUCK
    assert [e for e in events(workdir) if e[0] == "swallowed"]  # it was told, and ignored it
