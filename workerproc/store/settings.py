"""What each backend takes, declared once: its options, their defaults and ranges, and whether a
URL may set them. ``resolve`` reads an address and its options (a keyword argument, or the URL's
query; the keyword wins) into a ``Target``; anything else is refused with one line naming what
the backend takes, before anything is opened or created."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from .errors import InvalidOption
from .records import record
from .urls import check_libpq, parse_url

Options = TypeVar("Options")
Check = Callable[[str, object], Any]  # (option name, value given) -> the value, or InvalidOption

DEFAULT_BUSY_TIMEOUT = 5.0  # both backends: how long a write may wait for its lock
DEFAULT_SCHEMA = "leasekeeper"
# A frozen process (SIGSTOP, a debugger, a frozen VM) inside one of our transactions must not
# hold a run's row lock for long: the server ends such a session (and rolls its transaction
# back). Our transactions never wait on user code, so the bound can be tight: a worker asks for
# a quarter of its lease ttl (``idle_in_transaction``; runner.run_worker), so a run locked by a
# stopped exchange is free again long before its lease could be taken over.
IDLE_IN_TRANSACTION = 5.0
# A network that stops carrying packets (a partition, a dead switch) does not close a connection:
# without a bound a call waits for the kernel's retransmissions to give up, a quarter of an hour,
# and even after the network heals it waits out their backoff. Every connection asks the kernel
# to end it once data it sent stays unacknowledged, or the server stays silent to keepalives,
# for ``network_timeout`` seconds (TCP_USER_TIMEOUT and keepalives); a worker asks for a quarter
# of its lease ttl (at least a second), so a hung renewal fails, and is retried on a new
# connection, well inside its lease.
NETWORK_TIMEOUT = 10.0
# at most 40 characters: the notification channels ("leasekeeper.<schema>.end") must stay
# within PostgreSQL's 63-byte identifiers
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
HOST = re.compile(r"[A-Za-z0-9._:%-]{1,253}")
# How the PostgreSQL store reaches its server (docs/how-to/postgresql.md, "Through PgBouncer"):
# ``pooler=transaction`` when a pooler in transaction mode (PgBouncer's pool_mode=transaction)
# sits between: then nothing is kept in a session (no startup options, no prepared statement,
# each transaction sets its own bounds with SET LOCAL) and wake-ups come from ``listen``:
# ``direct`` (LISTEN on a connection straight to the server: ``listen_host``/``listen_port``)
# or ``poll`` (the server's snapshot, read every ``POLL`` seconds).
POOLERS = ("none", "transaction")
LISTENS = ("direct", "poll")


def seconds(low: float, high: float, *, above: bool = False) -> Check:
    """A number of seconds from ``low`` (or above it) to ``high``, given as a number or text."""

    def check(name: str, value: object) -> float:
        try:
            got = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InvalidOption(f"{name} must be a number of seconds (got {value!r})") from None
        if not math.isfinite(got) or got < low or got > high or (above and got == low):
            bound = f"above {low:g}" if above else f"from {low:g}"
            raise InvalidOption(
                f"{name} must be {bound} and at most {high:g} seconds (got {value!r})"
            )
        return got

    return check


def choice(*allowed: str) -> Check:
    """One of ``allowed``, in any case (kept in upper case)."""

    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value.upper() not in allowed:
            raise InvalidOption(f"{name} must be one of {', '.join(allowed)} (got {value!r})")
        return value.upper()

    return check


def matching(pattern: re.Pattern[str]) -> Check:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise InvalidOption(f"{name} must match {pattern.pattern} (got {value!r})")
        return value

    return check


def one_of(*allowed: str) -> Check:
    """One of ``allowed``, as written (lower case)."""

    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise InvalidOption(f"{name} must be one of {', '.join(allowed)} (got {value!r})")
        return value

    return check


def port(name: str, value: object) -> int:
    """A TCP port, given as a number or text."""
    try:
        got = int(str(value), 10)
    except ValueError:
        raise InvalidOption(f"{name} must be a port from 1 to 65535 (got {value!r})") from None
    if not 1 <= got <= 65535:
        raise InvalidOption(f"{name} must be a port from 1 to 65535 (got {value!r})")
    return got


def host(name: str, value: object) -> str:
    """A host name or address (no spaces, quotes or URL punctuation), at most 253 characters."""
    if not isinstance(value, str) or not HOST.fullmatch(value):
        raise InvalidOption(f"{name} must be a host name or address (got {value!r})")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOption(f"{name} must be True or False (got {value!r})")
    return value


def option(default: object, check: Check, *, in_url: bool = True) -> Any:
    """A declared option: its default, its check, and whether a URL's query may set it."""
    return field(default=default, metadata={"check": check, "in_url": in_url})


