"""``show`` tells executions from claims: a task that ran twice under ``--max-attempts 2`` was
claimed three times (the third claim found the budget spent and failed the run, R6), and must
not read as three attempts."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from sv_harness import Supervisor, env_with_tests

from supervisor.commands.cli import cli
from workerproc.store import Commit, Store


def show(db: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["show", "1", "--db", db, *args], env=env_with_tests())
    assert result.exit_code == 0, result.output
    return result.stdout


def task_row(text: str) -> list[str]:
    """The cells of the first task row of ``show``'s table (after its header line)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("STEP "))
    return re.split(r"\s{2,}", lines[header + 1].strip())


def test_two_executions_three_claims_after_two_dead_workers(s: Store) -> None:
    s.start_run("step")
    for owner in ("w1", "w2"):  # each worker dies in its handler; the next claim takes over
        lease = s.claim(owner, 60, max_attempts=2)
        assert lease is not None
        s.release_owner(owner)
    assert s.claim("w3", 60, max_attempts=2) is None  # attempt 3 would exceed the budget
    run = s.get_run(1)
    assert run is not None and run.failure_reason == "task_attempts_exhausted"
    url = s.url
    row = task_row(show(url))
    assert row[0] == "1" and row[3:5] == ["2", "3"], row  # STEP 1, EXECUTIONS 2, CLAIMS 3
    doc = json.loads(show(url, "--json"))
    task = doc["tasks"][0]
    assert (task["executions"], task["claims"], task["attempts"]) == (2, 3, 3)


def test_a_handed_back_lease_is_a_claim_not_an_execution(s: Store) -> None:
    s.start_run("step")
    lease = s.claim("w1", 60)
    assert lease is not None
    assert s.commit_many([Commit(lease, "handback")]).results[0] == "ok"
    lease = s.claim("w2", 60)
    assert lease is not None and s.ack(lease)
    task = json.loads(show(s.url, "--json"))["tasks"][0]
    assert (task["executions"], task["claims"]) == (1, 2)


@pytest.mark.slow
def test_a_task_that_crashed_its_worker_twice_under_max_attempts_2(sv: Supervisor) -> None:
    sv.enqueue("crash")
    sv.start("--max-attempts", "2", "--drain", n=1)
    assert sv.wait_exit(timeout=90) == 0
    text = show(sv.db)
    assert "failure:    task_attempts_exhausted" in text
    row = task_row(text)
    assert row[2] == "crash" and row[3:5] == ["2", "3"], text


def test_show_says_which_batch_call_each_item_went_in(s: Store) -> None:
    from workerproc.store import ClaimRequest  # noqa: PLC0415 - this test only

    for _ in range(3):
        s.start_run("embed")
    leases = s.commit_many([], claim=ClaimRequest("w1", 60, limit=3, task="embed")).leases
    assert s.batch_started(leases, "1.1") == 3
    doc = json.loads(show(s.url, "--json"))
    assert [(b["task"], b["attempt"], b["batch"], b["items"]) for b in doc["batches"]] == [
        ("embed", 1, "1.1", 3)]  # fmt: skip
    text = show(s.url)
    assert "batches:" in text and re.search(r"embed\s+1\s+1\.1\s+3", text), text
