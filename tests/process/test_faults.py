"""Faults a running pool must survive, with a real supervisor, real files and a real
filesystem: a full disk under the state file, the database deleted or replaced, made read-only
and writable again, and a worker that exits 0 while it holds a lease."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import error_line, invoke
from helpers import wait_for
from sv_harness import Supervisor

from supervisor import exitcodes
from supervisor.commands import remote
from workerproc.store import StoreUnavailable, open_store

pytestmark = pytest.mark.slow


def _run(*cmd: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(cmd), capture_output=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KB tmpfs we can fill: a real "No space left on device"."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        done = _run("mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(mnt))
    except OSError as exc:
        pytest.skip(f"SKIPPED LOUDLY: cannot run mount ({exc}); needs root with CAP_SYS_ADMIN")
    if done.returncode != 0:
        pytest.skip(f"SKIPPED LOUDLY: cannot mount a tmpfs to fill: {done.stderr.decode()}")
    try:
        yield mnt
    finally:
        _run("umount", "-l", str(mnt))


def fill(directory: Path) -> Path:
    """Write until the filesystem is full; return the file that filled it."""
    path = directory / "filler"
    with open(path, "wb", buffering=0) as fh:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * size)
    with pytest.raises(OSError) as full:
        (directory / "probe").write_bytes(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC
    return path


# -- disk full under the state file -----------------------------------------------------------
def test_a_full_disk_is_cannot_write_the_state_not_a_silent_loop(
    sv: Supervisor, small_fs: Path
) -> None:
    sv.pidfile = str(small_fs / "sv.pid")
    sv.start(n=1)
    sv.wait_event("ready")
    assert remote.health(sv.pidfile, max_age=2.0)[0] == exitcodes.OK
    filler = fill(small_fs)
    code, message = wait_for(
        lambda: (h := remote.health(sv.pidfile, max_age=2.0))[0] != exitcodes.OK and h,
        timeout=30,
        what="health to notice the stale state file",
    )
    assert code == exitcodes.STATE_UNWRITABLE, message
    assert "cannot write its state file" in message
    wait_for(lambda: len(sv.events("state_write_failed")) >= 1, what="the failure logged")
    os.remove(filler)
    wait_for(lambda: remote.health(sv.pidfile, max_age=2.0)[0] == exitcodes.OK,
             timeout=30, what="health to recover")  # fmt: skip
    wait_for(lambda: sv.events("state_write_recovered"), what="the recovery logged")
    # logged once each, not once a second
    assert len(sv.events("state_write_failed")) == 1
    assert len(sv.events("state_write_recovered")) == 1
    sv.signal(15)
    assert sv.wait_exit() == 0


# -- exit 0 while holding a lease -------------------------------------------------------------
def test_a_worker_that_exits_0_holding_a_lease_is_a_crash_and_its_lease_is_released(
    sv: Supervisor,
) -> None:
    run = sv.enqueue("exit0_once")
    sv.start("--lease-ttl", "60", n=1)
    # a released lease is claimed again at once; without the release this waits the 60 s ttl
    wait_for(lambda: sv.run_status(run) == "succeeded", timeout=20, what="the takeover")
    (first,) = [e for e in sv.events("worker_exited") if e.get("code") == 0]
    assert first["kind"] == "crashed" and first["leases"] == 1
    assert first["level"] == "warning" and "holding 1 lease(s)" in first["msg"]
    assert [e["count"] for e in sv.events("leases_released")] == [1]
    sv.signal(15)
    assert sv.wait_exit() == 0


# -- the database file deleted or replaced under a running pool --------------------------------
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_file_deleted_or_replaced_stops_the_pool(sv: Supervisor, how: str) -> None:
    for _ in range(200):
        sv.enqueue("sleep", {"s": 0.05})
    sv.start("--drain", n=2)
    sv.wait_event("ready")
    wait_for(lambda: sv.stats().runs.get("succeeded", 0) >= 3, what="some progress")
    if how == "deleted":
        os.remove(sv.db)
    else:
        other = sv.workdir / "other.db"
        open_store(str(other)).close()
        os.replace(other, sv.db)
    assert sv.wait_exit() == exitcodes.ERROR  # never "drain finished", never exit 0
    (gone,) = sv.events("database_gone")
    assert how in gone["msg"] and gone["level"] == "error"
    assert not sv.events("drain_finished")
    if how == "deleted":
        assert not os.path.exists(sv.db)  # the supervisor never made a new, empty one


def test_enqueue_refuses_to_create_a_database_whose_log_is_still_there(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    holder = open_store(db)  # a pool's connection: it keeps lk.db-wal
    try:
        holder.start_run("noop")
        os.remove(db)
        line = error_line(invoke("enqueue", "noop", "--db", db), exitcodes.ERROR)
        assert "write-ahead log" in line and "refusing to create" in line
        assert not os.path.exists(db)
    finally:
        holder.close()


# -- read-only, then writable again -----------------------------------------------------------
def chattr(flag: str, *paths: Path | str) -> None:
    done = _run("chattr", flag, *(str(p) for p in paths))
    assert done.returncode == 0, done.stderr.decode()


@pytest.fixture
def immutable_ok(tmp_path: Path) -> None:
    """chattr +i needs root (CAP_LINUX_IMMUTABLE) and a file system that supports it."""
    probe = tmp_path / "chattr-probe"
    probe.write_text("x")
    try:
        done = _run("chattr", "+i", str(probe))
    except OSError as exc:
        pytest.skip(f"SKIPPED LOUDLY: no chattr here ({exc})")
    if done.returncode != 0:
        pytest.skip(f"SKIPPED LOUDLY: chattr +i does not work here: {done.stderr.decode()}")
    chattr("-i", probe)


def test_a_store_that_fell_back_to_read_only_writes_again_once_it_can(
    tmp_path: Path, immutable_ok: None
) -> None:
    db = tmp_path / "lk.db"
    open_store(str(db)).close()
    chattr("+i", db)
    try:
        store = open_store(str(db))  # SQLite opens an immutable file read-only, silently
        with pytest.raises(StoreUnavailable, match="readonly"):
            store.start_run("noop")
    finally:
        chattr("-i", db)
    try:
        assert store.start_run("noop") == 1  # reconnected read-write
    finally:
        store.close()


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
def test_a_read_only_database_stalls_health_and_the_pool_recovers_by_itself(
    sv: Supervisor, immutable_ok: None
) -> None:
    dbdir = sv.workdir / "db"
    dbdir.mkdir()
    sv.db = str(dbdir / "lk.db")  # the pidfile stays writable, in workdir
    runs = [sv.enqueue("sleep", {"s": 0.02}) for _ in range(300)]
    sv.start("--lease-ttl", "4", "--max-attempts", "20", n=2)
    wait_for(lambda: sv.stats().runs.get("succeeded", 0) >= 10, what="some progress")
    files = sorted(dbdir.iterdir())
    chattr("+i", *files, dbdir)
    try:
        # Workers die of SIGBUS on the -shm mapping sooner or later; kill the rest the same way
        # so that every replacement opens the database while it is read-only.
        old = sv.workers()
        for pid in old:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(new := set(sv.workers()) - set(old)) == 2 and new, timeout=30,
                 what="two replacements")  # fmt: skip
        code, message = wait_for(
            lambda: (h := remote.health(sv.pidfile, 10.0, max_stall=2.0))[0] != exitcodes.OK and h,
            timeout=60,
            what="health to see the stall",
        )
        assert code == exitcodes.STALLED, message
        stuck = sv.stats().runs.get("succeeded", 0)
    finally:
        chattr("-i", dbdir, *files)
    # recovers by itself: no reload, no restart of the supervisor
    wait_for(lambda: sv.stats().runs.get("succeeded", 0) > stuck + 20, timeout=30,
             what="progress within seconds of the fault clearing")  # fmt: skip
    wait_for(lambda: sv.stats().runs.get("succeeded", 0) == len(runs), timeout=60,
             what="every run done")  # fmt: skip
    wait_for(lambda: remote.health(sv.pidfile, 10.0, max_stall=2.0)[0] == exitcodes.OK,
             timeout=30, what="health to clear")  # fmt: skip
    sv.signal(15)
    assert sv.wait_exit() == 0
