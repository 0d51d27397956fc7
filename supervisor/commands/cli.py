"""The ``supervisor`` command: ``start`` runs the pool; the rest are operator commands.

Parse -> ``StartConfig`` -> ``validate()`` -> run. Every option of ``start`` and ``web`` can
also come from its variable (``SUPERVISOR_<OPTION>``; ``--help`` shows each); the operator
commands take only ``--db``, ``--pidfile`` and enqueue's ``--queue`` from the environment: what
one call does is on its command line.
"""

from __future__ import annotations

import importlib

import click

from workerproc import __version__

from .clickutil import SupervisorGroup

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# Each command's module, imported only when that command runs (or when ``--help`` lists them
# all): ``supervisor show RUN`` never loads the pool, the dashboard's web stack or the metrics
# exposition. Each module's ``ALL`` lists its commands; tests/cli/test_cli_lazy.py checks that
# this table names every one of them, and nothing else.
COMMANDS = {
    "start": "start_command",
    **dict.fromkeys(["enqueue", "status", "runs", "show", "wait", "check", "prune", "migrate"],
                    "database"),
    **dict.fromkeys(["retry", "cancel", "fork"], "runops"),
    **dict.fromkeys(["forget", "resolve", "spend"], "calls"),
    "schedules": "schedules",
    "limits": "limits",
    "signal": "waits",
    **dict.fromkeys(["stop", "reload", "scale", "health"], "control"),
    "events": "events",
    "stream": "streams",
    "webhooks": "webhooks",
    "web": "web",
}  # fmt: skip


class LazyGroup(SupervisorGroup):
    """The ``supervisor`` group, each command imported from its module at its first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module = importlib.import_module(f"{__package__}.{where}")
        found: dict[str, click.Command] = {c.name or "": c for c in module.ALL}
        return found[cmd_name]


@click.group(name="supervisor", cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="supervisor",
                      message="%(prog)s (leasekeeper) %(version)s")  # fmt: skip
def cli() -> None:
    """leasekeeper's supervisor: run a pool of workers and operate its database."""


def main() -> None:
    cli.main(prog_name="supervisor")
