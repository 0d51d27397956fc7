"""Operators' bulk commands: ``retry`` and ``cancel`` without RUN take a filter (``--status``,
``--task``, ``--queue``, ``--since``) or ``--all`` and say how many runs they changed;
``signal --runs-file`` signals every run a file (or stdin) lists and counts the ones it could
not. Every misuse is one line and exit 2, and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import error_line, invoke

from supervisor import exitcodes
from workerproc.store import CasResult, Commit, open_store


def runs(db: str, *tasks: str) -> list[int]:
    with open_store(db) as store:
        return [store.start_run(task) for task in tasks]


def statuses(db: str, ids: list[int]) -> list[str]:
    with open_store(db) as store:
        return [store.get_run(i).status for i in ids]  # type: ignore[union-attr]


def test_cancel_and_retry_by_filter(db: str) -> None:
    ids = runs(db, "digest", "digest", "render")
    assert invoke("cancel", "--db", db, "--task", "digest", "--status", "pending").stdout == (
        "2 runs cancelled\n"
    )
    assert statuses(db, ids) == ["cancelled", "cancelled", "pending"]
    retried = invoke("retry", "--db", db, "--status", "cancelled", "--since", "1h")
    assert retried.stdout == "2 runs queued again\n"
    assert statuses(db, ids) == ["pending", "pending", "pending"]
    assert invoke("cancel", "--db", db, "--all").stdout == "3 runs cancelled\n"
    assert invoke("retry", "--db", db, "--status", "failed").stdout == "0 runs queued again\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["cancel"], "give RUN, or a filter"),
        (["retry"], "give RUN, or a filter"),
        (["cancel", "1", "--task", "t"], "not both"),
        (["retry", "--status", "pending"], "--status"),
        (["cancel", "--status", "failed"], "--status"),
        (["cancel", "--since", "soon"], "--since"),
        (["retry", "--since", "5"], "a unit is required"),
    ],
)
def test_a_bulk_command_misused_is_one_line_and_changes_nothing(
    db: str, args: list[str], says: str
) -> None:
    ids = runs(db, "t")
    assert says in error_line(invoke(*args, "--db", db), exitcodes.USAGE)
    assert statuses(db, ids) == ["pending"]


def test_signal_every_run_a_file_lists(db: str, tmp_path: Path) -> None:
    ids = runs(db, "a", "b")
    with open_store(db) as store:
        lease = store.claim("w", 60)
        assert lease is not None and lease.run_id == ids[0]
        wait = Commit(lease, "wait", next_task="go", delay=3600.0, wait_for="signal:approval")
        assert store.commit_many([wait]).results == (CasResult.OK,)
        assert store.cancel_run(ids[1])
    listed = tmp_path / "runs.txt"
    listed.write_text(f"# the runs to approve\n{ids[0]}\n\n{ids[1]}  # cancelled\n404\n")
    result = invoke("signal", "--db", db, "--runs-file", str(listed), "approval",
                    "--payload", '{"ok": true}')  # fmt: skip
    assert result.stdout == "signal 'approval' sent to 1 run; 2 unknown or finished\n"
    with open_store(db) as store:
        resumed = store.claim("w", 60)
        assert resumed is not None and resumed.signal is not None
        assert resumed.signal.payload == {"ok": True}
    piped = invoke("signal", "--db", db, "--runs-file", "-", "later", stdin=f"{ids[0]}\n")
    assert piped.stdout == "signal 'later' sent to 1 run\n"


@pytest.mark.parametrize(
    ("content", "args", "says"),
    [
        ("1\nx\n", ["approval"], "line 2: not a run id: 'x'"),
        ("# none\n", ["approval"], "lists no run"),
        ("1\n", ["1", "approval"], "signal takes --runs-file FILE NAME"),
    ],
)
def test_a_bad_runs_file_is_one_line(
    db: str, tmp_path: Path, content: str, args: list[str], says: str
) -> None:
    runs(db, "t")
    listed = tmp_path / "runs.txt"
    listed.write_text(content)
    result = invoke("signal", "--db", db, "--runs-file", str(listed), *args)
    assert says in error_line(result, exitcodes.USAGE)
