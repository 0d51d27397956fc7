"""A corrupt database. ``supervisor check`` finds the damage through the store
interface, ``start`` refuses a small damaged database before any fork (exit 1, what to do), and a
worker that meets "malformed" at run time exits STORE_CORRUPT, which stops the supervisor with the
exit code the README gives (1), never 0 and never 4."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke
from sv_harness import Supervisor, env_with_tests

from supervisor import exitcodes
from workerproc import exitcodes as wexit
from workerproc.store import Store, open_store

PAGE = 4096


def make_db(path: Path, runs: int = 300) -> str:
    with open_store(str(path)) as store:
        for i in range(runs):
            store.start_run("noop", {"i": i, "pad": "x" * 200})
    return str(path)


def garbage_in_page_2(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(PAGE)
        fh.write(random.Random(2).randbytes(PAGE))


def scribble_random_pages(path: str, pages: int = 5, seed: int = 7) -> None:
    """Overwrite part of a few seeded random pages of the second half of the file, past every
    table's and index's root page: data and index pages (the schema lives in the first pages,
    which grow with each migration; damage there is the other case)."""
    rng = random.Random(seed)
    count = os.path.getsize(path) // PAGE
    with sqlite3.connect(path) as conn:
        (roots,) = conn.execute("SELECT max(rootpage) FROM sqlite_master").fetchone()
    conn.close()
    first = max(count // 2, int(roots)) + 1
    with open(path, "r+b") as fh:
        for page in rng.sample(range(first, count + 1), pages):
            fh.seek((page - 1) * PAGE)  # from the b-tree page header on
            fh.write(rng.randbytes(512))


# -- the store interface ------------------------------------------------------------------------
def test_a_sound_database_passes_both_checks(s: Store) -> None:
    s.start_run("noop", {"x": 1})
    assert s.check_integrity() == []
    assert s.check_integrity(quick=True) == []


@pytest.mark.parametrize("damage", [garbage_in_page_2, scribble_random_pages])
def test_the_store_reports_damaged_pages(tmp_path: Path, damage: object) -> None:
    db = make_db(tmp_path / "lk.db")
    damage(db)  # type: ignore[operator]
    with open_store(db) as store:
        for quick in (True, False):
            problems = store.check_integrity(quick=quick, limit=5)
            assert 1 <= len(problems) <= 5, problems


# -- supervisor check --------------------------------------------------------------------------
def test_check_command_ok_damaged_and_quick(tmp_path: Path) -> None:
    db = make_db(tmp_path / "lk.db", runs=50)
    result = invoke("check", "--db", db)
    assert result.exit_code == 0 and result.stdout.startswith("ok: integrity_check"), result.output
    assert invoke("check", "--db", db, "--quick").stdout.startswith("ok: quick_check")
    scribble_random_pages(db, pages=2)
    for args in ([], ["--quick"]):
        result = invoke("check", "--db", db, *args)
        assert result.exit_code == exitcodes.ERROR, result.output
        assert result.stdout.strip()  # the problems, one per line
        (line,) = result.stderr.strip().splitlines()
        assert "is corrupt" in line and "restore it from a backup" in line
    missing = invoke("check", "--db", str(tmp_path / "none.db"))
    assert missing.exit_code == exitcodes.ERROR and "does not exist" in missing.stderr


# -- start refuses, the pool stops -------------------------------------------------------------
@pytest.mark.parametrize("damage", [garbage_in_page_2, scribble_random_pages])
def test_start_refuses_a_damaged_database_before_any_fork(sv: Supervisor, damage: object) -> None:
    make_db(Path(sv.db))
    damage(sv.db)  # type: ignore[operator]
    sv.start("--drain", n=2)
    assert sv.wait_exit() == exitcodes.ERROR
    text = sv.text()
    assert "is corrupt (quick_check" in text and "restore the database from a backup" in text
    assert not sv.events("worker_started") and "Traceback" not in text


def test_a_worker_that_meets_a_malformed_database_exits_store_corrupt(tmp_path: Path) -> None:
    db = make_db(tmp_path / "lk.db")
    garbage_in_page_2(db)
    cmd = [sys.executable, "-m", "workerproc", "--db", db, "--app", "apps.sv_app:app"]
    done = subprocess.run(cmd, env=env_with_tests(), capture_output=True, timeout=60)
    assert done.returncode == wexit.STORE_CORRUPT, done.stderr.decode()
    assert b"corrupt" in done.stderr and b"Traceback" not in done.stderr
