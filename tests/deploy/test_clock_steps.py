"""Clocks that are wrong, or that step (libfaketime: tests/support/faketime.py).

PostgreSQL: every lease decision reads the database's clock, so a worker whose own clock is an
hour ahead cannot take a live lease over early, one an hour behind neither keeps an expired
lease alive nor waits an hour to take one over, and none writes without a lease. SQLite: one
machine, one clock: what a step of the wall clock does (docs/how-to/postgresql.md, "Clocks")
is what these tests see: a step back delays nothing that is running, a step forward ends the
running leases early, and the fence still refuses every write without a lease.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faketime
import pg_session
import pytest
from helpers import wait_for
from store_backends import claim
from sv_harness import SUPPORT, Supervisor, env_with_tests

from workerproc.store import Commit, Store, open_store

pytestmark = pytest.mark.slow

HOUR = 3600.0


class Agent:
    """tests/support/clock_agent.py in a process whose wall clock is ``offset`` off."""

    def __init__(self, url: str, clock_file: Path, offset: str) -> None:
        env = {**env_with_tests(), **faketime.environment(clock_file, offset)}
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "clock_agent.py"), url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
        )  # fmt: skip

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the agent exited {self.proc.wait(10)}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[str, Agent, Agent]]:
    """A fresh schema, and an agent an hour ahead and one an hour behind on it."""
    url = pg_session.schema_url("clock")
    open_store(url).close()  # the schema, created once
    ahead = Agent(url, tmp_path / "ahead", "+1h")
    try:
        behind = Agent(url, tmp_path / "behind", "-1h")
        try:
            yield url, ahead, behind
        finally:
            behind.close()
    finally:
        ahead.close()


def _past(store: Store, expires_at: float) -> None:
    """Wait until the database's clock is past ``expires_at``."""
    wait_for(lambda: store.now() > expires_at + 0.05, timeout=30, interval=0.05)


@pytest.mark.postgres
def test_postgres_lease_decisions_ignore_a_worker_clock_an_hour_off(
    agents: tuple[str, Agent, Agent],
) -> None:
    url, ahead, behind = agents
    store = open_store(url)
    try:
        for agent, sign in ((ahead, 1), (behind, -1)):  # their clocks are off, the store's not
            seen = agent.ask(op="time")
            assert abs(seen["wall"] - time.time() - sign * HOUR) < 120, seen
            assert abs(seen["store"] - store.now()) < 5, seen
        # no early takeover: a live lease stays its holder's for a clock an hour ahead
        live = store.start_run("step", {})
        held = claim(store, "honest", 30)
        assert held.run_id == live
        assert ahead.ask(op="claim", **{"as": "a"}, owner="ahead", ttl=30)["lease"] is None
        assert behind.ask(op="claim", **{"as": "b"}, owner="behind", ttl=30)["lease"] is None
        # a lease's expiry is the database's now + ttl, whoever's clock claims it
        store.start_run("step", {})
        mine = behind.ask(op="claim", **{"as": "short"}, owner="behind", ttl=1)["lease"]
        assert mine is not None and abs(mine["expires_at"] - mine["claimed_at"] - 1) < 0.01
        assert abs(mine["claimed_at"] - store.now()) < 5
        # no late expiry: past the database's expiry, the lease is over for everyone, though the
        # holder's clock says it has an hour left; the holder behind cannot renew it
        _past(store, mine["expires_at"])
        assert behind.ask(op="renew", **{"as": "short"}, ttl=1)["expires_at"] is None
        taken = claim(store, "taker", 30)
        assert (taken.task_id, taken.attempt, taken.takeover) == (mine["task_id"], 2, True)
        # no write without a lease: the former holder's write is refused
        assert behind.ask(op="finish", **{"as": "short"})["result"] == "lease_lost"
        # and a clock an hour behind takes an expired lease over on time, not an hour late
        store.start_run("step", {})
        dead = claim(store, "dead", 1)
        _past(store, dead.expires_at)
        late = behind.ask(op="claim", **{"as": "late"}, owner="behind", ttl=30)["lease"]
        assert late is not None and (late["task_id"], late["attempt"]) == (dead.task_id, 2)
        # a clock an hour ahead expires nothing early: its own short lease is renewed in time
        store.start_run("step", {})
        early = ahead.ask(op="claim", **{"as": "early"}, owner="ahead", ttl=5)["lease"]
        assert early is not None
        assert ahead.ask(op="renew", **{"as": "early"}, ttl=5)["expires_at"] is not None
        assert ahead.ask(op="finish", **{"as": "early"})["result"] == "ok"
        # the live lease of the start is still its holder's, and its write goes through
        step = Commit(held, "finish", expected_revision=held.revision, new_state={"by": "honest"})
        assert store.commit_many((step,)).results[0].value == "ok"
    finally:
        store.close()


