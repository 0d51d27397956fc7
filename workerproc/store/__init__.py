"""The lease store: the only code that speaks SQL (``protocol/`` over a backend's dialect,
``sqlite/`` or ``postgres/``). ``open_store`` picks the backend by URL; callers depend on the
role they use (``roles``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Unpack

from .errors import (
    InvalidCommit,
    InvalidOption,
    InvalidPayload,
    RunNotFound,
    RunOver,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from .redaction import redact, redact_url
from .roles import Inspector, Operator, Producer, WorkerStore
from .settings import DEFAULT_BUSY_TIMEOUT, SQLiteOptions, StoreOptions, resolve
from .types import (
    AttemptEnd,
    BatchOutcome,
    CasResult,
    ClaimRequest,
    Clock,
    Commit,
    CommitOutcome,
    Event,
    FinishedBucket,
    Lease,
    OwnerLease,
    QueueCounts,
    Rejection,
    Renewal,
    Run,
    RunFailure,
    Signal,
    Stats,
    TaskInfo,
    TaskOptions,
    WorkerInfo,
)
from .urls import is_postgres_url, sqlite_file

if TYPE_CHECKING:
    from .aio import AsyncStore, open_async_store
    from .dialect import CHANGE_CHECK, Dialect
    from .protocol import Store
    from .sqlite.watch import FileWatch

# The store itself, its SQLite backend and the async store are imported at their first use:
# what only needs the store's types, errors or codec (the CLI's parsing, a handler's module)
# does not load every statement of both backends.
_WHERE = {"AsyncStore": "aio", "open_async_store": "aio", "CHANGE_CHECK": "dialect",
          "Dialect": "dialect", "Store": "protocol"}  # fmt: skip


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # looked up once
    return value


__all__ = [
    "CHANGE_CHECK",
    "DEFAULT_BUSY_TIMEOUT",
    "AsyncStore",
    "AttemptEnd",
    "BatchOutcome",
    "CasResult",
    "ClaimRequest",
    "Clock",
    "Commit",
    "CommitOutcome",
    "Event",
    "FinishedBucket",
    "Inspector",
    "InvalidCommit",
    "InvalidOption",
    "InvalidPayload",
    "Lease",
    "Operator",
    "OwnerLease",
    "Producer",
    "QueueCounts",
    "Rejection",
    "Renewal",
    "Run",
    "RunFailure",
    "RunNotFound",
    "RunOver",
    "SchemaTooNew",
    "Signal",
    "Stats",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "StoreReadOnly",
    "StoreUnavailable",
    "TaskInfo",
    "TaskOptions",
    "WorkerInfo",
    "WorkerStore",
    "is_postgres_url",
    "open_async_store",
    "open_store",
    "redact",
    "redact_url",
    "resolve",
    "sqlite_file",
    "watch_file",
]


def open_store(
    url_or_path: str, *, clock: Clock | None = None, **options: Unpack[StoreOptions]
) -> Store:
    """Open a store: a file path or ``sqlite:///path[?synchronous=normal&busy_timeout=S]`` opens
    SQLite; ``postgresql://user@host/db[?schema=NAME&busy_timeout=S&...]`` opens PostgreSQL
    (the ``postgres`` extra installs its driver; every other query parameter is libpq's).

    ``options`` are the backend's declared ones (``settings.SQLiteOptions``,
    ``settings.PostgresOptions``); a keyword argument wins over the URL's query. Anything
    else is refused with one line (``InvalidOption``), before any file is created. ``clock``
    (seconds, float) replaces the wall clock (the database clock on PostgreSQL): tests inject
    one to move time.
    """
    from .protocol import Store  # noqa: PLC0415 - imported at first use (above)
    from .sqlite.dialect import SQLiteDialect  # noqa: PLC0415

    target = resolve(url_or_path, **options)
    dialect: Dialect
    if isinstance(target.options, SQLiteOptions):
        dialect = SQLiteDialect(target.where, target.options, clock=clock)
    else:
        try:
            from .postgres.dialect import PostgresDialect  # noqa: PLC0415 - an optional extra
        except ImportError as exc:  # the optional driver is missing
            raise StoreError(
                f"PostgreSQL needs psycopg 3: pip install 'leasekeeper[postgres]' ({exc})"
            ) from None
        dialect = PostgresDialect(target.where, target.options, clock=clock)
    dialect.migrate()
    return Store(dialect)


def watch_file(url_or_path: str) -> FileWatch | None:
    """A hint that another process may have committed to an SQLite database, holding no
    connection (so a process that forks may keep it): an inotify watch of its file and its
    ``-wal`` (``sqlite/watch.py``; ``drain()`` says whether they were written, ``close()``).
    None for PostgreSQL (its hint is a LISTEN connection) and where inotify gives none."""
    path = sqlite_file(url_or_path)
    if path is None:
        return None
    from .sqlite.watch import open_watch  # noqa: PLC0415 - imported at first use (above)

    return open_watch(path)
