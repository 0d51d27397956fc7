"""Database URLs, without any driver: which backend a URL names, and what logs may show of it."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(url_or_path: str) -> bool:
    return "://" in url_or_path and urlsplit(url_or_path).scheme in POSTGRES_SCHEMES


def redact(url: str) -> str:
    """The URL without its password (logs, state files and error messages show this)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname or ''}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urlunsplit(parts._replace(netloc=netloc))


def split_query(url: str, ours: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """The URL without the query options named in ``ours``, and those options."""
    parts = urlsplit(url)
    mine, theirs = {}, []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in ours:
            mine[key] = value
        else:
            theirs.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(theirs))), mine
