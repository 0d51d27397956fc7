"""Database URLs, without any driver, parsed in one place: which backend a URL or path names,
where its database is, the options its query gives, and whether libpq can read it
(``check_libpq``); what logs may show of it is ``redaction.redact_url``.

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

from collections.abc import Collection
from typing import Literal
from urllib.parse import unquote_plus

from .errors import InvalidOption
from .records import record
from .redaction import CONNINFO, misread, redact_url, scrub

SCHEMES: dict[str, Literal["sqlite", "postgres"]] = {
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
}


@record
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
        if CONNINFO.match(url_or_path):  # never quoted: it may hold password=...
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
    # libpq's query starts at the first "?" after the user information, which runs to the
    # first "@" before any "/" (a "?" in a password is no query: postgresql://u:a?b@h/db)
    at = rest.find("@", 2, _end(rest.find("/", 2), rest)) if backend == "postgres" else -1
    question = rest.find("?", at + 1)
    base, raw_query = rest[: _end(question, rest)], rest[_end(question, rest) + 1 :]
    if backend == "sqlite" and "#" in url_or_path:
        raise InvalidOption(
            f"{redact_url(url_or_path)}: a SQLite URL has no #fragment (for a file whose name "
            "holds '#', give the path itself)"
        )
    query = tuple(_pairs(raw_query))
    if backend == "postgres":
        return Address("postgres", scheme.lower() + ":" + base, query)
    if base.startswith("//"):
        host, _, path = base[2:].partition("/")
        if host:
            raise InvalidOption(
                f"{redact_url(url_or_path)}: a SQLite URL names no host; write "
                "sqlite:///absolute/path.db (three slashes) or the path itself"
            )
        base = "/" + path.lstrip("/")  # sqlite:////abs/path is /abs/path too
    if not base.strip("/") or base.endswith("/"):
        raise InvalidOption(f"{redact_url(url_or_path)}: no database file in this SQLite URL")
    return Address("sqlite", base, query)


def _end(index: int, text: str) -> int:
    """``index`` found, or the end of ``text`` (``str.find``'s -1)."""
    return len(text) if index < 0 else index


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


def check_libpq(conninfo: str) -> None:
    """Refuse a PostgreSQL URL that libpq reads otherwise than it looks (a raw ``@`` or ``/``
    in its password: ``redaction.misread``; an ``@`` left in its host) or cannot read, with one
    line that shows no secret of it (libpq's own message quotes the part it could not read: a
    password with a space, say).
    Without psycopg (the ``postgres`` extra) only the first is checked: nothing can connect."""
    if misread(conninfo):
        raise InvalidOption(
            f"{redact_url(conninfo)}: an '@' or '/' in the user name or password must be written "
            "%40 or %2F (libpq reads what follows the first '@' or '/' as the host or database)"
        )
    try:
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - an optional extra
    except ImportError:
        return
    try:
        params = conninfo_to_dict(conninfo)
    except Exception as exc:  # psycopg.ProgrammingError: libpq's parser refused it
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidOption(
            f"{redact_url(conninfo)}: libpq cannot read this URL: {scrub(said, conninfo)}"
        ) from None
    if "@" in str(params.get("host") or ""):
        raise InvalidOption(
            f"{redact_url(conninfo)}: an '@' in the user name must be written %40 (libpq reads "
            "what follows the first '@' as the host)"
        )
