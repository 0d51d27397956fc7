"""The dashboard as an ASGI app: routes, the guard in front of them, and error pages.

``create_app`` takes an open store: the command opens it from ``--db``; tests hand in their own
(with a fake clock). The app never opens, migrates or closes it. It pins the file ``--db`` names
(if any) and, once that path names another file or none, answers every page and action with 503
(``DatabaseWatch``): an open SQLite connection keeps reading a deleted file. The live parts
of the pages update from ``/events/stream`` (``stream.py``); a run's stream (B21) is served
as ``/runs/{id}/stream`` (``runstream.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from workerproc.identity import parse_owner
from workerproc.store import Operator, StoreError, redact, redact_url
from workerproc.store.protocol.events import KINDS

from ..loop.pinned import PinnedFile
from ..loop.storegate import db_file
from ..operations.render import short
from .actions import Actions
from .config import WebConfig
from .runstream import RunStreams
from .security import Guard, Secrets
from .stream import Streams, opener_for
from .views import Pages

log = logging.getLogger("supervisor.web")
MAX_BODY = 16 * 1024  # bytes: the largest form is a Signal with its payload (at most this)


def create_app(config: WebConfig, store: Operator, streams: Streams | None = None) -> Starlette:
    """The dashboard on ``store``; its event streams on ``streams`` (by default their own, on
    an async store of ``config.db`` opened by the first stream)."""
    if streams is None:
        streams = Streams(opener_for(config.db), config.max_streams)
    keys = Secrets(config.token)
    database = PinnedFile(db_file(config.db))
    with contextlib.suppress(FileNotFoundError):  # the command opened it: it is there
        database.pin()
    streams.gone = lambda: database.problem("the dashboard")  # an open stream ends then too
    templates = Jinja2Templates(env=environment())
    pages = Pages(config, store, templates, keys)
    routes: list[BaseRoute] = [
        Route("/", pages.overview),
        Route("/runs", pages.runs),
        Route("/runs/{run_id:int}", pages.run),
        Route("/leases", pages.leases),
        Route("/limits", pages.limits),
        Route("/webhooks", pages.webhooks),
        Route("/chaos", pages.chaos),
        Route("/events/stream", streams.endpoint),
        Route("/runs/{run_id:int}/stream", RunStreams(streams).endpoint),
        Mount("/static", StaticFiles(packages=[("supervisor.web", "static")]), name="static"),
    ]
    if not config.read_only:
        routes += Actions(store, keys).routes()

    def error_page(request: Request, status: int, message: str) -> Response:
        context = {"config": config, "status": status, "message": message,
                   "path": request.url.path}  # fmt: skip
        return templates.TemplateResponse(request, "error.html", context, status_code=status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        response = error_page(request, exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    async def store_error(request: Request, exc: Exception) -> Response:
        return error_page(request, 503, f"the database does not answer: {redact(str(exc))}")

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_page(request, 500, "the dashboard failed to draw this page (see its log)")

    return Starlette(
        routes=routes,
        middleware=[
            Middleware(Guard, secrets_=keys, hosts=config.hosts()),
            Middleware(DatabaseWatch, database=database, error_page=error_page),
        ],
        exception_handlers={HTTPException: http_error, StoreError: store_error, Exception: crash},
        max_body_size=MAX_BODY,
    )


class DatabaseWatch:
    """ASGI middleware: 503 for every page and action once the database file is gone."""

    def __init__(
        self,
        app: ASGIApp,
        database: PinnedFile,
        error_page: Callable[[Request, int, str], Response],
    ) -> None:
        self.app = app
        self.database = database
        self.error_page = error_page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not str(scope["path"]).startswith("/static/"):
            problem = self.database.problem("the dashboard")
            if problem is not None:
                message = f"{problem}: nothing is shown or done until the dashboard is restarted"
                response = self.error_page(Request(scope), 503, message)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("supervisor.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, seconds=seconds, owner=owner, short=short, pretty=pretty,
                       redact_url=redact_url)  # fmt: skip
    env.globals["event_kinds"] = " ".join(sorted(KINDS))  # what a live part refetches on
    return env


# -- template filters ---------------------------------------------------------------------------
def when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def seconds(value: float | None) -> str:
    """A duration for people: 12 ms, 3.40 s, 2 min 5 s."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{int(value // 60)} min {int(value % 60)} s"


def ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    delta = now - ts
    return f"in {seconds(-delta)}" if delta < 0 else f"{seconds(delta)} ago"


def pretty(value: Any, limit: int = 20_000) -> str:
    """JSON for people: indented, cut at ``limit`` characters."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more)"


def owner(value: Any) -> str:
    """``host:pid:start:suffix`` -> ``pid 1234 (suffix)``; anything else as it is."""
    if not value:
        return "-"
    parsed = parse_owner(str(value))
    return f"pid {parsed.pid} ({parsed.suffix})" if parsed else short(str(value), 40)
