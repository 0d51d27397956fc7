"""``supervisor start`` parsing with click's CliRunner: options, SUPERVISOR_* variables,
validation, and errors users can cause — one line on stderr, a distinct exit code, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cli_runner
import click
import pytest
from click.testing import Result
from sv_harness import env_with_tests

from supervisor import config as config_module
from supervisor import exitcodes
from supervisor.commands import start as start_module
from supervisor.commands import start_command as cli_module
from supervisor.commands.start_command import start
from supervisor.config import MAX_WORKERS, ChaosConfig, StartConfig, cpu_count, start_options
from workerproc import options
from workerproc.config import WorkerConfig


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[StartConfig]:
    configs: list[StartConfig] = []

    def fake_run(config: StartConfig) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(cli_module, "run_start", fake_run)
    return configs


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    """``supervisor start``'s arguments as one list (most tests build them as data)."""
    return cli_runner.invoke(*args, env=env)


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
    w = config.worker
    assert (w.lease_ttl, w.poll_interval, w.max_attempts) == (60.0, 1.0, 3)
    assert config.workers == cpu_count() == len(os.sched_getaffinity(0))  # one worker per CPU
    assert w.graceful_timeout == 30.0 and config.fast_release and not config.drain
    assert w.task_timeout is None and config.pidfile is None and config.log_format == "text"

    args = ["start", "-n", "4", "--db", "x.db", "--app", "m:app", "--lease-ttl", "5"]
    args += ["--poll-interval", "0.5", "--max-attempts", "7", "--task-timeout", "9", "--drain"]
    args += ["--pidfile", "p", "--graceful-timeout", "3", "--no-fast-release"]
    args += ["--max-worker-memory", "256", "--max-tasks-per-worker", "100", "--log-format", "json"]
    args += ["--heartbeat-interval", "1", "--retry-backoff", "2.5", "--retry-backoff-max", "60"]
    assert invoke(args).exit_code == 0
    c = captured[1]
    w = c.worker
    assert (c.workers, w.lease_ttl, w.poll_interval, w.max_attempts, w.task_timeout) == (
        4, 5.0, 0.5, 7, 9.0,
    )  # fmt: skip
    assert c.drain and c.pidfile == "p" and c.worker.graceful_timeout == 3.0 and not c.fast_release
    assert (c.max_worker_memory, c.max_tasks_per_worker, c.log_format) == (256.0, 100, "json")
    assert c.worker.heartbeat_interval == 1.0


def test_the_default_worker_count_is_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config_module.os, "sched_getaffinity", lambda pid: {0, 2, 5})
    assert cpu_count() == 3  # a cpuset or taskset, not the machine's count
    monkeypatch.setattr(config_module.os, "sched_getaffinity", lambda pid: set(range(1000)))
    assert cpu_count() == MAX_WORKERS  # never more than one supervisor can run

    def no_affinity(pid: int) -> set[int]:
        raise OSError("not supported")

    monkeypatch.setattr(config_module.os, "sched_getaffinity", no_affinity)
    monkeypatch.setattr(config_module.os, "cpu_count", lambda: None)
    assert cpu_count() == 1


def env_value(d: options.Declared) -> tuple[str, object]:
    """A valid value for ``d`` that is not its default, as its variable would carry it."""
    if d.kind is bool:
        return ("0" if d.default else "1"), not d.default
    if d.opt.choices is not None:
        pick = next(c for c in d.opt.choices if c != d.default and (c,) != d.default)
        return pick, (pick,) if d.kind is tuple else pick
    if d.kind in (int, float):
        assert d.opt.low is not None, f"{d.opt.flag} has no lower bound"
        value = d.opt.low if d.opt.low != d.default and not d.opt.above else d.opt.high
        assert value is not None
        value = d.kind(value)
        return str(value), value
    if d.kind is tuple:
        return f"from-env-{d.field},two", (f"from-env-{d.field}", "two")
    return f"from-env-{d.field}", f"from-env-{d.field}"


def test_every_option_reads_its_environment_variable(captured: list[StartConfig]) -> None:
    """Every declared option of ``start``, from its variable alone (none is forgotten)."""
    expected: dict[str, object] = {}
    env: dict[str, str] = {}
    for d in start_options():
        text, value = env_value(d)
        if d.field == "app":
            text = value = "pkg.mod:app"
        env[d.opt.env], expected[d.opt.name] = text, value
    result = invoke(["start"], env)
    assert result.exit_code == 0, result.output
    c = captured[0]
    found = {
        **{d.opt.name: getattr(c, d.field) for d in options.declared(StartConfig)},
        **{d.opt.name: getattr(c.worker, d.field) for d in options.declared(WorkerConfig)},
        **{d.opt.name: getattr(c.chaos, d.field) for d in options.declared(ChaosConfig)},
    }
    for name, value in expected.items():
        assert found[name] == value, name
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
        (["-n", "0"], {}, "-n/--workers must be >= 1 and <= 256 (got 0)"),
        ([], {"SUPERVISOR_WORKERS": "0"}, "(got 0) (from SUPERVISOR_WORKERS)"),
        (["-n", "100000"], {}, "-n/--workers must be >= 1 and <= 256 (got 100000)"),
        (["-n", "two"], {}, "-n/--workers: 'two' is not a whole number"),
        (["--lease-ttl", "0"], {}, "--lease-ttl must be >= 0.5"),
        (["--lease-ttl", "1e-9"], {}, "--lease-ttl must be >= 0.5"),
        (["--lease-ttl", "inf"], {}, "--lease-ttl must be a finite number"),
        (["--lease-ttl", "1e309"], {}, "--lease-ttl must be a finite number"),
        (["--lease-ttl", "nan"], {}, "--lease-ttl must be a finite number"),
        (
            [],
            {"SUPERVISOR_LEASE_TTL": "inf"},
            "finite number (got inf) (from SUPERVISOR_LEASE_TTL)",
        ),
        (["--poll-interval", "0"], {}, "--poll-interval must be >= 0.01"),
        (["--max-attempts", "0"], {}, "--max-attempts must be >= 1"),
        (["--task-timeout", "-1"], {}, "--task-timeout must be >= 0.1"),
        (["--graceful-timeout", "-1"], {}, "--graceful-timeout must be >= 0"),
        (["--max-worker-memory", "0"], {}, "--max-worker-memory must be >= 1"),
        (["--max-tasks-per-worker", "0"], {}, "--max-tasks-per-worker must be >= 1"),
        (["--heartbeat-interval", "120"], {}, "--heartbeat-interval must be below --lease-ttl"),
        (["--retry-backoff", "-1"], {}, "--retry-backoff must be >= 0"),
        (["--retry-backoff", "600"], {}, "--retry-backoff must not exceed --retry-backoff-max"),
        (["--metrics-port", "70000"], {}, "--metrics-port must be >= 0 and <= 65535"),
        (["--chaos-interval", "0"], {}, "--chaos-interval must be >= 0.01"),
        (["--chaos-faults", "kill,boom"], {}, "--chaos-faults must be a comma-separated list"),
        (["--chaos-seed", "-1"], {}, "--chaos-seed must be >= 0"),
        (["--log-format", "xml"], {}, "--log-format must be one of text, json (got xml)"),
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


def test_missing_database_directory_and_corrupt_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another test's abandoned slot thread may still live in this process: the start's
    # one-thread check is not what this test is about
    monkeypatch.setattr(start_module, "other_threads", list)
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
