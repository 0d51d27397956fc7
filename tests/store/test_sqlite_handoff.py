"""The write lock handed over at a commit (``workerproc/store/sqlite/handoff.py``): a writer
waiting for SQLite's lock wakes when one of ours commits, never waits longer than the back-off it
replaces (a stopped holder, a writer not ours), and never follows a symlink."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from workerproc.store import open_store
from workerproc.store.sqlite.dialect import SQLiteDialect
from workerproc.store.sqlite.handoff import Handoff
from workerproc.store.sqlite.intent import Intent


def test_a_waiter_wakes_at_a_commit_not_at_the_end_of_its_wait(tmp_path: Path) -> None:
    path = str(tmp_path / "db-producers")
    holder = Intent(path)
    holder.producers_waiting()  # (the side file exists once one of ours looked)
    handoff = Handoff(path)
    try:
        handoff.wait(0.0)  # (made: the watch is there from now on)
        threading.Timer(0.05, holder.committed).start()
        started = time.monotonic()
        handoff.wait(10.0)
        assert time.monotonic() - started < 5.0  # woken by the commit, long before 10 s
    finally:
        handoff.close()
        holder.close()


def test_a_newcomer_woken_by_a_commit_defers_within_its_wait(tmp_path: Path) -> None:
    """Woken by a commit, a newcomer lets older waiters try first, never past its own wait."""
    path = str(tmp_path / "db-producers")
    holder = Intent(path)
    holder.producers_waiting()
    handoff = Handoff(path)
    try:
        handoff.wait(0.0)
        holder.committed()  # (a commit already there when it begins to wait)
        started = time.monotonic()
        handoff.wait(0.002, defer=10.0)
        assert time.monotonic() - started < 1.0  # the defer is cut to the wait's own bound
    finally:
        handoff.close()
        holder.close()


def test_a_wait_with_no_commit_is_bounded_by_its_timeout(tmp_path: Path) -> None:
    """A holder that is stopped or dead writes nothing: the waiter's back-off ends anyway."""
    path = str(tmp_path / "db-producers")
    Intent(path).producers_waiting()
    handoff = Handoff(path)
    try:
        handoff.wait(0.0)
        started = time.monotonic()
        handoff.wait(0.05)
        assert 0.04 <= time.monotonic() - started < 2.0
    finally:
        handoff.close()


def test_with_no_side_file_a_waiter_sleeps(tmp_path: Path) -> None:
    handoff = Handoff(str(tmp_path / "missing-producers"))
    started = time.monotonic()
    handoff.wait(0.02)
    assert 0.015 <= time.monotonic() - started < 2.0
    assert not (tmp_path / "missing-producers").exists()  # a waiter creates nothing
    handoff.close()


def test_a_symlink_in_place_of_the_side_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    path = str(tmp_path / "db-producers")
    os.symlink(target, path)
    Intent(path).committed()  # opened with O_NOFOLLOW: nothing opened through it
    assert target.read_text() == "keep"
    handoff = Handoff(path)
    try:
        handoff.wait(0.0)
        os.close(os.open(target, os.O_RDONLY))  # an open of the target is not the side file's
        started = time.monotonic()
        handoff.wait(0.05)
        assert time.monotonic() - started >= 0.04
    finally:
        handoff.close()


def test_a_writer_blocked_by_another_connection_waits_on_the_handoff_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's write, refused by a lock held elsewhere, waits through ``Handoff.wait``
    and goes through once the holder committed."""
    db = str(tmp_path / "jobs.db")
    store = open_store(db)
    waits: list[float] = []
    real = Handoff.wait

    def spy(self: Handoff, seconds: float, defer: float = 0.0) -> None:
        waits.append(seconds)
        real(self, seconds, defer)

    monkeypatch.setattr(Handoff, "wait", spy)
    other = sqlite3.connect(db, isolation_level=None, timeout=0, check_same_thread=False)
    try:
        store.start_run("t")
        other.execute("BEGIN IMMEDIATE")

        def commit_soon() -> None:
            time.sleep(0.05)
            other.execute("COMMIT")
            Intent(db + "-producers").committed()

        t = threading.Thread(target=commit_soon)
        t.start()
        run_id = store.start_run("t")
        t.join(10)
        assert run_id and waits and max(waits) <= 0.0075  # the back-off's cap, jittered
    finally:
        other.close()
        store.close()


def test_closing_the_store_closes_the_watch(tmp_path: Path) -> None:
    db = str(tmp_path / "jobs.db")
    store = open_store(db)
    store.start_run("t")
    dialect = store.dialect
    assert isinstance(dialect, SQLiteDialect)
    dialect._handoff.wait(0.0)  # made
    fd = dialect._handoff._fd
    assert fd is not None
    store.close()
    with pytest.raises(OSError):
        os.fstat(fd)
