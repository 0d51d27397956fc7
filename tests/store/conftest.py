"""Fixtures the store's test modules share."""

from pathlib import Path

import pytest
from once_helpers import book  # noqa: F401 - a fixture: the calls' book of a test's backend
from store_backends import PostgresBackend


@pytest.fixture
def pg(tmp_path: Path) -> PostgresBackend:
    """A fresh schema on this session's PostgreSQL database, not created yet (the first open
    migrates it); the test skips loudly where no server answers (pg_session)."""
    return PostgresBackend(str(tmp_path))


@pytest.fixture
def pg_migrated(pg: PostgresBackend) -> PostgresBackend:
    """``pg`` with its schema created (for the tests that connect to it before any store)."""
    pg.open().close()
    return pg