@record
class SQLiteOptions:
    """What an SQLite store takes. ``synchronous``: FULL (every commit is durable) or NORMAL
    (a power loss may undo the last commits, never corrupt)."""

    synchronous: str = option("FULL", choice("FULL", "NORMAL"))
    busy_timeout: float = option(DEFAULT_BUSY_TIMEOUT, seconds(0, 3600, above=True))


@record
class PostgresOptions:
    """What a PostgreSQL store takes (every other query parameter of its URL is libpq's).
    ``migrate``: False for a reader that must not create the schema."""

    schema: str = option(DEFAULT_SCHEMA, matching(SCHEMA_NAME))
    busy_timeout: float = option(DEFAULT_BUSY_TIMEOUT, seconds(0, 3600, above=True))
    idle_in_transaction: float = option(IDLE_IN_TRANSACTION, seconds(0.01, 3600))
    pooler: str = option("none", one_of(*POOLERS))
    listen: str | None = option(None, one_of(*LISTENS))  # None: direct, or poll behind a pooler
    listen_host: str | None = option(None, host)
    listen_port: int | None = option(None, port)
    network_timeout: float = option(NETWORK_TIMEOUT, seconds(1, 3600))
    migrate: bool = option(True, flag, in_url=False)


class StoreOptions(TypedDict, total=False):
    """Every option ``open_store`` may be given, for type checkers (each backend takes its own
    part: ``SQLiteOptions``, ``PostgresOptions``)."""

    synchronous: str
    busy_timeout: float
    schema: str
    idle_in_transaction: float
    pooler: str
    listen: str
    listen_host: str
    listen_port: int
    network_timeout: float
    migrate: bool


def in_url(kind: type[object]) -> frozenset[str]:
    """The options of ``kind`` a URL's query may set."""
    return frozenset(f.name for f in dataclasses.fields(kind) if f.metadata["in_url"])  # type: ignore[arg-type]


def declared(
    kind: type[Options], backend: str, from_url: Mapping[str, str], given: Mapping[str, object]
) -> Options:
    """``kind``'s options from the URL's query, then the keyword arguments (which win)."""
    fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for source, items in (("in its URL", from_url), ("", given)):
        for name, value in items.items():
            known = fields.get(name)
            if known is None or (source and not known.metadata["in_url"]):
                takes = sorted(fields) if not source else sorted(in_url(kind))
                where = f" {source}" if source else ""
                raise InvalidOption(
                    f"{backend} takes no option {name!r}{where} (it takes {', '.join(takes)})"
                )
            values[name] = known.metadata["check"](name, value)
    return kind(**values)


@record
class Target:
    """What an address and its options mean: the backend, where (SQLite: the file's path;
    PostgreSQL: the libpq URL without our options), and the backend's checked options."""

    backend: Literal["sqlite", "postgres"]
    where: str
    options: SQLiteOptions | PostgresOptions


def resolve(url_or_path: str, **options: Unpack[StoreOptions]) -> Target:
    """Read ``url_or_path`` and ``options`` (InvalidOption: one line, nothing touched)."""
    address = parse_url(url_or_path)
    if address.backend == "sqlite":  # its query holds only our options
        ours, where = address.split({name for name, _, _ in address.query})
        return Target("sqlite", where, declared(SQLiteOptions, "SQLite", ours, options))
    ours, conninfo = address.split(in_url(PostgresOptions))
    check_libpq(conninfo)
    return Target("postgres", conninfo, declared(PostgresOptions, "PostgreSQL", ours, options))
