"""Waits on descriptors numbered 1024 or more, which ``select.select`` refuses ("filedescriptor
out of range in select()") and a process with many slots, connections or open files reaches:
each waiter, made in a child process whose lower numbers are all taken
(tests/support/high_fds.py), still times out on its bound (without spinning: a few reads of the
change token, not thousands) and still wakes on its descriptor: the worker's self-pipe (a
thread's wake-up, a real signal, the change watch beside it), a background thread's
``wait_change`` (a commit, ``close``), the supervisor's signal loop (an extra descriptor, a real
signal), the store's own ``wait_change`` on SQLite's watch and on PostgreSQL's LISTEN socket."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from store_backends import PostgresBackend

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parents[1] / "support"
ROOT = SUPPORT.parents[1]
HIGH = 1024
NEEDED = 1200  # the child fills up to 1100 and opens a few more
TIMEOUT = 0.4  # high_fds.TIMEOUT
SLACK = 2.0  # what a loaded 2-core machine may add to a wait
WOKEN = 5.0  # a 30 s wait that something woke ends long before this
# Reads of the change token in a 1.2 s wait that nothing wakes: asleep, a few (one per 0.5 s, a
# few dozen at most while a write of the store's own settles); spinning, thousands.
SPIN = 100


@pytest.fixture(autouse=True)
def _room_for_high_numbers() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NEEDED:
        pytest.skip(
            f"RLIMIT_NOFILE's hard limit is {hard}: a process here cannot open descriptor "
            f"number {HIGH} or more, which is what these tests need"
        )


def run(*args: str, signal_on_ready: int | None = None) -> dict[str, dict[str, Any]]:
    """Run the child with ``args``; its steps by name (``signal_on_ready`` sent when it asks)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(SUPPORT), *filter(None, [env.get("PYTHONPATH")])]
    )
    child = subprocess.Popen(
        [sys.executable, str(SUPPORT / "high_fds.py"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    steps: dict[str, dict[str, Any]] = {}
    try:
        for line in child.stdout:  # (each of the child's waits is bounded: it ends)
            if line.strip() == "ready":
                assert signal_on_ready is not None
                child.send_signal(signal_on_ready)
                continue
            step = json.loads(line)
            steps[step.pop("step")] = step
        code = child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    errors = child.stderr.read()
    child.stderr.close()
    child.stdout.close()
    assert code == 0, errors
    return steps


def high(steps: dict[str, dict[str, Any]]) -> None:
    assert all(fd >= HIGH for fd in steps["fds"]["fds"]), steps["fds"]


def timed_out(step: dict[str, Any], bound: float) -> None:
    assert bound * 0.95 <= step["took"] < bound + SLACK, step


def woken(step: dict[str, Any]) -> None:
    assert step["took"] < WOKEN, step


def watched(steps: dict[str, dict[str, Any]]) -> None:
    if steps["fds"]["fds"][-1] == -1:
        pytest.skip("no inotify watch of the database here: its waits poll, no descriptor")
    high(steps)


def test_the_workers_wait_on_its_self_pipe() -> None:
    steps = run("waker", signal_on_ready=signal.SIGTERM)
    high(steps)
    timed_out(steps["timeout"], TIMEOUT)
    assert steps["timeout"]["seen"] == []
    woken(steps["woken"])  # a thread's wake-up (a slot finished)
    woken(steps["also"])  # the descriptor beside it (the store's change watch)
    assert steps["also"]["readable"]
    woken(steps["signal"])  # a real signal: its handler wrote the self-pipe
    assert steps["signal"]["seen"] == [signal.SIGTERM]


def test_the_supervisors_signal_loop() -> None:
    steps = run("inbox", signal_on_ready=signal.SIGTERM)
    high(steps)
    timed_out(steps["timeout"], TIMEOUT)
    woken(steps["also"])  # an extra descriptor (the metrics endpoint, a reload's probe)
    assert steps["also"]["readable"]
    woken(steps["signal"])
    assert steps["signal"]["queue"] == [signal.SIGTERM]


def test_a_background_threads_wait_on_the_change_watch_and_its_stop() -> None:
    steps = run("background")
    watched(steps)
    timed_out(steps["timeout"], 3 * TIMEOUT)
    assert steps["timeout"]["moved"] is False
    assert steps["timeout"]["reads"] <= SPIN, steps["timeout"]
    woken(steps["commit"])
    assert steps["commit"]["moved"] is True
    woken(steps["close"])
    assert steps["close"]["moved"] is False
    woken(steps["closed"])


def test_the_sqlite_stores_wait_on_its_watch() -> None:
    steps = run("dialect")
    watched(steps)
    timed_out(steps["timeout"], 3 * TIMEOUT)
    assert steps["timeout"]["moved"] is False
    assert steps["timeout"]["reads"] <= SPIN, steps["timeout"]
    woken(steps["commit"])
    assert steps["commit"]["moved"] is True


@pytest.mark.postgres
def test_the_postgres_stores_listen_wait(tmp_path: Path) -> None:
    pg = PostgresBackend(str(tmp_path))
    pg.open().close()  # (the schema, migrated)
    steps = run("postgres", pg.url)
    high(steps)
    timed_out(steps["timeout"], 2 * TIMEOUT)
    assert steps["timeout"]["moved"] is False
    woken(steps["notified"])
    assert steps["notified"]["moved"] is True
    assert steps["claimed"]["leased"] is True
    woken(steps["notified_again"])  # listening again after the claim's UNLISTEN
    assert steps["notified_again"]["moved"] is True
