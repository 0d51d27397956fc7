"""SQLite: the writers of one process take turns on a lock of the process before the file's
write lock (``store/sqlite/turns.py``): a thread that waits for another of its process sleeps
on that lock and goes at its commit; a child after fork has its own."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

from workerproc.store import open_store
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
