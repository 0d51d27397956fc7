"""``supervisor web``: the dashboard, in its own process (never inside ``supervisor start``)."""

from __future__ import annotations

import os
from typing import Any

import click

from workerproc import options

from ..errors import ConfigError, SupervisorError
from ..operations import actions
from ..web.config import WebConfig
from .clickutil import declared_options


@click.command(context_settings={"show_default": True})
@declared_options(list(options.declared(WebConfig)))
def web(**values: Any) -> int:
    """Serve the dashboard: runs, their attempts, live leases, workers, the chaos report."""
    for name in ("SUPERVISOR_WEB_TOKEN", "SUPERVISOR_WEB_TOKEN_FILE"):
        if os.environ.get(name) == "":  # click reads an empty variable as none: no token at all
            raise ConfigError(f"{name} is set but empty (unset it to serve without a token)")
    config = options.build(WebConfig, values).validate().with_token_file()
    try:
        from ..web.server import serve  # noqa: PLC0415 - the optional `web` extra
    except ImportError as exc:
        raise SupervisorError(
            f"the dashboard needs the web extra (pip install 'leasekeeper[web]'): {exc}"
        ) from None
    with actions.store_for(config.db) as store:
        return serve(config, store)


ALL = [web]
