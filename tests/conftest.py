from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pg_session
import pgbouncer as pgbouncer_support
import pytest
from helpers import FakeClock
from store_backends import BACKENDS, Backend
from sv_harness import Supervisor
from tools import require_tool
from web_process import web_procs  # noqa: F401 - a fixture, for the dashboard tests

from workerproc.store import Store, open_store

# A suite started in the background by a non-interactive shell (``scripts/test &``) inherits
# SIGINT ignored, and so would every process a test starts: a child that a test stops with
# Ctrl-C (``events --follow``) would then rightly keep ignoring it. The tests' processes start
# as from a terminal instead: SIGINT at its default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _postgres_database() -> Iterator[None]:
    """The session's PostgreSQL database (created on first use) is dropped at the end."""
    yield
    pg_session.drop_database()


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[pgbouncer_support.Bouncer]:
    """A PgBouncer in transaction mode in front of the tests' server, for this test process
    (tests/support/pgbouncer.py); skipped loudly without pgbouncer, failed under
    LEASEKEEPER_REQUIRE_TOOLS."""
    require_tool("pgbouncer", pgbouncer_support.binary(), "pgbouncer")
    with pgbouncer_support.running(pg_session.database_url()) as bouncer:
        yield bouncer


@pytest.fixture
def db_path(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(os.fspath(tmp_path), "lk.db")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A fresh database's address on each backend in turn: a file in the test's directory, or a
    fresh PostgreSQL schema. Not created: the first open (a worker's, a command's) migrates it.
    tests/cli/conftest.py creates it first; a module that needs one backend or rows of its own
    overrides ``db`` (on top of this one or of ``sqlite_db``) and says why."""
    if request.param == "postgres":
        return pg_session.schema_url()
    return os.path.join(os.fspath(tmp_path), "lk.db")


@pytest.fixture
def sqlite_db(db_path: str) -> str:
    """A created SQLite database file (the schema migrated, no row)."""
    open_store(db_path).close()
    return db_path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db_path: str, clock: FakeClock) -> Iterator[Store]:
    s = open_store(db_path, clock=clock)
    yield s
    s.close()


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Backend:
    """Each backend in turn (the protocol suites run against every one)."""
    return BACKENDS[request.param](os.fspath(tmp_path))


@pytest.fixture
def s(backend: Backend, clock: FakeClock) -> Iterator[Store]:
    """A store on the current backend, with the fake clock."""
    store = backend.open(clock)
    yield store
    store.close()


@pytest.fixture
def sv(tmp_path: os.PathLike[str]) -> Iterator[Supervisor]:
    """A real supervisor process in its own session; killed (with its workers) afterwards."""
    supervisor = Supervisor(Path(tmp_path))
    try:
        yield supervisor
    finally:
        supervisor.kill_all()


@pytest.fixture(params=["sqlite", "postgres"])
def sv_each(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[Supervisor]:
    """A real supervisor on each backend in turn (a fresh PostgreSQL schema for the second)."""
    supervisor = Supervisor(Path(tmp_path))
    if request.param == "postgres":
        supervisor.db = pg_session.schema_url("sv")
    try:
        yield supervisor
    finally:
        supervisor.kill_all()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the directory of the screenshots the browser test kept (web/test_web_browser.py)."""
    where = Path(os.environ.get("LEASEKEEPER_ARTIFACTS", Path(__file__).parent.parent /
                                "test-artifacts")) / "web"  # fmt: skip
    if where.is_dir() and any(where.glob("*.png")):
        terminalreporter.write_line(f"dashboard screenshots: {where}")
