"""Database URLs, without any driver: which backend a URL names, and what logs may show of it."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(url_or_path: str) -> bool:
    return "://" in url_or_path and urlsplit(url_or_path).scheme in POSTGRES_SCHEMES


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
