"""The PostgreSQL server the tests use: one uniquely named database per pytest session (other
people run tests on the same server at the same time), one fresh schema per test, dropped with
the database at the end (by a process of its own: the session does not wait for it).

The server: ``LEASEKEEPER_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``,
trust auth). Where none can be reached the PostgreSQL tests skip with a loud reason, except in
CI (``LEASEKEEPER_REQUIRE_POSTGRES=1`` or ``LEASEKEEPER_REQUIRE_TOOLS=1``), where they fail.
"""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import sys
import warnings
from urllib.parse import urlsplit, urlunsplit

import pytest

try:
    import psycopg
except ImportError:  # the `test` extra installs it; without it the PostgreSQL tests skip loudly
    psycopg = None  # type: ignore[assignment]

ADMIN_URL = os.environ.get("LEASEKEEPER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRED = any(
    os.environ.get(v) == "1" for v in ("LEASEKEEPER_REQUIRE_POSTGRES", "LEASEKEEPER_REQUIRE_TOOLS")
)

_state: dict[str, str | None] = {"url": None, "error": None, "owner_pid": None}
_schemas = itertools.count(1)


def database_url() -> str:
    """This session's database (created on first use), or skip/fail loudly without a server."""
    if _state["url"] is not None:
        return _state["url"]
    if _state["error"] is None:
        name = f"lk_test_{os.getpid()}_{secrets.token_hex(3)}"
        try:
            if psycopg is None:
                raise ImportError("psycopg is not installed (pip install -e '.[test]')")
            with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            _state["url"] = urlunsplit(urlsplit(ADMIN_URL)._replace(path=f"/{name}"))
            _state["owner_pid"] = str(os.getpid())
            return _state["url"]
        except Exception as exc:  # no driver, no server, no permission: say which
            _state["error"] = f"{type(exc).__name__}: {exc}".strip()
    reason = (
        f"NO POSTGRESQL SERVER for the PostgreSQL tests at {ADMIN_URL} ({_state['error']}); "
        "start one (see .ci/run) or set LEASEKEEPER_TEST_POSTGRES"
    )
    if REQUIRED:
        pytest.fail(reason, pytrace=False)
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


def schema_url(prefix: str = "t") -> str:
    """A URL on this session's database with a schema no other test uses."""
    return f"{database_url()}?schema={prefix}{next(_schemas)}_{secrets.token_hex(3)}"


# Dropping a database of a thousand test schemas takes the server half a minute and more (its
# files unlinked, a checkpoint): done by a process of its own, so that the session ends at once.
_DROP = """
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True, connect_timeout=5) as conn:
    conn.execute("SET statement_timeout = '300s'")
    conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[2]}" WITH (FORCE)')
"""


def drop_database() -> None:
    url, pid = _state["url"], _state["owner_pid"]
    if url is None or pid != str(os.getpid()):
        return
    name = urlsplit(url).path.lstrip("/")
    subprocess.Popen(
        [sys.executable, "-c", _DROP, ADMIN_URL, name],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _state["url"] = None


def truncate(url: str) -> None:
    """Empty a test schema's tables (cheaper than a new schema for many short examples)."""
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(database_url(), autocommit=True, connect_timeout=5) as conn:
        tables = conn.execute(
            "SELECT string_agg(format('%%I.%%I', schemaname, tablename), ', ') FROM pg_tables "
            "WHERE schemaname = %s AND tablename <> 'leasekeeper_schema'",
            (schema,),
        ).fetchone()
        assert tables is not None and tables[0], f"no tables in schema {schema}"
        conn.execute(f"TRUNCATE {tables[0]} RESTART IDENTITY")
