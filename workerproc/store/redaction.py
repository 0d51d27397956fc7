"""What we print of a connection string or a URL: one redaction for every address and every
message that quotes one. Logs, pages, state files, the CLI's lines and JSON,
and error messages show an address known to be one (a ``--db``, a webhook's URL) as
``redact_url`` does, and any other text as ``redact`` does; nothing else prints an address.

An address is read the way each reader of it would, and what any of them takes for a secret is
masked (``***``):

- **libpq** (``postgresql://``): the user information runs to the first ``@`` before any
  ``/``, so ``postgresql://u:Hunter2?x@h/db`` is the password ``Hunter2?x`` (a ``?``, ``#``
  or ``"`` in it is no delimiter), and the query runs to the end (``#`` included). When
  psycopg is installed, its reading (``conninfo_to_dict``: libpq's own parser) checks ours.
- **URLs** (RFC 3986, ``urllib.parse``): the authority ends at the first ``/``, ``?`` or
  ``#``, its user information at the last ``@`` in it.
- a password that neither reads (a raw ``/`` or ``@`` in it) is still someone's password:
  the user information is taken to run to the last ``@`` before the query.
- **keyword/value strings** (``host=h password='a b'``), read as libpq reads them (quotes,
  backslash escapes).

A URL's password, and in its query (its fragment too) the value of every option named like a
secret (``password``, ``sslpassword``, ``token``, ``api_key``, ``sig``, ...), are masked; a URL
of any scheme but ours (a webhook's) has every query value masked: a provider's token may hang
on any name. What is masked is the text as written (a percent-encoded password included), so
no form of it is left; the rest is kept as written. When the masked address still reads as
holding a secret to either parser, all of it after the scheme is masked instead.

``scrub(message, address)`` masks a driver's message about ``address``: libpq quotes the part
it could not read (``unexpected spaces found in "a b"``), which is every secret of the address
as written or decoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote, unquote_plus, urlsplit

MASK = "***"
DB_SCHEMES = ("postgresql", "postgres", "sqlite")
# libpq's keywords that hold a secret (a keyword/value string's, or a URL query's)
LIBPQ_SECRETS = ("password", "sslpassword", "oauth_client_secret")
# a query option (of any URL) named with one of these holds a secret
SECRET_WORDS = ("password", "passwd", "pwd", "secret", "token", "key", "sig", "auth", "credential")

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
# a URL in free text: any scheme's with "//", and ours without it (``postgresql:db?password=``
# is refused, but its refusal and anything else that quotes it must not show the password). It
# ends at a space, but for a password's: ``user:a b@host`` (up to an "@" on the same line). A
# scheme starts a word (tried at every letter of a long word, the search took quadratic time)
_URL = re.compile(
    r"(?:(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://(?:[^\s/@:]*:[^\n/@]*@)?"
    r"|(?<![\w.+\-])(?i:postgres(?:ql)?|sqlite):)\S*"
)
_CLOSERS = {'"': '"', "'": "'", "(": ")", "<": ">", "[": "]", "`": "`"}
# a libpq keyword/value string starts with one of these (``host=h dbname=d``)
CONNINFO = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options)\s*=", re.I
)
# a secret keyword's value in free text (a keyword/value string quoted in a message)
_KEYWORD_SECRET = re.compile(
    r"(?<![\w.])((?:ssl)?password|oauth_client_secret)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.I
)
# one pass: a URL is masked as a whole, so a keyword in its query is never masked twice
_SECRET_IN_TEXT = re.compile(f"(?P<url>{_URL.pattern})|{_KEYWORD_SECRET.pattern}", re.I)
Span = tuple[int, int]


def redact(text: str) -> str:
    """Free text (a message, a log line) without a secret: every URL in it (it ends at a space
    or where the quote before it closes, but for a space in its password) and every secret
    keyword's value masked; a whole keyword/value string as ``redact_url`` shows it. An
    address known to be one (a ``--db``, a webhook's URL) is shown with ``redact_url``."""
    if not text or (":" not in text and "=" not in text):
        return text
    if CONNINFO.match(text):
        return redact_url(text)
    return _SECRET_IN_TEXT.sub(lambda m: _in_text(m, text), text)


def redact_url(address: str) -> str:
    """One address as we print it: a path as it is; a URL or keyword/value string with its
    secrets masked (see the module's docstring)."""
    if CONNINFO.match(address):
        shown = _masked(address, _keyword_spans(address))
        return shown if _clean(shown, url=False) else _keywords_only(address)
    scheme = _SCHEME.match(address)
    if scheme is None:
        return address
    db = scheme[1].lower() in DB_SCHEMES
    shown = _masked(address, _url_spans(address, scheme.end(), db))
    return shown if _clean(shown, url=True) else f"{address[: scheme.end()]}//{MASK}"


def scrub(message: str, address: str) -> str:
    """A driver's ``message`` about ``address``, without any secret of the address: each one,
    as written and decoded, is masked wherever the message quotes it (a short one only
    quoted: "p" is in many words), then ``redact`` masks the URLs in it."""
    for secret in sorted(secrets_of(address), key=len, reverse=True):
        if len(secret) >= 3:
            message = message.replace(secret, MASK)
        else:
            for quote in "\"'":
                message = message.replace(f"{quote}{secret}{quote}", f"{quote}{MASK}{quote}")
    return redact(message)


def secrets_of(address: str) -> set[str]:
    """Every secret ``address`` holds, as written and decoded, by every reading of it."""
    if CONNINFO.match(address):
        spans = _keyword_spans(address)
    else:
        scheme = _SCHEME.match(address)
        if scheme is None:
            return set()
        spans = _url_spans(address, scheme.end(), scheme[1].lower() in DB_SCHEMES)
    found: set[str] = set()
    for start, end in spans:
        raw = address[start:end]
        found |= {raw, unquote(raw), unquote_plus(raw), raw.strip("'")}
    found |= {v for k, v in _libpq_reading(address).items() if k in LIBPQ_SECRETS}
    return {s for s in found if s and s != MASK}


# -- reading an address ---------------------------------------------------------------------
def _url_spans(url: str, after_scheme: int, db: bool) -> list[Span]:
    """Where the secrets of ``url`` are, by every reading of it."""
    spans: list[Span] = []
    if not url.startswith("//", after_scheme):  # no authority: only a query
        query = url.find("?", after_scheme)
        return list(_option_spans(url, query, len(url), db)) if query >= 0 else []
    start = after_scheme + 2
    _, at = _userinfo_ends(url, start)
    authority_end = min(_find(url, c, start) for c in "/?#")
    if at >= 0:
        colon = url.find(":", start, at)
        if colon >= 0:
            spans.append((colon + 1, at))
    # the query: libpq's starts at the first "?" after the user information and runs to the
    # end; the URL's starts at the first "?" after the authority and ends at a "#"
    host_start = max(at + 1, start)
    libpq_query = url.find("?", host_start)
    if libpq_query >= 0:
        spans += _option_spans(url, libpq_query, len(url), db)
    url_query = url.find("?", authority_end) if authority_end < len(url) else -1
    fragment = _find(url, "#", authority_end)
    if 0 <= url_query < fragment:
        spans += _option_spans(url, url_query, fragment, db)
    if fragment < len(url):
        spans += _option_spans(url, fragment, len(url), db)
    return spans


def _userinfo_ends(url: str, start: int) -> tuple[int, int]:
    """Where the user information after ``start`` (past ``//``) ends: libpq's (the first "@"
    before any "/") and the furthest any reading takes it to (also the URL's: the last "@" in
    the authority; and the last "@" before the query: a raw "/" in a password). -1: none."""
    libpq_at = url.find("@", start, _find(url, "/", start))
    url_at = url.rfind("@", start, min(_find(url, c, start) for c in "/?#"))
    last_at = url.rfind("@", start, min(_find(url, c, start) for c in "?#"))
    return libpq_at, max(libpq_at, url_at, last_at)


def misread(url: str) -> bool:
    """Whether libpq would read ``url``'s password otherwise than it is written: a raw "@" or
    "/" in it (``postgresql://u:a/b@h/db`` is the host ``u``, the port ``a`` and the database
    ``b@h/db`` to libpq, and its errors would quote them)."""
    scheme = _SCHEME.match(url)
    if scheme is None or not url.startswith("//", scheme.end()):
        return False
    start = scheme.end() + 2
    libpq_at, at = _userinfo_ends(url, start)
    return at != libpq_at and url.find(":", start, at) >= 0


def _option_spans(url: str, mark: int, end: int, db: bool) -> Iterator[Span]:
    """The secret values of the ``name=value&...`` options between ``mark`` (the ``?`` or
    ``#``) and ``end``: those named like a secret, or, outside our schemes, every one."""
    pos = mark + 1
    while pos <= end:
        amp = _find(url, "&", pos, end)
        eq = url.find("=", pos, amp)
        if eq >= 0:
            name = unquote_plus(url[pos:eq]).strip().lower()
            if not db or any(word in name for word in SECRET_WORDS):
                yield eq + 1, amp
        pos = amp + 1


def _keyword_spans(text: str) -> list[Span]:
    """The secret values of a keyword/value string, read as libpq reads it: ``key = value``
    pairs apart by spaces, a value quoted with ``'`` (``\\`` escapes) or running to a space.
    What cannot be read (a keyword without ``=``) is masked to the end: its value may be
    anywhere."""
    spans: list[Span] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            return spans
        key_start = pos
        while pos < n and text[pos] != "=" and not text[pos].isspace():
            pos += 1
        key = text[key_start:pos].lower()
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n or text[pos] != "=":
            return [*spans, (key_start, n)]
        pos += 1
        while pos < n and text[pos].isspace():
            pos += 1
        value_start = pos
        quoted = pos < n and text[pos] == "'"
        pos += quoted
        while pos < n and (text[pos] != "'" if quoted else not text[pos].isspace()):
            pos += 2 if text[pos] == "\\" else 1
        pos = min(n, pos + quoted)
        if key in LIBPQ_SECRETS or any(word in key for word in SECRET_WORDS):
            spans.append((value_start, pos))


def _find(text: str, char: str, start: int, end: int | None = None) -> int:
    """The index of ``char`` in ``text[start:end]``, or ``end`` (the text's end) when none."""
    stop = len(text) if end is None else end
    found = text.find(char, start, stop)
    return stop if found < 0 else found


def _masked(text: str, spans: list[Span]) -> str:
    """``text`` with every span (merged where they overlap) written as ``MASK``."""
    out, pos = [], 0
    for start, end in sorted(spans):
        if end <= pos:
            continue
        if start >= pos:  # else it overlaps the last one: that one's mask grows to its end
            out += [text[pos:start], MASK]
        pos = end
    return "".join([*out, text[pos:]])


def _keywords_only(text: str) -> str:
    """The keywords of a keyword/value string whose values could not be told apart."""
    return " ".join(f"{m[1]}={MASK}" for m in re.finditer(r"(\w+)\s*=", text)) or MASK


def _in_text(match: re.Match[str], text: str) -> str:
    """A URL or a secret keyword found in free text, masked: a URL ends at a space, or where
    the quote or bracket before it closes (in ours the last one: libpq takes a quote in a
    password; in any other URL the first: a quote in it would be written %22)."""
    if match["url"] is None:
        return match[2] + match[3] + MASK
    url = match[0]
    start = match.start()
    closer = _CLOSERS.get(text[start - 1]) if start > 0 else None
    ours = url.partition(":")[0].lower() in DB_SCHEMES
    cut = (url.rfind(closer) if ours else url.find(closer)) if closer else -1
    if cut > 0:
        return redact_url(url[:cut]) + url[cut:]
    return redact_url(url)


# -- checking the result against the readers ---------------------------------------------------
def _clean(shown: str, *, url: bool) -> bool:
    """Whether neither reader finds a secret left in ``shown``."""
    libpq = _libpq_reading(shown)
    if any(v != MASK for k, v in libpq.items() if k in LIBPQ_SECRETS):
        return False
    if not url:
        return True
    try:
        parts = urlsplit(shown)
    except ValueError:
        return True  # no URL reader takes it (an IPv6 host not closed, say): libpq's answered
    if parts.password not in (None, MASK):
        return False
    db = parts.scheme.lower() in DB_SCHEMES
    for text in (parts.query, parts.fragment):
        for option in text.split("&"):
            name, eq, value = option.partition("=")
            named = unquote_plus(name).strip().lower()
            secret = not db or any(word in named for word in SECRET_WORDS)
            if eq and secret and value not in ("", MASK):
                return False
    return True


def _libpq_reading(address: str) -> dict[str, str]:
    """libpq's reading of ``address`` (psycopg's ``conninfo_to_dict``), when psycopg is
    installed (the ``postgres`` extra) and the address is libpq's: {} otherwise, or when
    libpq cannot read it."""
    if not (CONNINFO.match(address) or address.startswith(("postgresql://", "postgres://"))):
        return {}
    try:
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - an optional extra
    except ImportError:
        return {}
    try:
        return {k: str(v) for k, v in conninfo_to_dict(address).items()}
    except Exception:  # libpq cannot read it: then it connects nowhere with it either
        return {}
