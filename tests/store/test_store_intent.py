"""Producers ahead of a busy pool (``workerproc/store/sqlite_intent.py``): a producer's
transaction is announced on ``DB-producers``; a worker's exchange lets it go first, for a
bounded time; the file is the owner's and never followed through a symlink."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

from workerproc.store import ClaimRequest, open_store
from workerproc.store.sqlite.intent import YIELD_MAX, Intent


def test_an_announced_producer_is_seen_until_its_transaction_ends(tmp_path: Path) -> None:
    path = str(tmp_path / "db-producers")
    producer, worker = Intent(path), Intent(path)
    assert not worker.producers_waiting()
    with producer.announce():
        assert worker.producers_waiting()
        with Intent(path).announce():  # producers share it
            assert worker.producers_waiting()
    assert not worker.producers_waiting()
    assert worker.yield_to_producers() == 0.0  # nobody announced: no wait at all


def test_a_worker_waits_while_announced_and_goes_on_once_the_producer_is_done(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "db-producers")
    announced, release = threading.Event(), threading.Event()

    def produce() -> None:
        with Intent(path).announce():
            announced.set()
            release.wait(10)

    t = threading.Thread(target=produce)
    t.start()
    try:
        assert announced.wait(10)
        threading.Timer(0.005, release.set).start()
        waited = Intent(path).yield_to_producers()
        assert 0.0 < waited <= YIELD_MAX + 1.0  # bounded generously: the box may be loaded
    finally:
        release.set()
        t.join(10)


def test_a_worker_never_waits_longer_than_the_bound(tmp_path: Path) -> None:
    path = str(tmp_path / "db-producers")
    with Intent(path).announce():  # a producer that never finishes (stopped, say)
        started = time.monotonic()
        waited = Intent(path).yield_to_producers()
        assert YIELD_MAX <= waited <= YIELD_MAX + 1.0
        assert time.monotonic() - started <= YIELD_MAX + 1.0


def test_the_store_announces_start_run_and_yields_in_the_workers_exchange(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "jobs.db")
    store = open_store(db)
    try:
        store.start_run("t")
        mode = os.lstat(db + "-producers").st_mode
        assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o600
        with Intent(db + "-producers").announce():  # a producer in another process, waiting
            started = time.monotonic()
            lease = store.commit_many([], claim=ClaimRequest("w", 30.0, 5, 1)).leases[0]
            assert time.monotonic() - started >= YIELD_MAX  # the worker let it go first
        assert lease.task == "t"
    finally:
        store.close()


def test_a_symlink_in_place_of_the_file_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    db = str(tmp_path / "jobs.db")
    os.symlink(target, db + "-producers")
    store = open_store(db)
    try:
        store.start_run("t")  # no announcement, no error
        assert store.commit_many([], claim=ClaimRequest("w", 30.0, 5, 1)).leases
        assert target.read_text() == "keep" and os.path.islink(db + "-producers")
    finally:
        store.close()


def test_a_thread_that_ends_leaves_no_descriptor_behind(tmp_path: Path) -> None:
    """A web server that starts a thread per request must not leak one descriptor each."""
    import gc  # noqa: PLC0415

    intent = Intent(str(tmp_path / "db-producers"))

    def request() -> None:
        with intent.announce():
            pass

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    request()  # this thread's own descriptor
    before = open_fds()
    for _ in range(50):
        t = threading.Thread(target=request)
        t.start()
        t.join(10)
    gc.collect()
    assert open_fds() - before < 5
    intent.close()
