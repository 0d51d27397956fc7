"""A scribbled ``-wal`` under a live pool is reported, never silently
accepted. While a drain runs, a burst of writes no one reads again (signals to the held run)
grows the WAL without a checkpoint (a reader holds its snapshot), and 64 KiB of random bytes go
into the middle of it: the open connections trust those frames unverified, and the checkpoint
copies them into the file. Before: the drain finished and exited 0, and the database then
failed ``integrity_check``. Now the quick check that ends a finished drain says so in one line
and the drain exits 17 (README's exit-codes table); a sound drain says it checked, and exits 0.
A real file and a real pool."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for
from sv_harness import env_with_tests

from supervisor import exitcodes
from workerproc.store import open_store


def drain(db: str, here: Path) -> subprocess.Popen[str]:
    env = {**env_with_tests(), "HOLD_DIR": str(here)}
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", "1", "--db", db, "--app",
           "apps.hold_app:app", "--drain", "--log-format", "json"]  # fmt: skip
    return subprocess.Popen(cmd, env=env, cwd=here, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


@pytest.mark.parametrize("scribble", [True, False])
def test_a_scribbled_wal_under_a_drain_is_reported(tmp_path: Path, scribble: bool) -> None:
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        held = store.start_run("hold")
        store.start_runs([{"task": "noop"}] * 100)
    proc = drain(db, tmp_path)
    try:
        wait_for(lambda: (tmp_path / "running").exists(), 60, what="the held task")
        reader = sqlite3.connect(db)  # holds a snapshot: no checkpoint passes it meanwhile
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM runs").fetchall()
        with open_store(db) as store:  # the burst: pages nobody reads again in this drain
            for i in range(300):
                store.signal(held, "note", {"i": i, "pad": "x" * 1500})
        size = os.path.getsize(db + "-wal")
        assert size > 1_000_000  # checkpoint-less: the burst is all in the WAL
        if scribble:
            with open(db + "-wal", "r+b") as wal:
                wal.seek(size // 2)
                wal.write(os.urandom(64 * 1024))
        reader.execute("COMMIT")
        reader.close()
        (tmp_path / "go").write_text("1", encoding="utf-8")
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    said = {d["event"]: d for d in lines}
    assert "drain_finished" in said, err  # the drain itself saw nothing wrong
    if not scribble:
        assert proc.returncode == exitcodes.OK, err
        assert "database is sound" in said["drain_checked"]["msg"]
        return
    assert proc.returncode == exitcodes.DRAIN_CORRUPT == 17, err
    (corrupt,) = [d for d in lines if d["event"] == "database_corrupt"]
    assert corrupt["level"] == "error" and corrupt["where"] == "drain"
    assert "the drain finished but the database is corrupt" in corrupt["msg"]
    damaged = sqlite3.connect(db)  # and so it is, as the line said
    try:
        found = damaged.execute("PRAGMA integrity_check(5)").fetchall()
    except sqlite3.DatabaseError as exc:  # too damaged to even walk
        found = [(str(exc),)]
    finally:
        damaged.close()
    assert found != [("ok",)]
