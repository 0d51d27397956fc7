"""The ``supervisor`` commands in this process, through click's CliRunner, as a user's shell runs
them: ``invoke("status", "--db", db)``. The tests' own ``SUPERVISOR_*`` variables never leak into
a command; a test that means one passes it in ``env``."""

from __future__ import annotations

import os
from collections.abc import Mapping

from click.testing import CliRunner, Result

from supervisor.commands.cli import cli


def invoke(*args: str, env: Mapping[str, str] | None = None, stdin: str | None = None) -> Result:
    """Run ``supervisor ARGS``; ``stdin`` is what the command reads from its standard input."""
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SUPERVISOR_")}
    return CliRunner().invoke(cli, list(args), env={**clean, **(env or {})}, input=stdin)


def error_line(result: Result, code: int) -> str:
    """The one line a command that failed with exit ``code`` wrote to stderr (no traceback)."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]