def _stepped_run(
    sv: Supervisor, tmp: Path, steps: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], Any]:
    """One run of one 4-second step on a worker with a 1.5 s lease, its wall clock moved by
    ``steps`` (one each 0.8 s, heartbeats every 0.5 s) once its handler began: the ledger's
    entries and the run. The clock: tests/support/wallclock (Python's ``time.time``)."""
    clock, ledger = tmp / "clock", tmp / "ledger.jsonl"
    clock.write_text("+0\n")
    with open_store(sv.db) as store:
        run_id = store.start_run("step", {"n": 0, "steps": 1, "sleep": 4, "ledger": str(ledger)})
    monkeypatch.setenv("LEASEKEEPER_TEST_CLOCK_FILE", str(clock))  # the supervisor's and workers'
    sv.extra_path = str(SUPPORT / "wallclock")
    sv.start("--drain", "--lease-ttl", "1.5", app="apps.ledger_app:app", n=1)
    wait_for(lambda: ledger.exists() and ledger.read_text().strip(), timeout=60)
    for offset in steps:
        faketime.step(clock, offset)
        time.sleep(0.8)
    faketime.step(clock, "+0")
    assert sv.wait_exit(60) == 0, sv.text()[-3000:]
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    with open_store(sv.db) as store:
        return entries, store.get_run(run_id)


@pytest.mark.e2e  # (whole pools for 5-10 s each: scripts/test-e2e runs them)
@pytest.mark.parametrize("steps", [["+1h", "-1h"], ["-1h", "+1h"]], ids=["ahead", "behind"])
def test_postgres_worker_whose_wall_clock_steps_keeps_its_lease(
    tmp_path: Path, sv: Supervisor, steps: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own clock steps an hour either way while its handler runs: its
    heartbeats go on (they count on the monotonic clock, the database says when a lease ends),
    so nothing is lost, and the run's one step is written once."""
    sv.db = pg_session.schema_url("clockstep")
    entries, run = _stepped_run(sv, tmp_path, steps, monkeypatch)
    assert [e["ev"] for e in entries] == ["start", "end"], entries
    assert run is not None and run.status == "succeeded"
    assert run.state["writes"] == [{"step": 0, "attempt": 1}]


@pytest.mark.e2e
def test_sqlite_wall_clock_step_back_delays_nothing_running(
    tmp_path: Path, sv: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite keeps its times on the machine's wall clock: a step back leaves a running lease
    live (a renewal keeps the later of its old expiry and now + ttl) and the run goes on."""
    entries, run = _stepped_run(sv, tmp_path, ["-1h"], monkeypatch)
    assert [e["ev"] for e in entries] == ["start", "end"], entries
    assert run is not None and run.status == "succeeded"
    assert run.state["writes"] == [{"step": 0, "attempt": 1}]


@pytest.mark.e2e
def test_sqlite_wall_clock_step_forward_ends_leases_early_but_never_lets_a_write_through(
    tmp_path: Path, sv: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step forward past the lease ttl makes every running lease look expired: the holder's
    next renewal is refused, its handler is told its lease is lost, and the task runs again
    as the next attempt. The fence still holds: the step is written once, by that attempt."""
    entries, run = _stepped_run(sv, tmp_path, ["+1h"], monkeypatch)
    assert [(e["ev"], e["attempt"]) for e in entries] == [
        ("start", 1), ("lost", 1), ("start", 2), ("end", 2)
    ], entries  # fmt: skip
    assert run is not None and run.status == "succeeded"
    assert run.state["writes"] == [{"step": 0, "attempt": 2}]
