"""The operator's side of runs that wait, on both backends: ``supervisor signal``
resumes a waiting run (or keeps the signal until it waits) and refuses a finished or unknown
run with one line; ``runs --status waiting`` and ``show`` say what a run waits for."""

from __future__ import annotations

import json

import pytest
from cli_runner import invoke

from workerproc.store import CasResult, Commit, open_store
from workerproc.store.codec import WAIT_FOREVER


def waiting(db: str) -> int:
    with open_store(db) as store:
        run_id = store.start_run("draft")
        lease = store.claim("w", 60)
        assert lease is not None
        commit = Commit(lease, "wait", expected_revision=0, new_state={}, next_task="publish",
                        delay=WAIT_FOREVER, wait_for="signal:approval")  # fmt: skip
        assert store.commit_many([commit]).results == (CasResult.OK,)
    return run_id


def test_signal_resumes_a_waiting_run_and_show_lists_it(db: str) -> None:
    run_id = waiting(db)
    listed = invoke("runs", "--db", db, "--status", "waiting", "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [run_id]
    shown = invoke("show", str(run_id), "--db", db)
    assert "waits for:  signal:approval" in shown.stdout
    result = invoke("signal", str(run_id), "approval", "--db", db, "--payload", '{"ok": true}')
    assert result.exit_code == 0 and result.stdout.strip() == f"signal 1 sent to run {run_id}"
    with open_store(db) as store:
        lease = store.claim("w", 60)
        assert lease is not None and lease.signal is not None
        assert lease.signal.payload == {"ok": True}
    shown = invoke("show", str(run_id), "--db", db)
    assert "approval" in shown.stdout and f"task {lease.task_id}" in shown.stdout


def test_a_signal_before_the_wait_is_kept(db: str) -> None:
    with open_store(db) as store:
        run_id = store.start_run("draft")
    result = invoke("signal", str(run_id), "approval", "--db", db)
    assert result.exit_code == 0 and "kept until it waits for 'approval'" in result.stdout


@pytest.mark.parametrize("case", ["unknown", "finished", "bad payload"])
def test_signal_refusals_are_one_line(db: str, case: str) -> None:
    with open_store(db) as store:
        run_id = store.start_run("draft")
        if case == "finished":
            assert store.cancel_run(run_id)
    args = ["signal", str(run_id + 100 if case == "unknown" else run_id), "approval", "--db", db]
    if case == "bad payload":
        args += ["--payload", "{nope"]
    result = invoke(*args)
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert {"unknown": "no run with id", "finished": "is cancelled",
            "bad payload": "--payload"}[case] in lines[0]  # fmt: skip
