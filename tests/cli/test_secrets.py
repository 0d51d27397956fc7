"""No password is ever shown: ``redact`` masks every place a database URL can
carry one, and every place that shows a URL uses it — start lines, page footers (404 pages too),
error lines and pages, the store's own errors, logs, the state file behind ``status``, metrics
and the chaos report."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pg_session
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient
from sv_harness import Supervisor, env_with_tests
from web_process import WebProcess

from supervisor import exitcodes
from supervisor.commands.cli import cli as supervisor_cli
from supervisor.web.app import create_app
from supervisor.web.config import WebConfig
from workerproc.logs import JsonFormatter, TextFormatter
from workerproc.store import (
    Commit,
    InvalidOption,
    Store,
    StoreError,
    StoreUnavailable,
    open_store,
    redact,
)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:hunter2@db.internal:5432/jobs", "postgresql://u:***@db.internal:5432/jobs"),
        ("postgresql://u@h/db?password=hunter2&sslmode=require",
         "postgresql://u@h/db?password=***&sslmode=require"),
        ("postgresql://h/db?sslpassword=hunter2", "postgresql://h/db?sslpassword=***"),
        ("postgresql://h/db?oauth_client_secret=hunter2", "postgresql://h/db?oauth_client_secret=***"),
        ("postgresql://h/db?pass%77ord=hunter2", "postgresql://h/db?pass%77ord=***"),
        ("postgresql://u:hunter2@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
        ("postgresql://u@[2001:db8::7]/db", "postgresql://u@[2001:db8::7]/db"),
        ("postgresql://u:hunter2@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
        ("postgresql://u:hun@ter/2@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:hunter2@h/db#x", "postgresql://u:***@h/db#x"),
        ("postgresql:///db?host=/run/postgresql&passfile=/etc/lk.pgpass",
         "postgresql:///db?host=/run/postgresql&passfile=/etc/lk.pgpass"),
        ("postgresql:///db?service=leasekeeper", "postgresql:///db?service=leasekeeper"),
        ("sqlite:///var/lib/lk/a@b.db", "sqlite:///var/lib/lk/a@b.db"),
        ("/var/lib/lk/jobs.db", "/var/lib/lk/jobs.db"),
        # a driver's message that quotes the URL it was given
        ('bad URI: "postgresql://u:hunter2@[::1:1/db"\n', 'bad URI: "postgresql://u:***@[::1:1/db"\n'),
        ("a postgresql://u:hunter2@h/x and postgres://v:hunter3@g/y",
         "a postgresql://u:***@h/x and postgres://v:***@g/y"),
        # our schemes without "//" (refused, but quoted by nobody with the password)
        ("postgresql:db?password=hunter2", "postgresql:db?password=***"),
        ("at POSTGRES:/db?sslpassword=hunter2&x=1.", "at POSTGRES:/db?sslpassword=***&x=1."),
        ("error: sqlite: no file", "error: sqlite: no file"),
    ],
)  # fmt: skip
def test_redact_masks_every_password_a_url_can_carry(url: str, shown: str) -> None:
    assert redact(url) == shown


PASSWORDS = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=6, max_size=20)


@given(PASSWORDS, st.sampled_from(["h", "[::1]", "h:5432", "[fe80::1%25eth0]:6432", "a,b:7"]))
def test_no_form_of_a_url_shows_its_password(password: str, host: str) -> None:
    forms = [
        "postgresql://user:{pw}@{host}/db",
        "postgres://user:{pw}@{host}/db?sslmode=disable",
        "postgresql://{host}/db?user=u&password={pw}",
        "postgresql://{host}/db?password={pw}&application_name=x",
        "postgresql://{host}/db?sslpassword={pw}",
        "error: cannot connect to postgresql://u:{pw}@{host}/db: refused",
    ]
    for form in forms:  # exactly the password is masked: the host stays as written
        url = form.format(pw=password, host=host)
        assert redact(url) == form.format(pw="***", host=host), url


# -- what the store says, and what the CLI and the logs print -----------------------------------
REFUSED = [
    "postgresql:db?password=hunter2",  # no "//": libpq would quote it back in its error
    "postgres:?host=127.0.0.1&password=hunter2",
    "host=127.0.0.1 dbname=test password=hunter2",  # a libpq keyword/value string
    "postgresql://[::1:1/db?password=hunter2",  # libpq quotes the URL it cannot read
    "sqlite:///?password=hunter2",
]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # a stray file (named after the string, say) shows here
    return tmp_path


@pytest.mark.parametrize("given", REFUSED)
def test_no_error_of_the_store_quotes_a_password(here: Path, given: str) -> None:
    with pytest.raises(StoreError) as refused:
        open_store(given)
    assert isinstance(refused.value, InvalidOption), refused.value
    assert "hunter2" not in str(refused.value)
    assert os.listdir(here) == []


@pytest.mark.parametrize("given", REFUSED)
@pytest.mark.parametrize("command", [["enqueue", "t"], ["runs"], ["web", "--port", "0"]])
def test_no_error_line_of_the_cli_quotes_a_password(
    here: Path, given: str, command: list[str]
) -> None:
    clean = {k: None for k in os.environ if k.startswith("SUPERVISOR_")}
    result = CliRunner().invoke(supervisor_cli, [*command, "--db", given], env=clean)  # type: ignore[arg-type]
    assert result.exit_code == exitcodes.USAGE, result.output
    assert result.stderr.count("\n") == 1 and "hunter2" not in result.output, result.output
    assert os.listdir(here) == []


@pytest.mark.parametrize("formatter", [TextFormatter(False), JsonFormatter(False)])
def test_log_lines_mask_a_url_in_the_message_and_in_the_traceback(
    formatter: logging.Formatter,
) -> None:
    exc = StoreUnavailable("cannot connect: postgresql://u:hunter2@h/db?password=hunter3")
    record = logging.LogRecord("supervisor", logging.ERROR, __file__, 1,
                               "lost postgresql://u:hunter2@h/db", None,
                               (StoreUnavailable, exc, None))  # fmt: skip
    line = formatter.format(record)
    assert "hunter" not in line and line.count("u:***@h/db") == 2 and "password=***" in line


def test_an_error_kept_on_a_run_never_keeps_a_password(s: Store) -> None:
    """A handler's error may quote the URL of a database it could not reach: ``show``, the
    dashboard's run page and every backup would show it on."""
    said = "OperationalError: cannot reach postgresql://app:hunter2@db/x?sslpassword=hunter3"
    s.start_run("t")
    lease = s.claim("w", 60)
    assert lease is not None
    s.commit_many([Commit(lease, "release", error=said)])
    lease = s.claim("w", 60)
    assert lease is not None
    s.commit_many([Commit(lease, "fail", reason=said, error=said)])
    run = s.get_run(lease.run_id)
    assert run is not None and run.status == "failed"
    (task,) = s.get_tasks(lease.run_id)
    kept = [run.last_error, run.failure_reason, task.last_error]
    assert all("app:***@db/x?sslpassword=***" in (text or "") for text in kept), kept
    assert "hunter" not in repr(kept)


