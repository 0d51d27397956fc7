"""The outbox (B18) under chaos, on both backends with two supervisors sharing the
database (kills and pauses, a short ttl): every committed transition has exactly one event,
in commit order, judged against the database's own record of what happened (tasks, their
attempt history, the refused writes); and a consumer process that follows from 0 under a
named cursor, killed and started again mid-stream, misses none."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pg_session
import pytest
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests

from workerproc.store import Event, open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

APP = "apps.ledger_app:app"
STEPS = 3
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--max-attempts", "20",
         "--chaos", "--chaos-faults", "kill,pause", "--chaos-interval", "0.5"]  # fmt: skip
CONSUMER = "chaos-billing"


def consumer(db: str, out: Path, tmp: Path) -> subprocess.Popen[bytes]:
    log = open(tmp / "consumer.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen([sys.executable, "-m", "apps.event_consumer", db, str(out),
                                 CONSUMER], stdout=log, stderr=log, env=env_with_tests(),
                                start_new_session=True)  # fmt: skip
    finally:
        log.close()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def judge(db: str, runs: list[int], events: list[Event]) -> None:
    """Every transition the database knows of has exactly one event, in commit order."""
    assert [e.id for e in events] == sorted({e.id for e in events}), "ids unique, increasing"
    with open_store(db) as store:
        by_run: dict[int | None, list[Event]] = defaultdict(list)
        for e in events:
            by_run[e.run_id].append(e)
        refusals = Counter((r.task_id, r.attempt, r.op) for r in store.fence_rejections())
        seen_refusals = Counter((e.data["task_id"], e.attempt, e.data["op"]) for e in events
                                if e.kind == "write.refused")  # fmt: skip
        assert seen_refusals == refusals, "one event per refused write"
        assert set(by_run) == set(runs)
        for run_id in runs:
            mine = by_run[run_id]
            kinds = [e.kind for e in mine]
            assert kinds[0] == "run.enqueued" and kinds.count("run.enqueued") == 1
            ends = [k for k in kinds if k.startswith("run.") and k != "run.enqueued"]
            assert ends == ["run.succeeded"], kinds
            assert kinds[-1] in ("run.succeeded", "write.refused"), kinds  # a zombie after
            assert all(a.at <= b.at + 0.001 for a, b in itertools.pairwise(mine)), "commit order"
            history = store.attempt_history(run_id)
            for task in store.get_tasks(run_id):
                of = [e for e in mine if e.data.get("task_id") == task.id]
                claims = [e for e in of if e.kind in ("step.claimed", "lease.taken_over")]
                # one claim event per attempt, in attempt order (the fencing token's order)
                assert [e.attempt for e in claims] == list(range(1, task.attempts + 1)), of
                took = [e for e in of if e.kind == "lease.taken_over"]
                taken = [h for h in history if h.task_id == task.id and h.outcome == "taken_over"]
                assert sorted(e.data["previous_attempt"] for e in took) == sorted(
                    h.attempt for h in taken)  # fmt: skip
                assert all(e.data["previous_owner"] for e in took)
                released = [h for h in history if h.task_id == task.id and h.outcome == "released"]
                assert len([e for e in of if e.kind == "step.released"]) == len(released)
                (done,) = [e for e in of if e.kind == "step.committed"]
                assert (done.attempt, done.data["owner"]) == (task.done_attempt, task.done_owner)
                claim = next(e for e in claims if e.attempt == done.attempt)
                assert claim.id < done.id


def run_soak(tmp_path: Path, db: str, runs_n: int, n: int) -> None:
    ledger = tmp_path / "ledger.jsonl"
    out = tmp_path / "consumed.jsonl"
    payload = {"n": 0, "steps": STEPS, "sleep": 0.05, "sleep_max": 0.2, "ledger": str(ledger)}
    with open_store(db) as store:
        store.consumer_position(CONSUMER)  # the named cursor exists (at 0) before any event
        runs = store.start_runs([{"task": "step", "payload": payload}] * runs_n)
    follower = consumer(db, out, tmp_path)
    sups = [Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")]
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            sv.start(*CHAOS, "--chaos-seed", str(5 + i), app=APP, n=n)
        wait_for(lambda: len(lines(out)) >= 20, 60, what="the consumer's first events")
        follower.send_signal(signal.SIGKILL)  # mid-stream: restarted from its named cursor
        follower.wait(10)
        follower = consumer(db, out, tmp_path)
        codes = [sv.wait_exit(120) for sv in sups]
        assert codes == [0, 0], "".join(sv.text()[-3000:] for sv in sups)
        with open_store(db) as store:
            events = store.events(limit=10_000)
            last = events[-1].id
            wait_for(lambda: store.consumer_position(CONSUMER) >= last, 30,
                     what="the consumer catching up")  # fmt: skip
    finally:
        follower.kill()
        follower.wait(10)
        for sv in sups:
            sv.kill_all()
    assert len(events) < 10_000
    kinds = Counter(e.kind for e in events)
    print(dict(kinds))
    assert kinds["lease.taken_over"] >= 1, kinds  # the faults took leases over
    judge(db, runs, events)
    consumed = lines(out)
    assert len({c["pid"] for c in consumed}) == 2, "the consumer was killed and restarted"
    assert {c["id"] for c in consumed} == {e.id for e in events}, "the consumer missed none"
    for pid in {c["pid"] for c in consumed}:  # each process in commit order, no repeats
        ids = [c["id"] for c in consumed if c["pid"] == pid]
        assert ids == sorted(set(ids))
    assert len(consumed) - len(events) <= 1  # at least once: at most the one it did not ack


def test_sqlite_every_transition_has_one_event_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, str(tmp_path / "lk.db"), 30, 2)


def test_postgres_every_transition_has_one_event_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, pg_session.schema_url("events"), 24, 2)
