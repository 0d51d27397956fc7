"""The worker processes of every host, listed in the database and kept by
their heartbeats (``store.workers()``), so ``status --db URL``, the dashboard and a producer see
that a pool is claiming without a pidfile on that host. Store-level on both backends with the
fake clock; then real worker processes: one that stops cleanly leaves the list, one killed
outright stays, reads as not alive after three heartbeat periods, and goes when a later worker
starts ten periods on."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from cli_runner import invoke
from helpers import FakeClock, wait_for
from procs import spawn_worker

from workerproc import __version__
from workerproc.store import Store, WorkerInfo, open_store


def info(owner: str, every: float = 10.0, **changes: object) -> WorkerInfo:
    pid = int(owner.split(":")[1])
    base = WorkerInfo(owner, "h", pid, 1.0, every, 8, None, "0.1")
    return WorkerInfo(**{**base.__dict__, **changes})


def test_a_worker_is_listed_while_it_beats_and_goes_when_it_leaves(
    s: Store, clock: FakeClock
) -> None:
    s.worker_seen(info("h:1:1.00:a", queues=("llm", "default")), starting=True)
    s.worker_seen(info("h:2:1.00:b", every=2.0))
    one, _ = s.workers()
    assert (one.owner, one.queues, one.slots, one.heartbeat_at, one.alive) == (
        "h:1:1.00:a", ("llm", "default"), 8, clock.now, True,
    )  # fmt: skip
    clock.advance(6.5)  # three of b's periods: b is silent; a's period is 10 s
    assert [(w.owner, w.alive) for w in s.workers()] == [("h:1:1.00:a", True),
                                                         ("h:2:1.00:b", False)]  # fmt: skip
    s.worker_seen(info("h:2:1.00:b", every=2.0, state="draining"))  # it beats again
    assert [(w.state, w.alive) for w in s.workers()] == [("running", True), ("draining", True)]
    s.worker_gone("h:1:1.00:a")
    assert [w.owner for w in s.workers()] == ["h:2:1.00:b"]


def test_a_row_long_silent_goes_when_another_worker_starts(s: Store, clock: FakeClock) -> None:
    s.worker_seen(info("h:1:1.00:a", every=2.0), starting=True)
    clock.advance(10 * 2.0 + 60 - 1)
    s.worker_seen(info("h:2:1.00:b"), starting=True)
    assert {w.owner for w in s.workers()} == {"h:1:1.00:a", "h:2:1.00:b"}  # not yet
    clock.advance(2)
    s.worker_seen(info("h:3:1.00:c"))  # a beat, not a start: nothing is cleared
    assert len(s.workers()) == 3
    s.worker_seen(info("h:4:1.00:d"), starting=True)
    assert "h:1:1.00:a" not in {w.owner for w in s.workers()}


@pytest.mark.slow
def test_a_real_worker_lists_itself_beats_and_leaves(
    db: str,
    workdir: Path,
    procs: list,
) -> None:
    store = open_store(db)
    a = spawn_worker(db, workdir, "--lease-ttl", "1.5", "--concurrency", "3", name="a")
    procs.append(a)
    (w,) = wait_for(lambda: [w for w in store.workers() if w.pid == a.pid], timeout=30)
    assert (w.slots, w.beat_every, w.version, w.state, w.alive) == (3, 0.5, __version__,
                                                                    "running", True)  # fmt: skip
    first = w.heartbeat_at
    wait_for(lambda: [w for w in store.workers() if w.heartbeat_at > first], timeout=30)
    # the CLI shows it from the database alone: no pidfile on this host is asked
    doc = json.loads(invoke("status", "--db", db, "--json").stdout)
    assert [(w["pid"], w["alive"]) for w in doc["pool"]] == [(a.pid, True)]
    text = invoke("status", "--db", db).stdout
    assert f"{a.pid}" in text and "3 slots" in text
    a.signal(signal.SIGTERM)
    assert a.wait(30) == 0
    assert store.workers() == []  # a clean stop leaves the list

    b = spawn_worker(db, workdir, "--lease-ttl", "1.5", name="b")
    procs.append(b)
    wait_for(lambda: [w for w in store.workers() if w.pid == b.pid and w.alive], timeout=30)
    b.kill()  # SIGKILL: no goodbye
    (gone,) = wait_for(lambda: [w for w in store.workers() if not w.alive], timeout=30)
    assert gone.pid == b.pid
    store.close()
