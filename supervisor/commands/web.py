"""``supervisor web``: the dashboard, in its own process (never inside ``supervisor start``)."""

from __future__ import annotations

import click

from ..errors import SupervisorError
from ..web.config import PORT_RANGE, REFRESH_RANGE, WebConfig
from . import store_actions
from .clickutil import db_option, option


@click.command(context_settings={"show_default": True})
@db_option
@option("--host", envvar="SUPERVISOR_WEB_HOST", default="127.0.0.1", metavar="ADDR",
        help="address to listen on")  # fmt: skip
@option("--port", envvar="SUPERVISOR_WEB_PORT", type=click.IntRange(*PORT_RANGE), default=8000,
        help="port to listen on (0: any free port, printed)")  # fmt: skip
@option("--pidfile", default=None, metavar="FILE", help="show this supervisor's workers")
@option("--chaos-report", default=None, metavar="FILE", help="draw this chaos report")
@option("--read-only", envvar="SUPERVISOR_WEB_READ_ONLY", is_flag=True, default=False,
        help="no retry or cancel: the action routes are not served")  # fmt: skip
@option("--token", envvar="SUPERVISOR_WEB_TOKEN", default=None, metavar="T",
        help="every request must carry this token (8+ characters)")  # fmt: skip
@option("--refresh", envvar="SUPERVISOR_WEB_REFRESH", type=click.FloatRange(*REFRESH_RANGE),
        default=2.0, metavar="S", help="seconds between live updates of a page")  # fmt: skip
def web(
    db: str,
    host: str,
    port: int,
    pidfile: str | None,
    chaos_report: str | None,
    read_only: bool,
    token: str | None,
    refresh: float,
) -> int:
    """Serve the dashboard: runs, their attempts, live leases, workers, the chaos report."""
    config = WebConfig(db, host, port, pidfile, chaos_report, read_only, token, refresh).validate()
    try:
        from ..web.server import serve  # noqa: PLC0415 - the optional `web` extra
    except ImportError as exc:
        raise SupervisorError(
            f"the dashboard needs the web extra (pip install 'leasekeeper[web]'): {exc}"
        ) from None
    with store_actions.store_for(db) as store:
        return serve(config, store)


ALL = [web]
