"""``supervisor fork RUN --from STEP [--state JSON]`` on both backends: it prints the new run's
id, the run begins at that step with the state it was entered with (or --state), and every
mistake a user can make is one line on stderr with a non-zero exit, nothing written."""

from __future__ import annotations

import json

import helpers
import pytest
from cli_runner import error_line, invoke

from supervisor import exitcodes
from workerproc.store import open_store


def failed_at_step_two(db: str) -> int:
    with open_store(db) as store:
        return helpers.failed_at_step_two(store)


def test_fork_prints_the_new_run_and_leaves_the_source_failed(db: str) -> None:
    source = failed_at_step_two(db)
    result = invoke("fork", str(source), "--from", "2", "--db", db)
    assert result.exit_code == 0, result.output
    new = int(result.stdout.strip())
    given = invoke("fork", str(source), "--from", "1", "--state", '{"fixed": true}', "--db", db)
    assert given.exit_code == 0, given.output
    with open_store(db) as store:
        run = store.get_run(new)
        assert run is not None and (run.status, run.task, run.state) == ("pending", "b", {"n": 1})
        other = store.get_run(int(given.stdout.strip()))
        assert other is not None and (other.task, other.state) == ("a", {"fixed": True})
        was = store.get_run(source)
        assert was is not None and was.status == "failed"
    shown = invoke("show", str(new), "--db", db)
    assert shown.exit_code == 0 and "b" in shown.stdout
    steps = invoke("show", str(source), "--db", db, "--json")  # numbered as --from counts
    assert [(t["step"], t["name"]) for t in json.loads(steps.stdout)["tasks"]] == [
        (1, "a"), (2, "b"),
    ]  # fmt: skip
    table = invoke("show", str(source), "--db", db).stdout.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("STEP "))
    assert [line.split()[0] for line in table[head + 1 : head + 3]] == ["1", "2"]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["RUN+99", "--from", "1"], exitcodes.ERROR, "no run with id"),
        (["RUN", "--from", "3"], exitcodes.ERROR, "never entered step 3 (it entered 2 steps)"),
        (["RUN", "--from", "0"], exitcodes.USAGE, "--from must be a number from 1"),
        (["RUN", "--from", "two"], exitcodes.USAGE, "--from: 'two' is not a whole number"),
        (["RUN"], exitcodes.USAGE, "--from"),
        (["RUN", "--from", "1", "--state", "{nope"], exitcodes.USAGE, "--state"),
        (["RUN", "--from", "1", "--state", "NaN"], exitcodes.USAGE, "--state"),
        (["RUN", "--from", "1", "--state", "[" * 200 + "]" * 200], exitcodes.USAGE, "--state"),
        (["RUN", "--from", "1", "--state", "null"], exitcodes.USAGE, "leave --state out"),
    ],
    ids=["unknown run", "step never entered", "step 0", "not a number", "no --from",
         "bad json", "nan", "too deep", "null state"],
)  # fmt: skip
def test_what_a_user_gets_wrong_is_one_line(db: str, args: list[str], code: int, says: str) -> None:
    source = failed_at_step_two(db)
    words = [str(source + 99) if a == "RUN+99" else str(source) if a == "RUN" else a for a in args]
    line = error_line(invoke("fork", *words, "--db", db), code)
    assert says in line, line
    with open_store(db) as store:
        assert [r.id for r in store.list_runs()] == [source]  # nothing was started


def test_a_state_over_the_limit_is_one_line(db: str) -> None:
    source = failed_at_step_two(db)
    big = '{"x": "' + "y" * (9 << 20) + '"}'
    line = error_line(invoke("fork", str(source), "--from", "1", "--state", big, "--db", db),
                      exitcodes.USAGE)  # fmt: skip
    assert "--state" in line and "over the limit" in line
