"""One parser for every store address (``workerproc/store/urls.py``) and each backend's declared
options (``workerproc/store/settings.py``): every form either works or is refused with one line
(``InvalidOption``; the CLI's exit 2) before anything is opened or created."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import pg_session
import pytest
from cli_runner import invoke

from supervisor import exitcodes
from supervisor.loop.storegate import db_file
from workerproc.store import InvalidOption, StoreError, is_postgres_url, open_store
from workerproc.store.postgres.dialect import PostgresDialect
from workerproc.store.urls import parse_url


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: relative paths land here, so a stray file shows."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("given", "backend", "where"),
    [
        ("lk.db", "sqlite", "lk.db"),
        ("/var/lib/lk.db", "sqlite", "/var/lib/lk.db"),
        ("sqlite:///var/lib/lk.db", "sqlite", "/var/lib/lk.db"),
        ("sqlite:////var/lib/lk.db", "sqlite", "/var/lib/lk.db"),
        ("SQLITE:///var/lib/lk.db?synchronous=normal", "sqlite", "/var/lib/lk.db"),
        ("sqlite:relative.db", "sqlite", "relative.db"),
        ("postgresql:///db?host=127.0.0.1", "postgres", "postgresql:///db"),
        ("postgres://u@[::1]:5432/db?schema=s", "postgres", "postgres://u@[::1]:5432/db"),
        ("POSTGRESQL://u@h/db", "postgres", "postgresql://u@h/db"),
    ],
)
def test_every_address_is_read_by_one_parser(given: str, backend: str, where: str) -> None:
    address = parse_url(given)
    assert (address.backend, address.where) == (backend, where)
    assert is_postgres_url(given) is (backend == "postgres")
    assert db_file(given) == (where if backend == "sqlite" else None)  # the supervisor's too


def test_a_libpq_url_keeps_every_part_but_our_options() -> None:
    address = parse_url("postgresql:///db?host=127.0.0.1&schema=ours&sslmode=require")
    ours, conninfo = address.split({"schema", "busy_timeout"})
    assert ours == {"schema": "ours"}
    assert conninfo == "postgresql:///db?host=127.0.0.1&sslmode=require"  # never postgresql:/db
    ipv6 = parse_url("postgresql://u@[::1]:5432/db?schema=s").split({"schema"})[1]
    dialect = PostgresDialect(ipv6)  # connects on first use only
    assert urlsplit(dialect.url).hostname == "::1" and "[::1]:5432" in dialect.url


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("sqlite://relative.db", "names no host"),
        ("sqlite:///{dir}/a.db?busy_timeout=abc", "busy_timeout must be a number"),
        ("sqlite:///{dir}/a.db?busy_timeout=nan", "busy_timeout must be above 0"),
        ("sqlite:///{dir}/a.db?busy_timeout=0", "busy_timeout must be above 0"),
        ("sqlite:///{dir}/a.db?foo=bar", "SQLite takes no option 'foo' in its URL"),
        ("sqlite:///{dir}/a.db?synchronous=off", "synchronous must be one of FULL, NORMAL"),
        ("sqlite:", "no database file"),
        ("sqlite:///", "no database file"),
        ("mysql:///x", "unsupported store URL scheme 'mysql'"),
        ("", "no database given"),
        ("sqlite:///{dir}/a.db#x", "a SQLite URL has no #fragment"),  # not a file 'a.db#x'
        ("sqlite:///{dir}/a.db?busy_timeout=1&busy_timeout=2", "busy_timeout is given twice"),
        ("postgresql://h/db?schema=a&schema=b", "schema is given twice"),
        ("postgresql:db", "a PostgreSQL URL starts with postgresql://"),  # libpq: no URL
        ("POSTGRES:/db?host=h", "a PostgreSQL URL starts with postgres://"),
        ("host=localhost dbname=jobs", "not a libpq keyword/value string"),  # nor a file name
        (" user = lk", "not a libpq keyword/value string"),
    ],
)
def test_a_bad_address_is_one_line_and_creates_nothing(here: Path, given: str, words: str) -> None:
    with pytest.raises(InvalidOption, match=words):
        open_store(given.format(dir=here))
    assert os.listdir(here) == []


@pytest.mark.parametrize("given", ["SQLITE:///{dir}/upper.db", "sqlite:relative.db"])
def test_the_other_sqlite_forms_open_the_file_they_name(here: Path, given: str) -> None:
    with open_store(given.format(dir=here)) as store:
        run_id = store.start_run("t")
        again = open_store(store.url)  # the URL a store reports opens it again
        assert again.get_run(run_id) is not None
        again.close()
    named = "upper.db" if "upper" in given else "relative.db"
    assert {p for p in os.listdir(here) if not p.startswith(named)} == set()
    assert (here / named).is_file()


def test_options_are_declared_per_backend_and_keywords_win(here: Path) -> None:
    with pytest.raises(InvalidOption, match="SQLite takes no option 'schema'"):
        open_store("lk.db", schema="x")  # type: ignore[call-arg]
    with pytest.raises(InvalidOption, match="takes no option 'foo'"):
        open_store("lk.db", foo=1)  # type: ignore[call-arg]
    assert os.listdir(here) == []
    with open_store("sqlite:lk.db?busy_timeout=2", busy_timeout=0.5) as store:
        assert store.dialect.busy_timeout == 0.5  # type: ignore[attr-defined]


def test_valid_libpq_urls_open_and_bad_ones_are_one_line() -> None:
    parts = urlsplit(pg_session.database_url())
    schema = f"urls_{secrets.token_hex(3)}"
    url = f"postgresql://{parts.username}@/{parts.path.lstrip('/')}?host={parts.hostname}"
    with open_store(f"{url}&port={parts.port or 5432}&schema={schema}") as store:
        assert store.get_run(store.start_run("t")) is not None
    with pytest.raises(InvalidOption, match="idle_in_transaction must be"):
        open_store(f"{url}&schema={schema}&idle_in_transaction=0")
    with pytest.raises(InvalidOption, match="PostgreSQL takes no option 'synchronous'"):
        open_store(f"{url}&schema={schema}", synchronous="normal")
    with pytest.raises(InvalidOption, match='invalid URI query parameter: "migrate"'):
        open_store(f"{url}&schema={schema}&migrate=false")  # a reader's switch, never a URL's
    with open_store(f"{url}&schema={schema}&busy_timeout=2", busy_timeout=0.5) as store:
        assert store.dialect.busy_timeout == 0.5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "given",
    ["sqlite://relative.db", "sqlite:///{dir}/a.db?busy_timeout=abc",
     "sqlite:///{dir}/a.db?busy_timeout=nan", "sqlite:///{dir}/a.db?foo=bar", "mysql:///x",
     "sqlite:///{dir}/a.db#x", "postgresql:db", "host=localhost dbname=jobs"],
)  # fmt: skip
@pytest.mark.parametrize("command", [["enqueue", "t"], ["status"], ["runs"]])
def test_the_cli_says_one_line_exits_2_and_creates_nothing(
    here: Path, given: str, command: list[str]
) -> None:
    result = invoke(*command, "--db", given.format(dir=here))
    assert result.exit_code == exitcodes.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert os.listdir(here) == []


def test_a_relative_sqlite_url_is_that_file_for_the_cli_too(here: Path) -> None:
    assert invoke("enqueue", "t", "--db", "sqlite:relative.db").exit_code == 0
    assert invoke("runs", "--db", "sqlite:relative.db").exit_code == 0
    assert (here / "relative.db").is_file() and not (here / "sqlite:relative.db").exists()
    with pytest.raises(StoreError):
        open_store("sqlite:relative.db", migrate=False)  # SQLite has no such option


def test_every_connection_bounds_a_silent_network_unless_the_url_says_otherwise() -> None:
    """A partition drops packets without closing anything: each connection asks the kernel to
    end it after ``network_timeout`` (TCP_USER_TIMEOUT, keepalives); libpq's own settings in
    the URL win, and the option has a range."""
    schema = f"urls_{secrets.token_hex(3)}"
    url = f"{pg_session.database_url()}?schema={schema}"
    with open_store(url, network_timeout=4) as store:
        session = store.dialect.session()  # type: ignore[attr-defined]
        assert session["tcp_user_timeout"] == 4000 and session["keepalives"] == 1
        assert session["keepalives_idle"] == 2 and session["keepalives_count"] == 3
        assert store.get_run(store.start_run("t")) is not None  # libpq takes them
    with open_store(f"{url}&tcp_user_timeout=30000&network_timeout=2") as store:
        session = store.dialect.session()  # type: ignore[attr-defined]
        assert "tcp_user_timeout" not in session and session["keepalives_idle"] == 1
    with pytest.raises(InvalidOption, match="network_timeout must be"):
        open_store(f"{url}&network_timeout=0.5")
