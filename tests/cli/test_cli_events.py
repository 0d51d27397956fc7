"""``supervisor events`` against a real database on both backends: the listing in
commit order, ``--after``, ``--run``, ``--json`` (one object per line), ``--follow`` in a
process of its own that prints each new event as it commits; bad input in one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke
from helpers import wait_for
from sv_harness import env_with_tests

from workerproc.store import open_store


def test_events_lists_filters_and_prints_json(db: str) -> None:
    with open_store(db) as store:
        first, second = store.start_runs([{"task": "a"}, {"task": "b"}])
        store.cancel_run(first)
    result = invoke("events", "--db", db)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3 and "run.enqueued" in lines[0] and "run.cancelled" in lines[2]
    assert f"run {second}" in lines[1]
    docs = [json.loads(x) for x in invoke("events", "--db", db, "--json").stdout.splitlines()]
    assert [d["kind"] for d in docs] == ["run.enqueued", "run.enqueued", "run.cancelled"]
    assert set(docs[0]) == {"id", "at", "run_id", "kind", "task", "attempt", "data"}
    after = invoke("events", "--db", db, "--json", "--after", str(docs[0]["id"])).stdout
    assert [json.loads(x)["id"] for x in after.splitlines()] == [d["id"] for d in docs[1:]]
    mine = invoke("events", "--db", db, "--json", "--run", str(first)).stdout
    assert [json.loads(x)["kind"] for x in mine.splitlines()] == ["run.enqueued",
                                                                   "run.cancelled"]  # fmt: skip
    limited = invoke("events", "--db", db, "--limit", "1").stdout
    assert len(limited.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--after", "-1"], "--after must be"), (["--run", "x"], "not a whole number"),
     (["--limit", "0"], "--limit must be")],
)  # fmt: skip
def test_events_bad_input_is_one_line(db: str, args: list[str], words: str) -> None:
    result = invoke("events", "--db", db, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output


def test_events_of_a_missing_database_is_one_line(tmp_path: Path) -> None:
    result = invoke("events", "--db", str(tmp_path / "nope.db"))
    assert result.exit_code != 0 and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_events_follow_prints_each_new_event_as_it_commits(db: str, tmp_path: Path) -> None:
    with open_store(db) as store:
        store.start_run("before")
    out = tmp_path / "follow.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "supervisor", "events", "--db", db,
                                 "--follow", "--json"], stdout=sink, stderr=subprocess.STDOUT,
                                env=env_with_tests(), start_new_session=True)  # fmt: skip
    try:

        def seen() -> list[dict[str, object]]:
            return [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]

        wait_for(lambda: len(seen()) == 1, 30, what="the first event")
        with open_store(db) as store:
            store.start_runs([{"task": "later"}, {"task": "later"}])
        wait_for(lambda: len(seen()) == 3, 30, what="the new events")
        assert [d["task"] for d in seen()] == ["before", "later", "later"]
        proc.send_signal(signal.SIGINT)  # Ctrl-C: stops quietly
        assert proc.wait(10) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_events_follow_stops_when_its_database_file_goes(tmp_path: Path, how: str) -> None:
    """A follower of a deleted (or replaced) SQLite file says so in one line and
    exits 1, as ``start`` does, instead of following the old inode for ever and never seeing
    the file now at that path."""
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        store.start_run("before")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "events", "--db", db,
                             "--follow", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_with_tests(),
                            start_new_session=True, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("{")  # following
        for suffix in ("", "-wal", "-shm"):
            Path(db + suffix).unlink(missing_ok=True)
        if how == "replaced":  # a new database at the path: another file, never followed
            with open_store(db) as store:
                store.start_run("other")
        out, err = proc.communicate(timeout=30)  # it looks at least once a second
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, err
    (line,) = err.strip().splitlines()
    assert f"the database file {db} was {how}" in line and "Traceback" not in err
    assert "other" not in out
