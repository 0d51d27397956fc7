"""``supervisor schedules [--json] [--drop NAME]`` on both backends: what apps
declared, the next run, the last tick and its run's status; errors are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import invoke

from workerproc.store import open_store
from workerproc.store.schedules import ScheduleSpec


@pytest.fixture
def db(db: str) -> str:
    """The database (each backend), with one schedule declared and fired once."""
    url = db
    clock = [1_800_000_000.5]
    with open_store(url, clock=lambda: clock[0]) as store:
        spec = ScheduleSpec.declare("*/5 * * * *", task="report", payload={"k": 1},
                                    tz="Europe/Berlin", catch_up="one")  # fmt: skip
        store.declare_schedules({spec.name: spec}, by="host-a")
        clock[0] += 600  # two ticks came due: catch_up="one" starts one run
        (fired,) = store.fire_schedules()
        assert len(fired.run_ids) == 1
    return url


def test_the_table_and_the_json_name_every_column(db: str) -> None:
    result = invoke("schedules", "--db", db)
    assert result.exit_code == 0, result.output
    header, row = result.stdout.strip().splitlines()
    for word in ("NAME", "CRON", "TZ", "TASK", "NEXT RUN", "LAST TICK", "LAST RUN", "STATUS"):
        assert word in header
    assert row.split()[:5] == ["report", "*/5", "*", "*", "*"]
    assert "Europe/Berlin" in row and "pending" in row
    (doc,) = json.loads(invoke("schedules", "--db", db, "--json").stdout)
    assert doc["name"] == "report" and doc["payload"] == {"k": 1} and doc["fired"] == 1
    assert doc["last_status"] == "pending" and doc["last_run"] == 1
    assert doc["next_at"] == doc["last_tick"] + 300 and doc["declared_by"] == "host-a"


def test_drop_forgets_a_schedule_and_an_unknown_one_is_one_error_line(db: str) -> None:
    result = invoke("schedules", "--db", db, "--drop", "report")
    assert result.exit_code == 0 and "dropped" in result.stdout
    result = invoke("schedules", "--db", db, "--drop", "report")
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no schedule 'report'" in lines[0] and "Traceback" not in lines[0]
    assert json.loads(invoke("schedules", "--db", db, "--json").stdout) == []


def test_a_missing_database_is_one_error_line(tmp_path: Path) -> None:
    result = invoke("schedules", "--db", str(tmp_path / "none.db"))
    assert result.exit_code != 0 and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
