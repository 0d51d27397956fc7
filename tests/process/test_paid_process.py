"""Every paid call accounted for (B13) with real processes, judged by the handlers' outside ledger
(tests/apps/paid_app.py):

- ``unknown="park"``: a worker that dies inside fn (``os._exit``) leaves an intent without an
  answer; the next attempt parks the run (``waiting``, for ``outcome_unknown:charge``) without
  calling. ``supervisor resolve RUN charge --answer JSON`` finishes it without calling fn (the
  ledger shows one bill); ``--pay-again`` makes the next attempt call fn once more. ``once_key``
  is the same string in every attempt of the step.
- PostgreSQL: the keep's own connection terminated (``pg_terminate_backend``) between fn's
  return and the keep: the answer is kept on a fresh connection, ``once`` returns it, and the
  next attempt reuses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import paid_ledger
import pg_session
import pytest
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests

from workerproc.store import Run, open_store

pytestmark = pytest.mark.slow

APP = "apps.paid_app:app"


def runs_of(db: str, run_ids: list[int]) -> list[Run]:
    with open_store(db) as store:
        found = [store.get_run(r) for r in run_ids]
    assert all(r is not None for r in found)
    return [r for r in found if r is not None]


def wait_runs(db: str, run_ids: list[int], status: str, sv: Supervisor) -> list[Run]:
    def there() -> list[Run]:
        assert sv.proc is not None and sv.proc.poll() is None, sv.text()[-3000:]
        runs = runs_of(db, run_ids)
        return runs if all(r.status == status for r in runs) else []

    return wait_for(there, timeout=60, what=f"runs {run_ids} {status}")


def by_run(log: list[dict[str, Any]], ev: str) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in log:
        if e["ev"] == ev:
            found[e["run"]].append(e)
    return found


def resolve(db: str, run_id: int, *how: str) -> str:
    done = subprocess.run([sys.executable, "-m", "supervisor", "resolve", str(run_id), "charge",
                           "--db", db, *how], env=env_with_tests(), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_park_waits_for_resolve_answer_or_pay_again(db: str, tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    with open_store(db) as store:
        answered, again = store.start_runs([{"task": "park", "payload": {"ledger": str(path)}}] * 2)
    sv = Supervisor(tmp_path)
    sv.db = db
    try:
        sv.start("--lease-ttl", "2", "--poll-interval", "0.2", app=APP, n=1)
        parked = wait_runs(db, [answered, again], "waiting", sv)
        assert [r.waiting_for for r in parked] == ["outcome_unknown:charge"] * 2
        log = paid_ledger.read(path)
        bills = by_run(log, "bill")
        assert {r: [e["attempt"] for e in bills[r]] for r in (answered, again)} == {
            answered: [1], again: [1]}  # the second attempt parked without calling  # fmt: skip
        assert by_run(log, "once") == {}
        with open_store(db) as store:
            assert store.paid_call_totals().unknown == 2

        resolve(db, answered, "--answer", json.dumps({"by": "operator", "ref": "ch_1"}))
        resolve(db, again, "--pay-again")
        wait_runs(db, [answered, again], "succeeded", sv)
    finally:
        sv.kill_all()
    log = paid_ledger.read(path)
    bills, onces, starts = by_run(log, "bill"), by_run(log, "once"), by_run(log, "start")
    # the answer given: fn never called again, once returned it (reused, as if fn had)
    assert [e["attempt"] for e in bills[answered]] == [1]
    assert [(e["answer"], e["reused"]) for e in onces[answered]] == [
        ({"by": "operator", "ref": "ch_1"}, True)]  # fmt: skip
    # pay again: the next attempt called fn once more, and once returned that call's answer
    assert [e["attempt"] for e in bills[again]] == [1, 3]
    (paid,) = by_run(log, "paid")[again]
    assert [(e["answer"], e["reused"]) for e in onces[again]] == [(paid["answer"], False)]
    # the step's key: the same in every attempt (three each), another for the other run
    keys = {r: {e["key"] for e in starts[r]} for r in (answered, again)}
    assert [len(starts[r]) for r in (answered, again)] == [3, 3]
    assert len(keys[answered]) == len(keys[again]) == 1 and keys[answered] != keys[again]
    with open_store(db) as store:
        totals = store.paid_call_totals()
        assert (totals.started, totals.paid_again, totals.kept) == (3, 1, 2)
        assert [store.get_run(r).state for r in (answered, again)] == [  # type: ignore[union-attr]
            {"answer": {"by": "operator", "ref": "ch_1"}}, {"answer": paid["answer"]}]  # fmt: skip


def test_postgres_a_keep_whose_connection_is_terminated_lands_and_is_reused(
    tmp_path: Path,
) -> None:
    db = pg_session.schema_url("paidcut")
    path = tmp_path / "ledger.jsonl"
    payload = {"ledger": str(path), "admin": pg_session.database_url()}
    with open_store(db) as store:
        run_id = store.start_run("cut", payload)
    sv = Supervisor(tmp_path)
    sv.db = db
    try:  # two slots: the call runs on its slot thread, with that thread's own connection
        sv.start("--lease-ttl", "2", "--poll-interval", "0.2", "--concurrency", "2",
                 "--retry-backoff", "0.1", app=APP, n=1)  # fmt: skip
        wait_runs(db, [run_id], "succeeded", sv)
    finally:
        sv.kill_all()
    log = paid_ledger.read(path)
    (cut,) = [e for e in log if e["ev"] == "cut"]
    assert cut["terminated"] and cut["attempt"] == 1
    assert [e["attempt"] for e in log if e["ev"] == "bill"] == [1]
    (paid,) = [e for e in log if e["ev"] == "paid"]
    onces = [(e["attempt"], e["answer"], e["reused"]) for e in log if e["ev"] == "once"]
    assert onces == [(1, paid["answer"], False), (2, paid["answer"], True)]
    # the keep ran on a fresh connection of that thread: the terminated one was never used again
    assert next(e["backend"] for e in log if e["ev"] == "once") != cut["backend"]
    with open_store(db) as store:
        (call,) = store.paid_calls(run_id)
        totals = store.paid_call_totals()
    assert (call.attempt, call.reused) == (1, 1)
    assert (totals.started, totals.kept, totals.reused, totals.paid_again, totals.unknown) == (
        1, 1, 1, 0, 0)  # fmt: skip
