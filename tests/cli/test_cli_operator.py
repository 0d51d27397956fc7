"""Operator commands through click's CliRunner against a real database: enqueue, status, runs,
show, retry, cancel; and stop/reload/scale/health against pidfiles. Bad input: one line on stderr,
a non-zero exit code, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pg_session
import pytest
from cli_runner import error_line, invoke
from store_backends import fail_run

from supervisor import exitcodes
from supervisor.commands.remote import parse_scale, scale_target
from supervisor.errors import ConfigError
from supervisor.loop.pidfile import state_path
from workerproc.store import open_store


def test_enqueue_prints_the_run_id_and_stores_payload_state_delay(db: str) -> None:
    result = invoke("enqueue", "step", "--db", db, "--payload", '{"doc": "cv.pdf"}')
    assert result.exit_code == 0 and result.stdout.strip() == "1"
    result = invoke("enqueue", "step", "--db", db, "--state", '{"tokens": 0}', "--delay", "60")
    assert result.stdout.strip() == "2"
    with open_store(db) as store:
        assert store.get_tasks(1)[0].payload == {"doc": "cv.pdf"}
        assert store.get_run(2).state == {"tokens": 0}  # type: ignore[union-attr]
        stats = store.stats()
    assert (stats.ready, stats.delayed) == (1, 1)


def test_enqueue_creates_a_new_database_but_not_its_directory(tmp_path: Path) -> None:
    result = invoke("enqueue", "t", "--db", str(tmp_path / "new.db"))
    assert result.stdout.strip() == "1" and "created a new database" in result.stderr
    assert "created" not in invoke("enqueue", "t", "--db", str(tmp_path / "new.db")).stderr
    line = error_line(invoke("enqueue", "t", "--db", str(tmp_path / "no" / "x.db")), 1)
    assert "does not exist" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--payload", "{not json"], "--payload is not valid JSON"),
        (["--state", "[1,"], "--state is not valid JSON"),
        (["--delay", "-5"], "--delay must be a number from 0 to"),
        (["--delay", "soon"], "--delay: 'soon' is not a number"),
    ],
)
def test_enqueue_bad_input(db: str, args: list[str], words: str) -> None:
    assert words in error_line(invoke("enqueue", "t", "--db", db, *args), exitcodes.USAGE)


def test_status_text_and_json(db: str) -> None:
    with open_store(db) as store:
        store.start_run("a")
        store.start_run("b", delay=300)
        store.start_run("c")
        assert store.claim("somehost:1:1.00:ab", ttl=60)
    result = invoke("status", "--db", db)
    assert result.exit_code == 0
    assert "READY" in result.stdout and "somehost:1:1.00:ab" in result.stdout
    doc = json.loads(invoke("status", "--db", db, "--json").stdout)
    assert doc["queue"] == {"ready": 1, "delayed": 1, "leased": 1, "expired": 0}
    assert doc["runs"] == {"pending": 2, "running": 1}
    assert doc["workers"] == [] and doc["supervisor"] is None


def test_status_lists_workers_from_the_supervisor_state(db: str, tmp_path: Path) -> None:
    pidfile = str(tmp_path / "s.pid")
    owner = "h:424242:1.00:ab"
    with open_store(db) as store:
        store.start_run("a")
        lease = store.claim(owner, ttl=60)
        assert lease
    state = {"pid": 1, "phase": "running", "target": 1, "generation": 0, "tick": time.time()}
    state["workers"] = [{"pid": os.getpid(), "index": 0, "owner": owner, "phase": "handler"}]
    Path(state_path(pidfile)).write_text(json.dumps(state))
    Path(pidfile).write_text(f"{os.getpid()}\n")  # this test process plays the supervisor
    doc = json.loads(invoke("status", "--db", db, "--pidfile", pidfile, "--json").stdout)
    (worker,) = doc["workers"]
    assert worker["pid"] == os.getpid() and worker["rss_mb"] > 0
    assert worker["index"] == 0 and worker["slots"] == 1  # "slot" means a handler's place only
    assert (worker["task_id"], worker["run_id"], worker["attempt"]) == (lease.task_id, 1, 1)
    text = invoke("status", "--db", db, "--pidfile", pidfile).stdout
    assert "LEASE EXPIRES" in text and "handler" in text
    assert "INDEX" in text and "SLOT" not in text

    Path(pidfile).write_text(f"{_dead_pid()}\n")  # killed: its state file is stale
    doc = json.loads(invoke("status", "--db", db, "--pidfile", pidfile, "--json").stdout)
    assert doc["workers"] == [] and doc["supervisor"] is None
    text = invoke("status", "--db", db, "--pidfile", pidfile).stdout
    assert "stale" in text and "READY" in text


@pytest.mark.parametrize("command", ["status", "runs"])
def test_missing_and_corrupt_database(tmp_path: Path, command: str) -> None:
    missing = str(tmp_path / "none.db")
    assert "does not exist" in error_line(invoke(command, "--db", missing), exitcodes.ERROR)
    assert not os.path.exists(missing)  # reading never creates a database
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage" * 1000)
    line = error_line(invoke(command, "--db", str(corrupt)), exitcodes.ERROR)
    assert "not a leasekeeper database" in line
    missing_dir = str(tmp_path / "no" / "x.db")
    assert "does not exist" in error_line(invoke(command, "--db", missing_dir), exitcodes.ERROR)


def test_runs_filters_limits_and_json(db: str) -> None:
    with open_store(db) as store:
        for i in range(5):
            store.start_run("t", {"i": i})
        fail_run(store, 2, "boom", "ValueError: x")
        store.cancel_run(3)
    result = invoke("runs", "--db", db)
    assert result.exit_code == 0 and len(result.stdout.strip().splitlines()) == 6
    failed = json.loads(invoke("runs", "--db", db, "--status", "failed", "--json").stdout)
    assert [r["id"] for r in failed] == [2] and failed[0]["failure_reason"] == "boom"
    limited = json.loads(invoke("runs", "--db", db, "--limit", "2", "--json").stdout)
    assert [r["id"] for r in limited] == [5, 4]
    line = error_line(invoke("runs", "--db", db, "--status", "bogus"), exitcodes.USAGE)
    assert "is not one of 'pending', 'running'" in line
    assert "--limit" in error_line(invoke("runs", "--db", db, "--limit", "0"), exitcodes.USAGE)


def test_show_a_run_and_its_tasks(db: str) -> None:
    with open_store(db) as store:
        store.start_run("step", {"x": 1}, state={"tokens": 3})
        lease = store.claim("w", ttl=60)
        assert lease
        store.release(lease, error="RuntimeError: flaky")
    result = invoke("show", "1", "--db", db)
    assert result.exit_code == 0
    # given back after an error: nothing leases it, so it is pending again
    assert "status:     pending" in result.stdout and '"tokens": 3' in result.stdout
    assert "RuntimeError: flaky" in result.stdout and "EXECUTIONS  CLAIMS" in result.stdout
    doc = json.loads(invoke("show", "1", "--db", db, "--json").stdout)
    assert doc["run"]["state"] == {"tokens": 3} and doc["tasks"][0]["attempts"] == 1
    assert (doc["tasks"][0]["executions"], doc["tasks"][0]["claims"]) == (1, 1)


@pytest.mark.parametrize("command", ["show", "retry", "cancel"])
def test_unknown_or_malformed_run_id(db: str, command: str) -> None:
    assert "no run with id 99" in error_line(invoke(command, "99", "--db", db), exitcodes.ERROR)
    line = error_line(invoke(command, "abc", "--db", db), exitcodes.USAGE)
    assert "RUN: 'abc' is not a whole number" in line


def test_retry_a_failed_run_and_refuse_a_pending_one(db: str) -> None:
    with open_store(db) as store:
        store.start_run("t")
        fail_run(store, 1, "boom")
    result = invoke("retry", "1", "--db", db)
    assert result.exit_code == 0 and "queued again" in result.stdout
    with open_store(db) as store:
        assert store.get_run(1).status == "pending"  # type: ignore[union-attr]
    line = error_line(invoke("retry", "1", "--db", db), exitcodes.ERROR)
    assert "only failed or cancelled runs can be retried" in line


def test_retry_of_a_run_whose_cancelled_handler_still_holds_its_lease_says_when(db: str) -> None:
    with open_store(db) as store:
        store.start_run("t")
        lease = store.claim("w1", 300.0)
        assert lease is not None
        store.cancel_run(lease.run_id)
    result = invoke("retry", "1", "--db", db)
    assert result.exit_code == 0, result.output
    assert "run 1 queued again: it begins in " in result.stdout
    seconds = int(result.stdout.split("begins in ")[1].split()[0])
    assert 290 <= seconds <= 300
    with open_store(db) as store:
        assert store.claim("w2", 60.0) is None  # not before that lease runs out


def test_cancel_then_cancel_again(db: str) -> None:
    with open_store(db) as store:
        store.start_run("t")
    assert invoke("cancel", "1", "--db", db).stdout.strip() == "run 1 cancelled"
    assert "already cancelled" in error_line(invoke("cancel", "1", "--db", db), exitcodes.ERROR)


def test_prune_deletes_old_finished_runs_only(db: str) -> None:
    two_hours_ago = time.time() - 7200
    with open_store(db, clock=lambda: two_hours_ago) as old:
        for _ in range(3):
            old.start_run("t")
        for run_id in (1, 2):
            assert old.cancel_run(run_id)
    with open_store(db) as store:
        store.start_run("fresh")
        assert store.cancel_run(4)  # finished just now
    result = invoke("prune", "--db", db, "--older-than", "1h", "--batch", "1")
    assert result.exit_code == 0 and "pruned 2 finished runs" in result.stdout
    with open_store(db) as store:
        assert [r.id for r in store.list_runs()] == [4, 3]  # 3 is old but not finished
        assert store.get_tasks(1) == []
    assert "pruned 0" in invoke("prune", "--db", db, "--older-than", "1h").stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--older-than", "soon"], "--older-than must look like"),
        (["--older-than", "0s"], "between 1s and 3650d"),
        (["--older-than", "4000d"], "between 1s and 3650d"),
        (["--older-than", "1d", "--batch", "0"], "--batch must be between 1 and 10000"),
    ],
)
def test_prune_bad_input(db: str, args: list[str], words: str) -> None:
    assert words in error_line(invoke("prune", "--db", db, *args), exitcodes.USAGE)


def test_reading_commands_refuse_a_missing_postgres_schema() -> None:
    url = pg_session.schema_url()
    line = error_line(invoke("status", "--db", url), exitcodes.ERROR)
    assert "no leasekeeper schema" in line
    assert invoke("enqueue", "t", "--db", url).stdout.strip() == "1"  # enqueue creates it
    assert invoke("status", "--db", url).exit_code == 0


# -- commands that talk to a running supervisor --------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    "args",
    [["stop"], ["stop", "--fast"], ["reload"], ["reload", "--wait"], ["scale", "+1"], ["health"]],
)
def test_no_supervisor_behind_the_pidfile(tmp_path: Path, args: list[str]) -> None:
    pidfile = tmp_path / "s.pid"
    line = error_line(invoke(*args, "--pidfile", str(pidfile)), exitcodes.NOT_RUNNING)
    assert "no supervisor is running" in line
    pidfile.write_text(f"{_dead_pid()}\n")
    line = error_line(invoke(*args, "--pidfile", str(pidfile)), exitcodes.NOT_RUNNING)
    assert "stale" in line


def test_pidfile_is_required_for_signals() -> None:
    line = error_line(invoke("stop"), exitcodes.USAGE)
    assert "Missing option '--pidfile'" in line and "SUPERVISOR_PIDFILE" in line


@pytest.mark.parametrize("spec", ["abc", "0", "+", "1.5", "--2"])
def test_scale_rejects_bad_counts_before_signalling(tmp_path: Path, spec: str) -> None:
    result = invoke("scale", spec, "--pidfile", str(tmp_path / "s.pid"))
    assert "scale" in error_line(result, exitcodes.USAGE)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "soon"])
def test_reload_timeout_has_a_range(tmp_path: Path, value: str) -> None:
    result = invoke("reload", "--wait", "--timeout", value, "--pidfile", str(tmp_path / "s.pid"))
    assert "--timeout" in error_line(result, exitcodes.USAGE)


def test_scale_arithmetic() -> None:
    assert scale_target(*parse_scale("+2"), current=3) == 5
    assert scale_target(*parse_scale("-2"), current=3) == 1
    assert scale_target(*parse_scale("7"), current=3) == 7
    with pytest.raises(ConfigError, match="at least 1"):
        scale_target(*parse_scale("-3"), current=3)


def test_health_alive_ticking_or_silent(tmp_path: Path) -> None:
    pidfile = tmp_path / "s.pid"
    pidfile.write_text(f"{os.getpid()}\n")  # this test process plays the supervisor
    result = invoke("health", "--pidfile", str(pidfile))
    assert result.exit_code == exitcodes.UNHEALTHY and "no state" in result.stderr
    state = {"pid": os.getpid(), "tick": time.time(), "phase": "running", "target": 2}
    state["workers"] = [{}, {}]
    Path(state_path(str(pidfile))).write_text(json.dumps(state))
    result = invoke("health", "--pidfile", str(pidfile))
    assert result.exit_code == 0 and "healthy" in result.stdout
    state["tick"] = time.time() - 60
    Path(state_path(str(pidfile))).write_text(json.dumps(state))
    os.utime(state_path(str(pidfile)), (state["tick"], state["tick"]))  # nobody touched it
    result = invoke("health", "--pidfile", str(pidfile), "--max-age", "10")
    assert result.exit_code == exitcodes.UNHEALTHY and "silent" in result.stderr


def test_health_tells_an_unwritable_state_file_and_a_stalled_pool_apart(tmp_path: Path) -> None:
    pidfile = tmp_path / "s.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    state: dict[str, object] = {"pid": os.getpid(), "tick": time.time() - 60, "target": 2}
    Path(state_path(str(pidfile))).write_text(json.dumps(state))  # old content, fresh mtime
    result = invoke("health", "--pidfile", str(pidfile), "--max-age", "10")
    assert result.exit_code == exitcodes.STATE_UNWRITABLE, result.output
    assert "cannot write its state file" in result.stderr
    result = invoke("health", "--pidfile", str(pidfile), "--max-age", "10", "--liveness")
    assert result.exit_code == 0 and "cannot write its state file" in result.stderr
    os.utime(state_path(str(pidfile)), (time.time() - 60, time.time() - 60))
    result = invoke("health", "--pidfile", str(pidfile), "--max-age", "10", "--liveness")
    assert result.exit_code == exitcodes.UNHEALTHY  # silent: a restart can help

    now = time.time()
    state.update(tick=now, progress={"stalled_since": now - 30, "free": 2})
    Path(state_path(str(pidfile))).write_text(json.dumps(state))
    result = invoke("health", "--pidfile", str(pidfile), "--max-stall", "20")
    assert result.exit_code == exitcodes.STALLED and "2 workers are free" in result.stderr
    result = invoke("health", "--pidfile", str(pidfile), "--max-stall", "40")
    assert result.exit_code == 0, result.output


def test_enqueue_with_debounce_makes_one_run_of_a_burst(db: str) -> None:
    first = invoke("enqueue", "digest", "--db", db, "--key", "u", "--debounce", "30",
                   "--payload", "1")  # fmt: skip
    again = invoke("enqueue", "digest", "--db", db, "--key", "u", "--debounce", "30",
                   "--payload", "2")  # fmt: skip
    assert first.stdout == again.stdout == "1\n"
    with open_store(db) as store:
        assert [t.payload for t in store.get_tasks(1)] == [2]
    line = error_line(invoke("enqueue", "digest", "--db", db, "--debounce", "30"), exitcodes.USAGE)
    assert "--debounce needs --key" in line
