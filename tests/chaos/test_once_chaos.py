"""Paid once (B13) under chaos, on both backends with two supervisors sharing the
database (kills and pauses), judged from the handlers' own ledger (tests/apps/once_app.py):
half the runs make their paid call inside ``ctx.once``, half bare, in the same soak.

- With ``once``, no step is paid after its answer was kept: every call that began after an
  attempt of the same step had its answer back from ``once`` is a failure. Only calls still in
  flight when their worker was killed or paused may be paid again.
- Without ``once``, the same chaos pays for answers already had (a worker killed or paused
  after its call answered): the tokens of calls that began after an earlier call of the same
  step had answered. The figures of both halves are printed side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pg_session
import pytest
from sv_harness import Supervisor

from workerproc.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

APP = "apps.once_app:app"
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--prefetch", "0",
         "--max-attempts", "20", "--chaos", "--chaos-faults", "kill,pause",
         "--chaos-interval", "1.0"]  # fmt: skip
RUNS, STEPS = 12, 2  # of each kind


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def paid_after_answer(log: list[dict[str, Any]], runs: set[int]) -> tuple[int, int]:
    """Calls (and their tokens) of ``runs`` that began after an earlier call of their step had
    answered: an answer paid for again."""
    answered: dict[int, float] = {}
    for e in log:
        if e["ev"] == "paid" and e["run"] in runs:
            answered[e["task"]] = min(answered.get(e["task"], e["t"]), e["t"])
    paid_tokens = {(e["task"], e["attempt"]): e["tokens"] for e in log if e["ev"] == "paid"}
    again = [e for e in log if e["ev"] == "bill" and e["run"] in runs
             and e["t"] > answered.get(e["task"], float("inf"))]  # fmt: skip
    return len(again), sum(paid_tokens.get((e["task"], e["attempt"]), 0) for e in again)


def run_soak(tmp_path: Path, db: str, name: str) -> None:
    path = tmp_path / "ledger.jsonl"
    items = [{"task": "paid", "payload": {"n": 0, "steps": STEPS, "once": i % 2 == 0,
                                          "ledger": str(path)}}
             for i in range(2 * RUNS)]  # fmt: skip
    with open_store(db) as store:
        runs = store.start_runs(items)
    with_once = {r for i, r in enumerate(runs) if i % 2 == 0}
    without = set(runs) - with_once
    sups = [Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")]
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            sv.start(
                *CHAOS,
                "--chaos-seed",
                str(11 + i),
                "--concurrency",
                "2",
                "--chaos-report",
                str(tmp_path / f"chaos{i}.json"),
                app=APP,
                n=2,
            )
        codes = [sv.wait_exit(240) for sv in sups]
        assert codes == [0, 0], "".join(sv.text()[-3000:] for sv in sups)
    finally:
        for sv in sups:
            sv.kill_all()
    log = entries(path)
    with open_store(db) as store:
        assert [store.get_run(r).status for r in runs] == ["succeeded"] * len(runs)  # type: ignore[union-attr]
        assert store.integrity_violations() == []
        totals = store.paid_call_totals()
        calls = [c for r in with_once for c in store.paid_calls(r)]
    # the rule: with once, nothing is paid after its step's answer was kept
    kept: dict[int, float] = {}
    for e in log:
        if e["ev"] == "kept" and e["run"] in with_once:
            kept[e["task"]] = min(kept.get(e["task"], e["t"]), e["t"])
    twice = [e for e in log if e["ev"] == "bill" and e["t"] > kept.get(e["task"], float("inf"))]
    assert twice == [], f"paid again after the answer was kept: {twice}"
    assert len(calls) == RUNS * STEPS  # one kept answer per step
    once_n, once_tokens = paid_after_answer(log, with_once)
    bare_n, bare_tokens = paid_after_answer(log, without)
    reused = sum(c.reused for c in calls)
    saved = sum(c.reused * (c.tokens or 0) for c in calls)
    print(f"\n[{name}] tokens paid after an answer: with once {once_tokens} ({once_n} calls), "
          f"without {bare_tokens} ({bare_n} calls); reused {reused} calls, {saved} tokens "
          f"saved; paid unused {totals.unused} ({totals.unused_tokens} tokens)")  # fmt: skip
    assert reused > 0 and saved == totals.saved_tokens  # takeovers after a paid call reused it
    for i in range(2):  # the chaos report says so beside its faults
        report = json.loads((tmp_path / f"chaos{i}.json").read_text())
        assert report["paid_calls"]["tokens_saved"] == saved
        assert report["paid_calls"]["reused"] == reused
    assert bare_tokens > once_tokens  # the same chaos, without once: answers paid again


def test_sqlite_a_paid_call_is_paid_once_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, str(tmp_path / "lk.db"), "sqlite")


def test_postgres_a_paid_call_is_paid_once_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, pg_session.schema_url("once"), "postgres")
