"""What ``supervisor web`` was asked to do: each option declared once (``workerproc.options``:
the CLI, its environment variable, the checks and the README table come from here), checked by
``validate()``."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import stat
from dataclasses import dataclass

from workerproc import options
from workerproc.options import opt

from ..errors import ConfigError

PORT_RANGE = (0, 65535)  # 0: any free port (printed)
REFRESH_RANGE = (0.2, 3600.0)  # seconds between two polls of a page's live part
# open event streams (GET /events/stream), all clients together; 0: none, pages poll. Each
# stream holds a connection for as long as it is open, so the bound stays well under the
# connection guard's (connections.MAX_CONNECTIONS): requests always find room beside them.
STREAMS_RANGE = (0, 128)
TOKEN_LENGTH = (16, 1024)
TOKEN_FILE_MAX = 4096  # bytes: a token file holds one token
# The names a browser on this machine uses for it. Any other ``Host`` is refused (DNS rebinding:
# a page of evil.example whose name now resolves to 127.0.0.1 must not be served our pages).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_HOST_NAME = re.compile(
    r"\.?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
)


@dataclass(frozen=True)
class WebConfig:
    db: str = opt(flag="--db", metavar="PATH|URL", envvar="SUPERVISOR_DB",
                  help="the database (never created: it must exist)")  # fmt: skip
    host: str = opt(
        "127.0.0.1",
        flag="--host",
        metavar="ADDR",
        envvar="SUPERVISOR_WEB_HOST",
        help="address to listen on",
        meaning="address to listen on (a warning when it is not loopback and no token is set)",
    )
    port: int = opt(
        8000,
        flag="--port",
        metavar="P",
        low=PORT_RANGE[0],
        high=PORT_RANGE[1],
        envvar="SUPERVISOR_WEB_PORT",
        help="port to listen on (0: any free port, printed)",
        meaning="port to listen on (0: any free port, printed; a taken port: one line, exit 1)",
    )
    pidfile: str | None = opt(
        None, flag="--pidfile", metavar="FILE", help="show this supervisor's workers (FILE.state)"
    )
    chaos_report: str | None = opt(
        None,
        flag="--chaos-report",
        metavar="FILE",
        help="draw this chaos report (what start --chaos --chaos-report FILE writes at exit)",
    )
    read_only: bool = opt(
        False,
        flag="--read-only",
        envvar="SUPERVISOR_WEB_READ_ONLY",
        help="no retry or cancel: the action routes are not served, the forms not drawn",
    )
    token: str | None = opt(
        None,
        flag="--token",
        metavar="T",
        envvar="SUPERVISOR_WEB_TOKEN",
        secret=True,
        help=f"every request must carry this token ({TOKEN_LENGTH[0]}+ printable characters, "
        "no spaces); other users see it in ps: prefer the variable or --token-file",
    )
    token_file: str | None = opt(
        None,
        flag="--token-file",
        metavar="FILE",
        envvar="SUPERVISOR_WEB_TOKEN_FILE",
        help="read the token from FILE (its first line)",
    )
    allowed_hosts: tuple[str, ...] = opt(
        (),
        flag="--allowed-host",
        metavar="NAME",
        envvar="SUPERVISOR_WEB_ALLOWED_HOSTS",
        multiple=True,
        shown_default="loopback names",
        help="also answer requests for this Host (a proxy's name; .example.com: it and its "
        "subdomains); repeatable",
        meaning="also answer requests whose `Host` is NAME (the name a proxy forwards; "
        "`.example.com`: it and its subdomains); repeatable. Always answered: `localhost`, "
        "`127.0.0.1`, `[::1]` and the `--host` address itself; any other `Host` gets 400",
    )
    refresh: float = opt(
        2.0,
        flag="--refresh",
        metavar="S",
        low=REFRESH_RANGE[0],
        high=REFRESH_RANGE[1],
        envvar="SUPERVISOR_WEB_REFRESH",
        help="seconds between two polls of a page (when it has no event stream)",
        meaning="seconds between two polls of a page's live part, when it polls: without "
        "an event stream (none open, or `--max-streams 0`) or after its stream failed",
    )
    max_streams: int = opt(
        32,
        flag="--max-streams",
        metavar="N",
        low=STREAMS_RANGE[0],
        high=STREAMS_RANGE[1],
        envvar="SUPERVISOR_WEB_MAX_STREAMS",
        help="event streams open at once, all clients together (beyond: 503, the page "
        "polls); 0: no stream, every page polls",
    )

    def validate(self) -> WebConfig:
        """Raise ConfigError naming the first option that cannot work; return self."""
        try:
            options.validate(self)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.db.strip():
            raise ConfigError("--db must name a database file or URL")
        if not self.host.strip():
            raise ConfigError("--host must name an address")
        if self.token is not None and self.token_file is not None:
            raise ConfigError("give the token once: --token or --token-file, not both")
        if self.token is not None and (problem := token_problem(self.token)):
            raise ConfigError(f"--token {problem}")
        for name in self.allowed_hosts:
            if host_pattern(name) is None:
                raise ConfigError(
                    f"--allowed-host takes a host name or address without port or scheme, "
                    f"e.g. dash.example.com, .example.com or 10.0.0.5 (got {name[:80]!r})"
                )
        return self

    def with_token_file(self) -> WebConfig:
        """This config with the token read from ``--token-file`` (if given), checked."""
        if self.token_file is None:
            return self
        token = read_token_file(self.token_file)
        return dataclasses.replace(self, token=token, token_file=None)

    def hosts(self) -> tuple[str, ...]:
        """Every ``Host`` name the dashboard answers (lower case, without port)."""
        names = [*LOOPBACK_NAMES, *(host_pattern(n) or "" for n in self.allowed_hosts)]
        listen = host_pattern(self.host)
        if listen is not None and not _wildcard(self.host):
            names.append(listen)  # a client that types the address it listens on
        return tuple(dict.fromkeys(n for n in names if n))


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot guard the dashboard, or None."""
    low, high = TOKEN_LENGTH
    if not low <= len(token) <= high or not all(33 <= ord(c) <= 126 for c in token):
        return (
            f"must be {low} to {high} printable ASCII characters without spaces (make one: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"
        )
    return None


def read_token_file(path: str) -> str:
    """The first line of ``path`` (at most TOKEN_FILE_MAX bytes), checked as a token."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang the start
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"--token-file {path} is not a regular file")
        data = fh.read(TOKEN_FILE_MAX + 1)
    if len(data) > TOKEN_FILE_MAX:
        raise ConfigError(f"--token-file {path} is larger than {TOKEN_FILE_MAX} bytes")
    try:
        token = data.decode("utf-8").split("\n", 1)[0].removesuffix("\r")
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {path} is not text") from None
    if problem := token_problem(token):
        raise ConfigError(f"--token-file {path}: the token {problem}")
    return token


def host_pattern(name: str) -> str | None:
    """``name`` as an allowed ``Host`` (lower case; an IPv6 address in brackets), or None if
    it is neither a host name, a ``.domain`` pattern nor an IP address."""
    text = name.strip().lower()
    try:
        address = ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
    except ValueError:
        return text if _HOST_NAME.fullmatch(text) and len(text) <= 253 else None
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def _wildcard(host: str) -> bool:
    return host.strip() in ("0.0.0.0", "::", "[::]", "")  # noqa: S104 - only compared
