"""``supervisor start`` parsing with click's CliRunner: options, SUPERVISOR_* variables,
validation, and errors users can cause — one line on stderr, a distinct exit code, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from sv_harness import env_with_tests

from supervisor import exitcodes
from supervisor.commands import cli as cli_module
from supervisor.commands.cli import cli, start
from supervisor.config import StartConfig


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[StartConfig]:
    configs: list[StartConfig] = []

    def fake_run(config: StartConfig) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(cli_module, "run_start", fake_run)
    return configs


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    clean = {k: None for k in os.environ if k.startswith("SUPERVISOR_")}
    return CliRunner().invoke(cli, args, env={**clean, **(env or {})})  # type: ignore[dict-item]


def one_error_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert lines[0].startswith("supervisor: error: ")
    return lines[0]


def test_defaults_and_flags(captured: list[StartConfig]) -> None:
    result = invoke(["start", "--db", "x.db", "--app", "m:app"])
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert (config.workers, config.lease_ttl, config.poll_interval, config.max_attempts) == (
        1, 60.0, 1.0, 3,
    )  # fmt: skip
    assert config.graceful_timeout == 30.0 and config.fast_release and not config.drain
    assert config.task_timeout is None and config.pidfile is None and config.log_format == "text"

    args = ["start", "-n", "4", "--db", "x.db", "--app", "m:app", "--lease-ttl", "5"]
    args += ["--poll-interval", "0.5", "--max-attempts", "7", "--task-timeout", "9", "--drain"]
    args += ["--pidfile", "p", "--graceful-timeout", "3", "--no-fast-release"]
    args += ["--max-worker-memory", "256", "--max-tasks-per-worker", "100", "--log-format", "json"]
    args += ["--heartbeat-interval", "1"]
    assert invoke(args).exit_code == 0
    c = captured[1]
    assert (c.workers, c.lease_ttl, c.poll_interval, c.max_attempts, c.task_timeout) == (
        4, 5.0, 0.5, 7, 9.0,
    )  # fmt: skip
    assert c.drain and c.pidfile == "p" and c.graceful_timeout == 3.0 and not c.fast_release
    assert (c.max_worker_memory, c.max_tasks_per_worker, c.log_format) == (256.0, 100, "json")
    assert c.heartbeat_interval == 1.0


def test_every_option_reads_its_environment_variable(captured: list[StartConfig]) -> None:
    env = {
        "SUPERVISOR_WORKERS": "3",
        "SUPERVISOR_DB": "env.db",
        "SUPERVISOR_APP": "pkg.mod:app",
        "SUPERVISOR_LEASE_TTL": "12",
        "SUPERVISOR_POLL_INTERVAL": "0.25",
        "SUPERVISOR_MAX_ATTEMPTS": "5",
        "SUPERVISOR_TASK_TIMEOUT": "30",
        "SUPERVISOR_HEARTBEAT_INTERVAL": "2",
        "SUPERVISOR_DRAIN": "1",
        "SUPERVISOR_PIDFILE": "/run/x.pid",
        "SUPERVISOR_GRACEFUL_TIMEOUT": "45",
        "SUPERVISOR_FAST_RELEASE": "false",
        "SUPERVISOR_MAX_WORKER_MEMORY": "512",
        "SUPERVISOR_MAX_TASKS_PER_WORKER": "1000",
        "SUPERVISOR_LOG_FORMAT": "json",
    }
    result = invoke(["start"], env)
    assert result.exit_code == 0, result.output
    c = captured[0]
    assert (c.workers, c.db, c.app, c.lease_ttl, c.poll_interval) == (
        3, "env.db", "pkg.mod:app", 12.0, 0.25,
    )  # fmt: skip
    assert (c.max_attempts, c.task_timeout, c.heartbeat_interval, c.drain) == (5, 30.0, 2.0, True)
    assert (c.pidfile, c.graceful_timeout, c.fast_release) == ("/run/x.pid", 45.0, False)
    assert (c.max_worker_memory, c.max_tasks_per_worker, c.log_format) == (512.0, 1000, "json")
    # a flag on the command line wins over the environment
    assert invoke(["start", "-n", "6"], env).exit_code == 0
    assert captured[1].workers == 6


def test_help_shows_the_variable_of_every_option() -> None:
    result = invoke(["start", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for param in start.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert f"SUPERVISOR_{param.name.upper()}" in text.replace("- ", "-")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["-n", "0"], {}, "-n/--workers must be at least 1"),
        ([], {"SUPERVISOR_WORKERS": "0"}, "-n/--workers must be at least 1"),
        (["-n", "two"], {}, "'two' is not a valid integer"),
        (["--lease-ttl", "0"], {}, "--lease-ttl must be greater than 0"),
        (["--poll-interval", "0"], {}, "--poll-interval must be greater than 0"),
        (["--max-attempts", "0"], {}, "--max-attempts must be at least 1"),
        (["--task-timeout", "-1"], {}, "--task-timeout"),
        (["--graceful-timeout", "-1"], {}, "--graceful-timeout"),
        (["--max-worker-memory", "0"], {}, "--max-worker-memory"),
        (["--max-tasks-per-worker", "0"], {}, "--max-tasks-per-worker"),
        (["--heartbeat-interval", "120"], {}, "--heartbeat-interval"),
        (["--log-format", "xml"], {}, "'xml' is not one of"),
        (["--bogus"], {}, "No such option '--bogus'"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    args: list[str], env: dict[str, str], words: str, captured: list[StartConfig]
) -> None:
    result = invoke(["start", "--db", "x.db", "--app", "m:app", *args], env)
    assert result.exit_code == exitcodes.USAGE
    assert words in one_error_line(result)
    assert not captured


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--app", "m:app"], "Missing option '--db'"),
        (["--db", "x.db"], "Missing option '--app'"),
        (["--db", "x.db", "--app", "nocolon"], "--app must look like MODULE:ATTR"),
    ],
)
def test_missing_or_malformed_required_options(args: list[str], words: str) -> None:
    result = invoke(["start", *args])
    assert result.exit_code == exitcodes.USAGE
    assert words in one_error_line(result)


# -- real start-up failures (nothing is forked: each fails before the first fork) -----------------
@pytest.mark.parametrize(
    ("app", "words"),
    [
        ("apps.sv_broken:app", "RuntimeError: this app is broken on purpose"),
        ("apps.no_such_module:app", "cannot import 'apps.no_such_module'"),
        ("apps.sv_app:nothing", "has no attribute 'nothing'"),
        ("apps.sv_app:noop", "not a workerproc.App"),
    ],
)
def test_unimportable_app_exits_3(tmp_path: Path, app: str, words: str) -> None:
    result = invoke(["start", "--db", str(tmp_path / "x.db"), "--app", app])
    assert result.exit_code == exitcodes.APP_LOAD
    assert words in one_error_line(result)


def test_missing_database_directory_and_corrupt_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "x.db")
    result = invoke(["start", "--db", missing, "--app", "apps.sv_app:app"])
    assert result.exit_code == exitcodes.ERROR
    assert "does not exist" in one_error_line(result)

    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not sqlite at all" * 100)
    result = invoke(["start", "--db", str(corrupt), "--app", "apps.sv_app:app"])
    assert result.exit_code == exitcodes.ERROR
    assert "not a leasekeeper database" in one_error_line(result)


def test_pidfile_in_a_missing_directory(tmp_path: Path) -> None:
    args = ["start", "--db", str(tmp_path / "x.db"), "--app", "apps.sv_app:app"]
    result = invoke([*args, "--pidfile", str(tmp_path / "nope" / "s.pid")])
    assert result.exit_code == exitcodes.ERROR
    assert "pidfile directory" in one_error_line(result)


def test_no_arguments_prints_help() -> None:
    result = invoke([])
    assert "Usage: supervisor" in result.output and "Commands:" in result.output
    assert "error" not in result.output


def test_an_app_that_starts_threads_at_import_is_refused(tmp_path: Path) -> None:
    # a subprocess: the thread must not linger in the test process
    cmd = [sys.executable, "-m", "supervisor", "start", "--db", str(tmp_path / "x.db")]
    cmd += ["--app", "apps.sv_threads:app"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env_with_tests(), timeout=60)
    assert out.returncode == exitcodes.APP_LOAD
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "started threads (metrics-pusher)" in lines[0]
