"""The ``supervisor`` group imports a command's module only when that command runs: its table
of commands (``cli.COMMANDS``) names every command of every module, and a one-run command
loads neither the pool, nor the web stack, nor the metrics exposition, nor PostgreSQL's driver
(counted in a fresh interpreter, so nothing another test imported hides it)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import click
import pytest

import supervisor.commands
from supervisor.commands.cli import COMMANDS, SUMMARIES, cli


def test_the_table_names_every_command_of_every_module_and_nothing_else() -> None:
    declared: dict[str, str] = {}
    for info in pkgutil.iter_modules(supervisor.commands.__path__):
        module = importlib.import_module(f"supervisor.commands.{info.name}")
        for command in getattr(module, "ALL", []):
            assert isinstance(command, click.Command)
            declared[command.name or ""] = info.name
    assert declared == COMMANDS
    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == sorted(COMMANDS)
    assert cli.get_command(ctx, "no-such-command") is None


HEAVY = ("supervisor.loop.arbiter", "supervisor.web", "starlette", "prometheus_client",
         "psycopg", "opentelemetry", "workerproc.worker", "workerproc.store.aio",
         "workerproc.store.postgres", "supervisor.chaos", "uvicorn")  # fmt: skip


def loaded_by(*argv: str, tmp: str) -> set[str]:
    """The modules a fresh ``python -m supervisor ARGV`` has loaded when it exits."""
    probe = ("import json, runpy, sys\n"
             "sys.argv = ['supervisor', *json.loads(sys.argv[1])]\n"
             "try:\n    runpy.run_module('supervisor', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", probe, json.dumps(argv)], cwd=tmp,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    return set(json.loads(proc.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv", [("--version",), ("show", "1"), ("signal", "1", "go"), ("enqueue", "t"),
             ("cancel", "1"), ("retry", "1"), ("runs",)],
    ids=lambda argv: argv[0],
)  # fmt: skip
def test_a_one_run_command_loads_no_heavy_module(argv: tuple[str, ...], tmp_path: object) -> None:
    db = f"{tmp_path}/lk.db"
    subprocess.run([sys.executable, "-m", "supervisor", "migrate", "--db", db], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    loaded = loaded_by(*argv, *(() if argv == ("--version",) else ("--db", db)), tmp=str(tmp_path))
    heavy = sorted(m for m in loaded if m.startswith(HEAVY))
    assert heavy == [], f"supervisor {' '.join(argv)} loaded {heavy[:10]}"


def test_each_listed_line_is_its_commands_own_short_help() -> None:
    ctx = click.Context(cli)
    assert sorted(SUMMARIES) == sorted(COMMANDS)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        assert not command.hidden and not command.deprecated and command.short_help is None
        listed = click.Command(name, help=SUMMARIES[name])
        for limit in (20, 45, 74, 94, 10**6):
            assert listed.get_short_help_str(limit) == command.get_short_help_str(limit), name


def test_help_lists_every_command_without_importing_one(tmp_path: object) -> None:
    loaded = loaded_by("--help", tmp=str(tmp_path))
    modules = {f"supervisor.commands.{where}" for where in COMMANDS.values()}
    assert sorted(modules & loaded) == []
    listing = subprocess.run([sys.executable, "-m", "supervisor", "--help"], capture_output=True,
                             text=True, timeout=120, check=True).stdout  # fmt: skip
    listed = listing.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(COMMANDS)
