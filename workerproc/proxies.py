"""The proxy a webhook POST goes through (docs/how-to/webhooks.md): the standard variables
``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` (lower-case forms too, which
win), as ``urllib.request.getproxies()`` reads them on Linux (``getproxies_environment``: the
variables only, on every system, never macOS's or Windows' own settings), with ``NO_PROXY``
applied as ``urllib.request.proxy_bypass`` applies it there (``proxy_bypass_environment``: a
host equal to an entry or under it, ``*`` as the whole value for every host; no name is looked
up to decide) to the receiver's ``host:port``: an entry without a port matches every port,
one with a port (``hooks.internal:8080``, ``[::1]:8080``) that port only. The port is the one
the POST goes to, its scheme's default when the URL names none (``https://h/`` is ``h:443``, as
Go's ``net/http`` counts it; urllib counts only a port written in the URL, curl never compares
ports). A sender thread's ``Poster`` reads them once, when it is made (``Proxies``).

Only a plain ``http://`` proxy is spoken to (``user:password@`` in its URL sent as
``Proxy-Authorization: Basic``): an ``https://`` receiver through an HTTP ``CONNECT`` tunnel, an
``http://`` one by its absolute URI. A proxy reached over TLS itself (``https://``) or a SOCKS
one is refused with one clear reason, the POST's failure.
"""

from __future__ import annotations

import base64
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit
from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]  # (untyped)


class ProxyUnsupported(ValueError):
    """The proxy named for a receiver is not one a POST can go through (the reason)."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """A plain HTTP proxy: where it listens, and the ``Proxy-Authorization`` it wants."""

    host: str
    port: int
    authorization: str | None = None

    @property
    def name(self) -> str:
        """``host:port`` (never the credentials: it goes into failures' reasons)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def headers(self) -> dict[str, str]:
        return {} if self.authorization is None else {"Proxy-Authorization": self.authorization}


class Proxies:
    """The proxy variables as read once (when made), and each receiver's proxy."""

    def __init__(self) -> None:
        self._found = urllib.request.getproxies_environment()
        # NO_PROXY's entries without brackets that hold a colon: an IPv6 address (``::1``) is one
        # of them, the address itself on every port
        self._bare = frozenset(
            name for entry in self._found.get("no", "").split(",")
            if ":" in (name := entry.strip().lstrip(".").lower()) and not name.startswith("[")
        )  # fmt: skip
        self._chosen: dict[tuple[str, str, int], Proxy | ProxyUnsupported | None] = {}

    def proxy_for(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy a POST to ``scheme://host:port`` goes through (``host`` as ``urlsplit``'s
        ``hostname``: an IPv6 literal without brackets; ``port`` the one connected to, the
        scheme's default included), None to go straight to it; ``ProxyUnsupported`` when the
        one named cannot be used."""
        key = (scheme, host, port)
        chosen = self._chosen.get(key, False)
        if chosen is False:
            chosen = self._chosen[key] = self._choose(scheme, host, port)
        if isinstance(chosen, ProxyUnsupported):  # (a new one: a kept one would keep each
            raise ProxyUnsupported(str(chosen))  # raise's frames in its traceback)
        return chosen  # type: ignore[return-value]  # (False is never kept)

    def _choose(self, scheme: str, host: str, port: int) -> Proxy | ProxyUnsupported | None:
        variable = scheme if scheme in self._found else "all"
        value = self._found.get(variable)
        if not value or self._bypassed(host, port):
            return None
        try:
            return parse(value)
        except ProxyUnsupported as exc:
            return ProxyUnsupported(f"{variable.upper()}_PROXY: {exc}")

    def _bypassed(self, host: str, port: int) -> bool:
        """Whether ``NO_PROXY`` lists ``host`` on ``port``. CPython's function matches each
        entry against the host with the port cut off and against ``host:port`` as given, so
        it is given ``host:port`` (``[v6]:port`` for an IPv6 literal, the form an entry with a
        port takes). An IPv6 literal is also matched against the bare entries, whole: given
        bare to that function, its last group would be cut off as a port (an entry ``fd00::1``
        matched the address ``fd00::1:8080``), and a bare entry matches it on every port."""
        if ":" not in host:
            return bool(proxy_bypass_environment(f"{host}:{port}", self._found))
        return host in self._bare or bool(proxy_bypass_environment(f"[{host}]:{port}", self._found))


def parse(value: str) -> Proxy:
    """A proxy variable's value (``http://user:pass@host:port``; no scheme: ``http://``; no
    port: 80) as a ``Proxy``; ``ProxyUnsupported`` for any other scheme, or no host."""
    try:
        parts = urlsplit(value if "://" in value else f"http://{value}")
        host, port = parts.hostname, parts.port or 80
    except ValueError:  # (its text is not told: it may hold the password)
        raise ProxyUnsupported("not a proxy URL") from None
    if "@" in value and "@" not in parts.netloc:  # a '/', '?' or '#' unescaped before the host
        raise ProxyUnsupported("not a proxy URL (escape '/', '?' and '#' in its user and password)")
    if not host:
        raise ProxyUnsupported("a proxy URL with no host")
    if parts.scheme != "http":
        raise ProxyUnsupported(
            f"a {parts.scheme}:// proxy is not supported: only a plain "
            "http:// one (TLS to the proxy itself, SOCKS: not implemented)"
        )
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return Proxy(host, port, authorization)
