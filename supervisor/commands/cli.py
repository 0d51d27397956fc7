"""The ``supervisor`` command: ``start`` runs the pool; the rest are operator commands.

Parse -> ``StartConfig`` -> ``validate()`` -> run. Every option of ``start`` and ``web`` can
also come from its variable (``SUPERVISOR_<OPTION>``; ``--help`` shows each); the operator
commands take only ``--db``, ``--pidfile`` and enqueue's ``--queue`` from the environment: what
one call does is on its command line.
"""

from __future__ import annotations

from typing import Any

import click

from workerproc import __version__

from ..config import start_config, start_options
from . import (
    calls,
    control,
    database,
    events,
    limits,
    runops,
    schedules,
    streams,
    waits,
    web,
    webhooks,
)
from .clickutil import SupervisorGroup, declared_options
from .start import run_start

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(name="supervisor", cls=SupervisorGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="supervisor",
                      message="%(prog)s (leasekeeper) %(version)s")  # fmt: skip
def cli() -> None:
    """leasekeeper's supervisor: run a pool of workers and operate its database."""


@cli.command()
@declared_options(start_options())
def start(**values: Any) -> int:
    """Fork N workers and keep them alive until TERM/INT (graceful) or QUIT (fast)."""
    return run_start(start_config(values))


for command in (
    database.ALL
    + runops.ALL
    + calls.ALL
    + schedules.ALL
    + limits.ALL
    + waits.ALL
    + control.ALL
    + events.ALL
    + streams.ALL
    + webhooks.ALL
    + web.ALL
):
    cli.add_command(command)


def main() -> None:
    cli.main(prog_name="supervisor")
