"""The dashboard as an ASGI app: routes, the guard in front of them, and error pages.

``create_app`` takes an open store: the command opens it from ``--db``; tests hand in their own
(with a fake clock). The app never opens, migrates or closes it.
"""

from __future__ import annotations

import json
import logging
import time
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

from workerproc.identity import parse_owner
from workerproc.store import Operator, StoreError

from ..commands.render import short
from .actions import Actions
from .config import WebConfig
from .security import Guard, Secrets
from .views import Pages

log = logging.getLogger("supervisor.web")
MAX_BODY = 16 * 1024  # bytes: the largest form is a CSRF token


def create_app(config: WebConfig, store: Operator) -> Starlette:
    keys = Secrets(config.token)
    templates = Jinja2Templates(env=environment())
    pages = Pages(config, store, templates, keys)
    routes: list[BaseRoute] = [
        Route("/", pages.overview),
        Route("/runs", pages.runs),
        Route("/runs/{run_id:int}", pages.run),
        Route("/leases", pages.leases),
        Route("/chaos", pages.chaos),
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
        return error_page(request, 503, f"the database does not answer: {exc}")

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_page(request, 500, "the dashboard failed to draw this page (see its log)")

    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, secrets_=keys)],
        exception_handlers={HTTPException: http_error, StoreError: store_error, Exception: crash},
        max_body_size=MAX_BODY,
    )


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("supervisor.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, seconds=seconds, owner=owner, short=short, pretty=pretty)
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