# -- the dashboard -----------------------------------------------------------------------------
SECRET_URL = "postgresql://lk:hunter2@[::1]:5432/jobs?password=hunter3&sslmode=require"
SHOWN = "postgresql://lk:***@[::1]:5432/jobs?password=***&amp;sslmode=require"


def dashboard(store: object) -> TestClient:
    """The dashboard of a database named by SECRET_URL (its pages read ``store``)."""
    config = WebConfig(db=SECRET_URL).validate()
    return TestClient(create_app(config, store), base_url="http://localhost",
                      raise_server_exceptions=False)  # fmt: skip  # type: ignore[arg-type]


def test_no_page_of_the_dashboard_shows_the_password(store: Store) -> None:
    store.start_run("t")
    with dashboard(store) as c:
        pages = [c.get(path) for path in ("/", "/runs", "/runs/1", "/leases", "/chaos",
                                          "/nowhere", "/runs/999")]  # fmt: skip
    assert [p.status_code for p in pages] == [200, 200, 200, 200, 200, 404, 404]
    for page in pages:
        assert "hunter" not in page.text
        assert SHOWN in page.text  # the footer names the database, masked


class Unreachable:
    """A store whose reads fail with a driver's message that quotes the URL it was given."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        if name in ("stats", "runs_page", "get_run"):

            def fail(*_: object, **__: object) -> None:
                raise StoreUnavailable(f'cannot connect: invalid URI "{SECRET_URL}"')

            return fail
        return getattr(self.inner, name)


def test_the_error_page_of_a_database_that_does_not_answer_shows_no_password(store: Store) -> None:
    with dashboard(Unreachable(store)) as c:
        page = c.get("/runs")
    assert page.status_code == 503
    assert "does not answer" in page.text and "lk:***@[::1]" in page.text
    assert "hunter" not in page.text


# -- a real pool, its commands and the dashboard, on PostgreSQL --------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env_with_tests())  # fmt: skip


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
@pytest.mark.slow
def test_the_pool_its_commands_and_its_dashboard_never_show_the_password(tmp_path: Path) -> None:
    # The test server trusts every local connection, so a URL may carry any password: both
    # places libpq takes one from are filled, each with its own secret.
    one, two = f"pw{secrets.token_hex(8)}", f"pw{secrets.token_hex(8)}"
    url = pg_session.schema_url("secret").replace("postgres@", f"postgres:{one}@", 1)
    url += f"&password={two}"
    shown: list[str] = []
    for _ in range(3):
        done = cli("enqueue", "sleep", "--db", url, "--payload", '{"s": 0.3}')
        assert done.returncode == 0, done.stderr
        shown += [done.stdout, done.stderr]
    sv = Supervisor(tmp_path)
    sv.db = url
    report = tmp_path / "chaos.json"
    sv.start("--metrics-port", "0", "--chaos", "--chaos-faults", "kill", "--chaos-interval",
             "0.2", "--chaos-max-faults", "1", "--chaos-report", str(report), n=2)  # fmt: skip
    try:
        (listening,) = sv.wait_event("metrics_listening")
        sv.wait_event("chaos_fault", timeout=60)
        with urllib.request.urlopen(f"http://127.0.0.1:{listening['port']}/metrics") as resp:
            shown.append(resp.read().decode())
        shown.append(Path(sv.pidfile + ".state").read_text())
        for args in (["status", "--pidfile", sv.pidfile, "--json"], ["status"], ["runs"],
                     ["show", "1"], ["check"]):  # fmt: skip
            done = cli(*args, "--db", url)
            assert done.returncode == 0, done.stderr
            shown += [done.stdout, done.stderr]
        web = WebProcess(tmp_path, "--db", url, "--port", "0")
        try:
            for path in ("/", "/runs", "/runs/1", "/nowhere"):
                shown.append(web.get(path)[1])
            assert web.stop() == 0
            shown += [web.out.read_text(), web.stderr()]
        finally:
            web.kill()
        sv.signal(15)
        assert sv.wait_exit(60) == 0, sv.text()
    finally:
        sv.kill_all()
    shown += [sv.text(), report.read_text()]
    unreachable = url.replace("127.0.0.1:5432", "127.0.0.1:1")
    done = cli("status", "--db", unreachable)
    assert done.returncode == 1 and "cannot connect" in done.stderr
    shown.append(done.stderr)
    everything = "\n".join(shown)
    assert one not in everything and two not in everything
    # the URL is shown (masked) in the start line, the footers and the error line
    assert everything.count("postgres:***@127.0.0.1") >= 5
    assert "password=***" in done.stderr


@pytest.mark.slow
def test_libpq_service_and_password_files_keep_the_password_out_of_the_url(
    tmp_path: Path,
) -> None:
    """docs/how-to/postgresql.md: the URL names a service; the service file names the database,
    the user and a password file. (The test server trusts local connections, so this shows
    that such a URL is taken as it is, not that the server checked the password.)"""
    parts = urlsplit(pg_session.database_url())
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"{parts.hostname}:{parts.port or 5432}:*:{parts.username}:pw-in-a-file\n")
    passfile.chmod(0o600)
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[leasekeeper]\ndbname={parts.path.lstrip('/')}\nuser={parts.username}\n"
                       f"passfile={passfile}\n")  # fmt: skip
    schema = urlsplit(pg_session.schema_url("svc")).query  # schema=...
    url = f"postgresql://{parts.hostname}:{parts.port or 5432}/?service=leasekeeper&{schema}"
    env = {**env_with_tests(), "PGSERVICEFILE": str(service)}
    for args in (["enqueue", "t"], ["runs"]):
        done = subprocess.run([sys.executable, "-m", "supervisor", *args, "--db", url],
                              capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert "pending" in done.stdout
