"""Database URLs, without any driver, parsed in one place: which backend a URL or path names,
where its database is, the options its query gives, and what logs may show of it (``redact``).

- A path (``/var/lib/lk.db``, ``lk.db``) or ``sqlite:///absolute/path.db`` (``sqlite:path.db``:
  a relative path) opens SQLite; its query holds only our options (``synchronous``,
  ``busy_timeout``).
- ``postgresql://...`` or ``postgres://...`` is a libpq URL, passed on as written (``postgresql:///db
  ?host=/run/postgresql`` and ``[::1]`` hosts included) but for our own options in its query.
- Scheme names are case-insensitive; any other scheme, a SQLite URL with a host
  (``sqlite://relative.db``) or a ``#fragment``, a PostgreSQL URL without its ``//`` (libpq
  reads ``postgresql:db`` as no URL at all), an option of ours given twice, and a libpq
  keyword/value string (``host=h password=p``: no URL, and no file name either) are refused
  with one line that never quotes a password: nothing is opened or created.
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
        written (PostgreSQL: what libpq reads). An option of ours given twice is refused: which
        one counts would be a guess."""
        mine: dict[str, str] = {}
        for name, value, _ in self.query:
            if name in ours:
                if name in mine:
                    raise InvalidOption(f"{name} is given twice in the database URL")
                mine[name] = value
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
        if _CONNINFO.match(url_or_path):  # never quoted: it may hold password=...
            raise InvalidOption(
                "--db takes a URL, not a libpq keyword/value string: write "
                "postgresql://USER@HOST:PORT/DBNAME?sslmode=... (./NAME for a file named so)"
            )
        return Address("sqlite", url_or_path)
    if backend == "postgres" and not rest.startswith("//"):
        raise InvalidOption(
            f"a PostgreSQL URL starts with {scheme.lower()}:// (e.g. {scheme.lower()}:///DBNAME"
            "?host=/run/postgresql); libpq reads no other form"
        )
    base, _, raw_query = rest.partition("?")
    if backend == "sqlite" and "#" in url_or_path:
        raise InvalidOption(
            f"{redact(url_or_path)}: a SQLite URL has no #fragment (for a file whose name holds "
            "'#', give the path itself)"
        )
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
        raise InvalidOption(f"{redact(url_or_path)}: no database file in this SQLite URL")
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
# Any scheme's URL, and ours without "//" too (``postgresql:db?password=...`` is refused, but
# its refusal and anything else that quotes it must not show the password either).
_URL = re.compile(
    r"(?:[A-Za-z][A-Za-z0-9+.\-]*://|(?<![\w.+\-])(?i:postgres(?:ql)?|sqlite):)[^\s\"'<>`]*"
)
# A libpq keyword/value connection string starts with one of these (``host=h dbname=d``).
_CONNINFO = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options)\s*=", re.I
)


def redact(url: str) -> str:
    """The URL without its password: logs, pages, state files and error lines show this.

    Masks the password of the userinfo (``user:***@host``) and the value of every query option
    that holds a secret (``?password=***``, ``sslpassword``, ...). Takes a message that quotes
    URLs too (a driver's error may repeat the URL it was given): each URL in it is masked. The
    rest is kept as written (IPv6 hosts keep their brackets; nothing is re-encoded).
    """
    if ":" not in url:
        return url
    return _URL.sub(lambda m: _masked(m.group()), url)


def _masked(url: str) -> str:
    scheme, slashes, rest = url.partition("://")
    if not slashes:  # postgresql:db?password=...
        scheme, slashes, rest = url.partition(":")
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
    return f"{scheme}{slashes}{head}{mark}{tail}"


def _split_at(text: str, marks: str) -> tuple[str, str, str]:
    cut = min((i for i in (text.find(m) for m in marks) if i >= 0), default=len(text))
    return text[:cut], text[cut : cut + 1], text[cut + 1 :]


def _masked_option(option: str) -> str:
    key, eq, _ = option.partition("=")
    name = unquote(key).strip().lower()
    return f"{key}={MASK}" if eq and any(w in name for w in SECRET_WORDS) else option
