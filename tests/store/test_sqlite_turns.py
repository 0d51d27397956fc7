"""SQLite: the writers of one process take turns on a lock of the process before the file's
write lock (``store/sqlite/turns.py``): a thread that waits for another of its process sleeps
on that lock and goes at its commit; a child after fork has its own."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from workerproc.store import StoreUnavailable, open_store
from workerproc.store.sqlite.turns import turn


def test_a_writer_waits_for_its_process_s_writer_on_the_turn_then_goes(tmp_path: Path) -> None:
    path = str(tmp_path / "lk.db")
    with open_store(path) as first, open_store(path) as second:
        inside, go_on = threading.Event(), threading.Event()

        def hold(tx: object) -> None:
            inside.set()
            assert go_on.wait(30)

        holder = threading.Thread(target=lambda: first.dialect.write(hold))
        holder.start()
        assert inside.wait(30)
        done: list[int] = []
        writer = threading.Thread(target=lambda: done.append(second.start_run("t")))
        writer.start()
        mine = turn(first.dialect._absolute)  # type: ignore[attr-defined]
        time.sleep(0.1)
        assert writer.is_alive() and not done  # waiting for the holder ...
        assert not mine.acquire(blocking=False)  # ... on this process's turn
        go_on.set()
        holder.join(30)
        writer.join(30)
        assert done and not writer.is_alive()
        assert mine.acquire(blocking=False)  # every turn given back
        mine.release()


def _child_takes_its_turn(path: str, answer: multiprocessing.SimpleQueue[bool]) -> None:
    mine = turn(path)
    answer.put(mine.acquire(timeout=5))


def test_a_forked_child_has_its_own_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "lk.db")
    assert turn(path) is turn(path)
    ctx = multiprocessing.get_context("fork")
    answer: multiprocessing.SimpleQueue[bool] = ctx.SimpleQueue()
    with turn(path):  # held by this thread while the child is forked
        child = ctx.Process(target=_child_takes_its_turn, args=(path, answer))
        child.start()
        child.join(30)
    assert answer.get() is True


def test_the_turn_and_the_file_s_lock_share_one_busy_timeout(tmp_path: Path) -> None:
    """A writer that waited for its process's turn has that much less for the file's lock: it
    gives up at busy_timeout from when it began to wait, not at twice that."""
    path = str(tmp_path / "lk.db")
    with open_store(path) as first:
        first.start_run("t")  # (the schema is written)
    other = sqlite3.connect(path, isolation_level=None)  # another process's writer, stuck
    other.execute("BEGIN IMMEDIATE")
    try:
        with open_store(path, busy_timeout=1.5) as store:
            mine = turn(store.dialect._absolute)  # type: ignore[attr-defined]
            holding = threading.Event()

            def hold() -> None:  # this process's other writer holds the turn for 1 s
                with mine:
                    holding.set()
                    time.sleep(1.0)

            holder = threading.Thread(target=hold)
            holder.start()
            assert holding.wait(30)
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.start_run("t")
            waited = time.monotonic() - began
            holder.join(30)
    finally:
        other.rollback()
        other.close()
    assert 1.4 <= waited < 2.2, waited  # (each wait its own busy_timeout: 2.5 s at least)
