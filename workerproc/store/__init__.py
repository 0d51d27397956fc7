"""The lease store: the only code that speaks SQL. ``open_store`` picks the backend by URL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from .dialect import CHANGE_CHECK, Dialect
from .errors import (
    InvalidPayload,
    RunNotFound,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from .protocol import Store
from .roles import Inspector, Operator, Producer, WorkerStore
from .sqlite.dialect import SQLiteDialect
from .types import (
    AttemptEnd,
    BatchOutcome,
    CasResult,
    ClaimRequest,
    Clock,
    Commit,
    CommitOutcome,
    FinishedBucket,
    Lease,
    OwnerLease,
    QueueCounts,
    Rejection,
    Run,
    Stats,
    TaskInfo,
)
from .urls import POSTGRES_SCHEMES, is_postgres_url, redact

__all__ = [
    "CHANGE_CHECK",
    "AttemptEnd",
    "BatchOutcome",
    "CasResult",
    "ClaimRequest",
    "Clock",
    "Commit",
    "CommitOutcome",
    "FinishedBucket",
    "Inspector",
    "InvalidPayload",
    "Lease",
    "Operator",
    "OwnerLease",
    "Producer",
    "QueueCounts",
    "Rejection",
    "Run",
    "RunNotFound",
    "SchemaTooNew",
    "Stats",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "StoreReadOnly",
    "StoreUnavailable",
    "TaskInfo",
    "WorkerStore",
    "is_postgres_url",
    "open_store",
    "redact",
]


def open_store(url_or_path: str, *, clock: Clock | None = None, **options: object) -> Store:
    """Open a store: a file path or ``sqlite:///path[?synchronous=normal]`` opens SQLite;
    ``postgresql://user@host/db[?schema=NAME&busy_timeout=S]`` opens PostgreSQL (the
    ``postgres`` extra installs its driver).

    ``clock`` (seconds, float) replaces the wall clock (the database clock on PostgreSQL):
    tests inject one to move time.
    """
    if "://" not in url_or_path:
        return _opened(SQLiteDialect(url_or_path, clock=clock, **options))  # type: ignore[arg-type]
    parts = urlsplit(url_or_path)
    if parts.scheme == "sqlite":
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        merged: dict[str, object] = {**query, **options}
        if "busy_timeout" in merged:
            merged["busy_timeout"] = float(merged["busy_timeout"])  # type: ignore[arg-type]
        path = parts.path if not parts.netloc else f"/{parts.netloc}{parts.path}"
        if url_or_path.startswith("sqlite:///"):
            path = url_or_path[len("sqlite://") :].split("?", 1)[0]
        return _opened(SQLiteDialect(path, clock=clock, **merged))  # type: ignore[arg-type]
    if parts.scheme in POSTGRES_SCHEMES:
        try:
            from .postgres.dialect import PostgresDialect  # noqa: PLC0415 - an optional extra
        except ImportError as exc:  # the optional driver is missing
            raise StoreError(
                f"PostgreSQL needs psycopg 3: pip install 'leasekeeper[postgres]' ({exc})"
            ) from None
        return _opened(PostgresDialect(url_or_path, clock=clock, **options))  # type: ignore[arg-type]
    raise StoreError(
        f"unsupported store URL scheme {parts.scheme!r} (use a path, sqlite:/// or postgresql://)"
    )


def _opened(dialect: Dialect) -> Store:
    dialect.migrate()
    return Store(dialect)
