"""The dashboard's guard, in front of every route: the ``Host`` allow-list, the access token,
the session cookie that CSRF tokens are bound to, and the headers every response carries.

- ``Host``: a request must name the dashboard by one of the names it answers (loopback names,
  its own address, ``--allowed-host``), as Django's ALLOWED_HOSTS does; anything else is 400,
  before any cookie or CSRF token is made. Without it, DNS rebinding turns any web page into a
  same-origin client of a dashboard on 127.0.0.1: its name re-resolved to 127.0.0.1, its
  scripts read our pages and post our forms with our cookie and CSRF token.

- ``--token``: a request passes with ``Authorization: Bearer TOKEN``, or with the cookie a
  first ``?token=TOKEN`` visit set (the visit is redirected at once to the same URL without the
  token, so it stays out of the history and of ``Referer``). Anything else gets 401.
- CSRF: each browser gets a random session id in an HttpOnly, SameSite=Strict cookie; its
  CSRF token is an HMAC of that id under a secret made when the process starts. A POST must
  carry the token of its own cookie, and a cross-site ``Origin`` is refused outright.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import URL, Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "lk_session"
AUTH_COOKIE = "lk_auth"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # (no-referrer would make a browser send "Origin: null")
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


class Secrets:
    """Per-process secrets: a restart invalidates every session, CSRF token and auth cookie."""

    def __init__(self, token: str | None) -> None:
        self._key = secrets.token_bytes(32)
        self.token = token

    def _mac(self, purpose: str, value: str) -> str:
        message = f"{purpose}\0{value}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def csrf_token(self, session: str) -> str:
        return self._mac("csrf", session)

    def csrf_ok(self, session: str, token: str) -> bool:
        return bool(session) and hmac.compare_digest(self.csrf_token(session), token)

    def auth_cookie(self) -> str:
        assert self.token is not None
        return self._mac("auth", self.token)

    def authorized(self, headers: Headers, cookies: dict[str, str]) -> bool:
        if self.token is None:
            return True
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self.token.encode()):
            return True
        return hmac.compare_digest(cookies.get(AUTH_COOKIE, ""), self.auth_cookie())

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())


def cookies_of(headers: Headers) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:  # a malformed Cookie header is no cookie at all
        return {}
    return {key: morsel.value for key, morsel in jar.items()}


def _cookie(name: str, value: str) -> str:
    return f"{name}={value}; Path=/; HttpOnly; SameSite=Strict"


class Guard:
    """ASGI middleware: token, session cookie, security headers (every HTTP request)."""

    def __init__(self, app: ASGIApp, secrets_: Secrets, hosts: tuple[str, ...]) -> None:
        self.app = app
        self.secrets = secrets_
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        cookies = cookies_of(headers)
        early = self._foreign_host(headers) or self._gate(scope, headers, cookies)
        if early is not None:
            for key, value in HEADERS.items():
                early.headers.setdefault(key, value)
            await early(scope, receive, send)
            return
        session = cookies.get(SESSION_COOKIE, "")
        extra = []
        if not session or len(session) > 64:
            session = secrets.token_urlsafe(24)
            extra.append(_cookie(SESSION_COOKIE, session))
        scope.setdefault("state", {})["session"] = session

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for key, value in HEADERS.items():
                    out.setdefault(key, value)
                for cookie in extra:
                    out.append("set-cookie", cookie)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _foreign_host(self, headers: Headers) -> Response | None:
        """400 for a ``Host`` this dashboard does not answer to (no cookie, no CSRF token)."""
        if host_allowed(headers.get("host", ""), self.hosts):
            return None
        return PlainTextResponse(
            "400: this dashboard does not answer to this Host name (add it with "
            "--allowed-host when a proxy forwards it)\n",
            status_code=400,
        )

    def _gate(self, scope: Scope, headers: Headers, cookies: dict[str, str]) -> Response | None:
        """A response that ends the request here (401, or the ?token= redirect), or None."""
        if self.secrets.token is None:
            return None
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if given and self.secrets.token_matches(given[-1]):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            target = local_path(str(scope["path"])) + (f"?{rest}" if rest else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.headers.append("set-cookie", _cookie(AUTH_COOKIE, self.secrets.auth_cookie()))
            return response
        if self.secrets.authorized(headers, cookies):
            return None
        return PlainTextResponse(
            "401: this dashboard needs its token: open it once as /?token=TOKEN "
            "(or send 'Authorization: Bearer TOKEN')\n",
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="leasekeeper"'},
        )


def local_path(path: str) -> str:
    """``path`` as a redirect target that stays on this dashboard: ``//evil.example/`` and
    ``/\\evil.example/`` would be another site's URL to a browser (scheme-relative)."""
    return "/" + path.lstrip("/\\")


def host_name(header: str) -> str:
    """The name in a ``Host`` header: lower case, without port and trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):  # an IPv6 address: [::1]:8000
        name, bracket, rest = value.partition("]")
        port = rest.removeprefix(":")
        ok = bracket and (not rest or (rest.startswith(":") and port.isascii() and port.isdigit()))
        return name + bracket if ok else ""
    name, colon, port = value.rpartition(":")
    if not colon:
        name = value
    elif not (port.isascii() and port.isdigit()):
        return ""
    return name.removesuffix(".")


def host_allowed(header: str, allowed: tuple[str, ...]) -> bool:
    name = host_name(header)
    if not name:
        return False
    for pattern in allowed:
        if pattern.startswith("."):
            if name == pattern[1:] or name.endswith(pattern):
                return True
        elif name == pattern:
            return True
    return False


def session_of(request: Request) -> str:
    return str(request.state.session)


def same_origin(request: Request) -> bool:
    """A browser names the page a POST came from; it must be this dashboard (or say nothing)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return URL(origin).netloc == host
