"""Database URLs, without any driver, parsed in one place: which backend a URL or path names,
where its database is, the options its query gives, and what logs may show of it (``redact``).

- A path (``/var/lib/lk.db``, ``lk.db``) or ``sqlite:///absolute/path.db`` (``sqlite:path.db``:
  a relative path) opens SQLite; its query holds only our options (``synchronous``,
  ``busy_timeout``).
- ``postgresql://...`` or ``postgres://...`` is a libpq URL, passed on as written (``postgresql:///db
  ?host=/run/postgresql`` and ``[::1]`` hosts included) but for our own options in its query.
- Scheme names are case-insensitive; any other scheme, or a SQLite URL with a host
  (``sqlite://relative.db``), is refused with one line: nothing is opened or created.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, unquote_plus

from .errors import InvalidOption

SCHEMES: dict[str, Literal["sqlite", "postgres"]] = {
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
}


@dataclass(frozen=True)
class Address:
    """A store's address, parsed: the backend, where the database is (SQLite: the file's path;
    PostgreSQL: the URL before its query), and the query's ``(name, value, as written)``."""

    backend: Literal["sqlite", "postgres"]
    where: str
    query: tuple[tuple[str, str, str], ...] = ()

    def split(self, ours: Collection[str]) -> tuple[dict[str, str], str]:
        """Our options from the query, and the address with the rest of the query as it was
        written (PostgreSQL: what libpq reads)."""
        mine = {name: value for name, value, _ in self.query if name in ours}
        theirs = [raw for name, _, raw in self.query if name not in ours]
        return mine, self.where + ("?" + "&".join(theirs) if theirs else "")


def parse_url(url_or_path: str) -> Address:
    """Where ``url_or_path`` leads; InvalidOption (one line) for what names no store."""
    scheme, colon, rest = url_or_path.partition(":")
    backend = SCHEMES.get(scheme.lower()) if colon else None
    if backend is None:
        if "://" in url_or_path:
            raise InvalidOption(
                f"unsupported store URL scheme {scheme!r} (use a path, sqlite:/// or postgresql://)"
            )
        if not url_or_path:
            raise InvalidOption("no database given (a path, sqlite:///path or postgresql://...)")
        return Address("sqlite", url_or_path)
    base, _, raw_query = rest.partition("?")
    query = tuple(_pairs(raw_query))
    if backend == "postgres":
        return Address("postgres", scheme.lower() + ":" + base, query)
    if base.startswith("//"):
        host, _, path = base[2:].partition("/")
        if host:
            raise InvalidOption(
                f"{redact(url_or_path)}: a SQLite URL names no host; write "
                "sqlite:///absolute/path.db (three slashes) or the path itself"
            )
        base = "/" + path.lstrip("/")  # sqlite:////abs/path is /abs/path too
    if not base.strip("/") or base.endswith("/"):
        raise InvalidOption(f"{url_or_path}: no database file in this SQLite URL")
    return Address("sqlite", base, query)


def _pairs(raw_query: str) -> list[tuple[str, str, str]]:
    pairs = []
    for raw in raw_query.split("&"):
        if raw:
            name, _, value = raw.partition("=")
            pairs.append((unquote_plus(name), unquote_plus(value), raw))
    return pairs


def is_postgres_url(url_or_path: str) -> bool:
    try:
        return parse_url(url_or_path).backend == "postgres"
    except InvalidOption:
        return False


def sqlite_file(url_or_path: str) -> str | None:
    """The database file behind a path or SQLite URL (None: PostgreSQL, or no store at all)."""
    try:
        address = parse_url(url_or_path)
    except InvalidOption:
        return None
    return address.where if address.backend == "sqlite" else None


# Query options that carry a secret (libpq's ``password``, ``sslpassword`` for the client key,
# ``oauth_client_secret``; and any option of ours or a driver's named like one).
SECRET_WORDS = ("password", "secret", "token")
MASK = "***"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>`]*")


def redact(url: str) -> str:
    """The URL without its password: logs, pages, state files and error lines show this.

    Masks the password of the userinfo (``user:***@host``) and the value of every query option
    that holds a secret (``?password=***``, ``sslpassword``, ...). Takes a message that quotes
    URLs too (a driver's error may repeat the URL it was given): each URL in it is masked. The
    rest is kept as written (IPv6 hosts keep their brackets; nothing is re-encoded).
    """
    if "://" not in url:
        return url
    return _URL.sub(lambda m: _masked(m.group()), url)


def _masked(url: str) -> str:
    scheme, rest = url.split("://", 1)
    head, mark, tail = _split_at(rest, "?#")
    # The userinfo ends at the last "@" before the query: a password may hold a raw "@" or "/"
    # (invalid, but then it must not be shown either). "sqlite:///a@b.db" has no authority.
    at = -1 if head.startswith("/") else head.rfind("@")
    if at >= 0:
        user, colon, _ = head[:at].partition(":")
        if colon:
            head = f"{user}:{MASK}{head[at:]}"
    if mark == "?":
        query, hash_, fragment = tail.partition("#")
        tail = "&".join(_masked_option(o) for o in query.split("&")) + hash_ + fragment
    return f"{scheme}://{head}{mark}{tail}"


def _split_at(text: str, marks: str) -> tuple[str, str, str]:
    cut = min((i for i in (text.find(m) for m in marks) if i >= 0), default=len(text))
    return text[:cut], text[cut : cut + 1], text[cut + 1 :]


def _masked_option(option: str) -> str:
    key, eq, _ = option.partition("=")
    name = unquote(key).strip().lower()
    return f"{key}={MASK}" if eq and any(w in name for w in SECRET_WORDS) else option
