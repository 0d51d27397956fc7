"""What the CLI says, as a user reads it: its version, defaults as declared, help for every option,
the values an option allows, plurals, a run's status in words, what a finished command did, a
prune that names its unit, a fresh PostgreSQL database, and no lock file left behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import cli_runner
import click
import pg_session
import pytest
from cli_runner import error_line
from click.testing import Result
from sv_harness import Supervisor, env_with_tests

from supervisor import exitcodes
from supervisor.commands.cli import cli
from supervisor.operations import render
from workerproc import __version__, open_store


def invoke(*args: str) -> Result:
    """A command with the tests' apps importable (the worker processes it starts import them)."""
    return cli_runner.invoke(*args, env=env_with_tests())


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"supervisor (leasekeeper) {__version__}"


def test_defaults_read_as_declared_without_parentheses() -> None:
    text = invoke("start", "--help").stdout
    flat = " ".join(text.split())
    assert "default: (" not in flat
    assert "default: 60]" in flat  # --lease-ttl
    assert "default: the CPU count]" in flat and "default: ttl / 3]" in flat


def every_command() -> list[click.Command]:
    assert isinstance(cli, click.Group)
    ctx = click.Context(cli)
    found = [cli.get_command(ctx, name) for name in cli.list_commands(ctx)]
    assert None not in found
    return [command for command in found if command is not None]


@pytest.mark.parametrize("command", every_command(), ids=lambda c: c.name)
def test_every_option_has_help(command: click.Command) -> None:
    bare = [p.opts for p in command.params if isinstance(p, click.Option) and not p.help]
    assert not bare, f"{command.name}: options without help: {bare}"


def test_stop_and_scale_timeouts_say_what_they_do() -> None:
    for command in ("stop", "scale"):
        flat = " ".join(invoke(command, "--help").stdout.split())
        assert re.search(r"--timeout S\s+\S", flat) and "give up" in flat, flat


def test_runs_status_lists_its_values() -> None:
    flat = " ".join(invoke("runs", "--help").stdout.split())
    assert "[pending|running|waiting|succeeded|failed|cancelled]" in flat


def test_plurals_and_run_statuses_in_words() -> None:
    assert render.plural(1, "worker") == "1 worker" and render.plural(2, "worker") == "2 workers"
    assert render.plural(0, "finished run") == "0 finished runs"
    assert render.run_status(1, "succeeded") == "run 1 succeeded"
    assert render.run_status(2, "cancelled") == "run 2 was cancelled"
    assert render.run_status(3, "running") == "run 3 is running"


def test_refusals_name_the_run_status_in_words(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        run_id = store.start_run("t")
        lease = store.claim("w", 60)
        assert lease is not None and store.ack(lease)
    line = error_line(invoke("retry", str(run_id), "--db", db), exitcodes.ERROR)
    assert f"run {run_id} succeeded: only failed or cancelled runs can be retried" in line
    line = error_line(invoke("cancel", str(run_id), "--db", db), exitcodes.ERROR)
    assert line.endswith(f"run {run_id} already succeeded"), line
    pruned = invoke("prune", "--db", db, "--older-than", "1h").stdout
    assert pruned.strip() == "pruned 0 finished runs older than 1h"


@pytest.mark.parametrize("value", ["1", "30", "1.5"])
def test_prune_refuses_a_duration_without_its_unit(tmp_path: Path, value: str) -> None:
    db = str(tmp_path / "lk.db")
    open_store(db).close()
    line = error_line(invoke("prune", "--db", db, "--older-than", value), exitcodes.USAGE)
    assert "a unit is required" in line


def test_a_fresh_postgresql_database_says_what_creates_the_schema() -> None:
    url = pg_session.schema_url()
    line = error_line(invoke("runs", "--db", url), exitcodes.ERROR)
    assert "no leasekeeper schema" in line and "supervisor migrate --db URL" in line
    assert "found v0" not in line
    result = invoke("migrate", "--db", url)
    assert result.exit_code == 0 and "the schema is current" in result.stdout
    assert invoke("runs", "--db", url).exit_code == 0


def test_migrate_creates_a_sqlite_database_and_says_so(tmp_path: Path) -> None:
    result = invoke("migrate", "--db", str(tmp_path / "new.db"))
    assert result.exit_code == 0 and "created a new database" in result.stderr
    assert (tmp_path / "new.db").exists()


def test_a_failed_app_import_leaves_no_lock_file(tmp_path: Path) -> None:
    pidfile = tmp_path / "lk.pid"
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "start", "--db", str(tmp_path / "lk.db"),
         "--app", "no_such_module:app", "--pidfile", str(pidfile)],
        capture_output=True, text=True, cwd=tmp_path, env=env_with_tests(), timeout=60,
    )  # fmt: skip
    assert done.returncode == exitcodes.APP_LOAD, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.slow
def test_stop_wait_says_the_supervisor_stopped_and_leaves_nothing(sv: Supervisor) -> None:
    sv.start(n=1).wait_event("ready")
    result = invoke("stop", "--pidfile", sv.pidfile, "--wait", "--timeout", "60")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines == [f"sent TERM to supervisor {sv.pid}", f"supervisor {sv.pid} stopped"]
    assert sv.wait_exit() == 0
    left = {p.name for p in Path(sv.pidfile).parent.iterdir()}
    assert not {n for n in left if n.startswith("sv.pid")}, left
