"""A worker that paused past its own lease and took the task over itself (docs/protocol.md, R4
and B3): the new attempt waits here until the old handler ends, and that wait has a bound.

- The old attempt, lost, is still watched: a handler that ignores ``LeaseLost`` for a whole ttl
  ends the process (``LEASE_STUCK``) even though the new attempt replaced it in the heartbeat;
  otherwise the new attempt, renewed all along, could wait behind it for ever.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ledger
from helpers import wait_for
from procs import spawn_worker
from test_attempts import WORKER, Renewals, pause

from workerproc import exitcodes
from workerproc.heartbeat import Heartbeat
from workerproc.store import Lease, open_store


def watching(stuck: list[Lease]) -> Heartbeat:
    """A heartbeat with a short ttl whose stuck checks are recorded in ``stuck``."""
    store: Any = Renewals()
    return Heartbeat(lambda: store, ttl=0.2, interval=0.05,
                     on_lost=lambda lease, why: None, on_timeout=lambda lease, store: None,
                     on_death=lambda exc: None, on_stuck=stuck.append)  # fmt: skip


def test_an_old_attempt_replaced_by_this_workers_takeover_is_still_watched() -> None:
    """The old attempt's handler began and never returns: a ttl after its loss, ``on_stuck``
    fires for it, though the heartbeat now holds the newer attempt of its task."""
    stuck: list[Lease] = []
    hb = watching(stuck)
    old, new = (Lease(7, 7, "t", None, n, "me", 0.0, 0.0) for n in (1, 2))
    hb.track(old, time.monotonic())
    hb.started(old)
    hb.start()
    try:
        hb.track(new, time.monotonic())  # this worker's own takeover: the old one is lost
        assert hb.is_lost(old) and not hb.is_lost(new)
        wait_for(lambda: stuck, timeout=10, what="the stuck check of the old attempt")
        assert stuck == [old]
        assert not hb.is_lost(new)
    finally:
        hb.close()


def test_an_old_attempt_that_returns_is_no_longer_watched() -> None:
    """Once the old handler returned (``finished``), nothing fires for it."""
    stuck: list[Lease] = []
    hb = watching(stuck)
    old, new = (Lease(7, 7, "t", None, n, "me", 0.0, 0.0) for n in (1, 2))
    hb.track(old, time.monotonic())
    hb.started(old)
    hb.start()
    try:
        hb.track(new, time.monotonic())
        hb.finished(old)
        hb.untrack([old], wait=False)
        time.sleep(1.0)  # five ttls: what must not happen has had its chance
        assert stuck == [] and not hb.is_lost(new)
    finally:
        hb.close()


def test_a_worker_whose_old_handler_ignores_its_lost_lease_exits_stuck(tmp_path: Path) -> None:
    """Paused inside a handler deaf to its lease, a worker wakes and takes the task over
    itself; the old handler never looks at its lease. A ttl after the loss the worker exits
    74 (the old attempt's stuck check), as it would had no takeover replaced it. It used to
    renew the new attempt for as long as the old handler ran: here a minute, or for ever."""
    db = str(tmp_path / "lk.db")
    path = tmp_path / "ledger.jsonl"
    store = open_store(db)
    try:
        run_id = store.start_run("deaf", {"ledger": str(path), "seconds": 120.0})
        worker = spawn_worker(db, tmp_path, *WORKER)
        try:
            wait_for(lambda: ledger.read(path), timeout=30, what="the handler started")
            pause(worker)
            wait_for(lambda: worker.popen.poll() is not None, timeout=40, interval=0.05,
                     what="the worker's exit, a ttl after the loss")  # fmt: skip
        finally:
            worker.kill()
        assert worker.popen.returncode == exitcodes.LEASE_STUCK, worker.output()
        assert "ignored LeaseLost for a whole ttl" in worker.output()
        (task,) = store.get_tasks(run_id)
        assert task.attempts == 2, task  # it did take the task over itself
        assert [e.attempt for e in ledger.read(path) if e.ev == "start"] == [1]
    finally:
        store.close()
