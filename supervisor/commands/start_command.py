"""``supervisor start``: its options are the declared ones of the pool, each worker and chaos
mode (``supervisor.config.start_options``)."""

from __future__ import annotations

from typing import Any

import click

from ..config import start_config, start_options
from .clickutil import declared_options
from .start import run_start


@click.command()
@declared_options(start_options())
def start(**values: Any) -> int:
    """Fork N workers and keep them alive until TERM/INT (graceful) or QUIT (fast)."""
    return run_start(start_config(values))


ALL = [start]
