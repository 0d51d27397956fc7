"""The dashboard's guard, in front of every route: the access token, the session cookie that
CSRF tokens are bound to, and the headers every response carries.

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

    def __init__(self, app: ASGIApp, secrets_: Secrets) -> None:
        self.app = app
        self.secrets = secrets_

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        cookies = cookies_of(headers)
        early = self._gate(scope, headers, cookies)
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

    def _gate(self, scope: Scope, headers: Headers, cookies: dict[str, str]) -> Response | None:
        """A response that ends the request here (401, or the ?token= redirect), or None."""
        if self.secrets.token is None:
            return None
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if given and self.secrets.token_matches(given[-1]):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            target = str(scope["path"]) + (f"?{rest}" if rest else "")
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


def session_of(request: Request) -> str:
    return str(request.state.session)


def same_origin(request: Request) -> bool:
    """A browser names the page a POST came from; it must be this dashboard (or say nothing)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return URL(origin).netloc == host
