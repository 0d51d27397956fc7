"""One redaction for every address we print: a PostgreSQL password holding any
URL-special character (``? # " @ / % : &``, a space, a quote, a backslash), written raw, percent-
encoded, as a query option or in a libpq keyword/value string, and a webhook URL's query token,
are never shown by any printing path: ``redact_url`` itself, free text quoting the address,
a driver's error about it, the log formatters, the store's refusals, the CLI (``migrate``,
``runs``, ``webhooks`` and ``--json``, ``webhooks add``), the dashboard's footer and Webhooks
page, and a real pool's "supervisor started" line.

Each password is two random halves around the special character; neither half may appear
anywhere (so no form of the password does: raw, decoded or encoded)."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pg_session
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict
from starlette.testclient import TestClient
from sv_harness import Supervisor
from web_helpers import client

from supervisor import exitcodes
from supervisor.commands.cli import cli
from supervisor.web.app import create_app
from supervisor.web.config import WebConfig
from workerproc.logs import JsonFormatter, TextFormatter
from workerproc.store import InvalidOption, Store, open_store, redact, redact_url
from workerproc.store.redaction import scrub

SPECIAL = ["?", "#", '"', "@", "/", "%", " ", ":", "&", "'", "\\"]
# what libpq reads as it looks when written raw in a URL's user information (the others are
# refused before anything connects: a raw "@" or "/" reads as another host or database, a
# space or a stray "%" is no URL at all)
RAW_OK = {"?", "#", '"', ":", "&", "'", "\\"}


class Secret:
    """A password: two random halves around ``char``."""

    def __init__(self, char: str) -> None:
        self.left, self.right = f"Lk{secrets.token_hex(5)}", f"zq{secrets.token_hex(5)}"
        self.value = f"{self.left}{char}{self.right}"

    def absent(self, *texts: str) -> bool:
        return not any(self.left in t or self.right in t for t in texts)


def forms(
    secret: Secret, base: str = "postgresql://postgres@127.0.0.1:5432/test"
) -> dict[str, str]:
    """The ways a password reaches libpq: raw or percent-encoded in the user information, as
    the ``password`` option, and in a keyword/value string (quoted, ``\\`` and ``'`` escaped)."""
    host, _, rest = base.removeprefix("postgresql://postgres@").partition("/")
    db, _, query = rest.partition("?")
    glue = f"&{query}" if query else ""
    escaped = secret.value.replace("\\", "\\\\").replace("'", "\\'")
    return {
        "raw": f"postgresql://postgres:{secret.value}@{host}/{db}" + (f"?{query}" if query else ""),
        "encoded": f"postgresql://postgres:{quote(secret.value, safe='')}@{host}/{db}"
        + (f"?{query}" if query else ""),
        "option": f"postgresql://postgres@{host}/{db}?password={quote(secret.value, safe='')}"
        + glue,
        "keywords": f"host={host.partition(':')[0]} dbname={db} user=postgres password='{escaped}'",
    }


# -- the redaction itself ----------------------------------------------------------------------
@pytest.mark.parametrize("char", SPECIAL)
def test_no_reading_of_any_form_shows_the_password(char: str) -> None:
    secret = Secret(char)
    for form, address in forms(secret).items():
        shown = redact_url(address)
        quoted = [
            redact(f"cannot connect to {address}: refused"),
            redact(f'invalid URI: "{address}"'),
            redact(f"'{address}', retrying"),
            scrub(f'libpq said: "{secret.value}" and {address}', address),
        ]
        assert secret.absent(shown, *quoted), (form, address, shown, quoted)
        assert "***" in shown, (form, shown)
        if form != "keywords":  # the address stays readable: only the password went
            assert shown.startswith("postgresql://postgres") and "127.0.0.1" in shown, shown
        # libpq's own parser reads the mask where the password was
        assert conninfo_to_dict(shown).get("password") == "***", (form, shown)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://postgres:Hunter2?x@127.0.0.1/test", "postgresql://postgres:***@127.0.0.1/test"),
        ("postgresql://postgres:Hunter2#x@127.0.0.1/test", "postgresql://postgres:***@127.0.0.1/test"),
        ('postgresql://postgres:Hunter2"x@127.0.0.1/test', "postgresql://postgres:***@127.0.0.1/test"),
        ("postgresql://postgres:Hunter2%3Fx@127.0.0.1/test?sslmode=require",
         "postgresql://postgres:***@127.0.0.1/test?sslmode=require"),
        ("postgresql://h/db?password=a#b&sslmode=require", "postgresql://h/db?password=***&sslmode=require"),
        ("host=127.0.0.1 password='a b' dbname=test", "host=127.0.0.1 password=*** dbname=test"),
        ("https://hooks.example.test/in?token=Hunter2&channel=ops",
         "https://hooks.example.test/in?token=***&channel=***"),
        ("https://hooks.example.test/in#access_token=Hunter2", "https://hooks.example.test/in#access_token=***"),
        ("/var/lib/lk/a@b:c.db", "/var/lib/lk/a@b:c.db"),
    ],
)  # fmt: skip
def test_what_is_shown_keeps_the_rest_as_written(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_url_in_json_text_ends_at_its_closing_quote() -> None:
    """A handler's error quoting a JSON body keeps its other fields."""
    said = '{"url":"https://api.example.test/v1?key=Hunter2","code":429}'
    assert redact(said) == '{"url":"https://api.example.test/v1?key=***","code":429}'


def test_a_long_text_is_read_in_linear_time() -> None:
    """Every log line and kept error goes through ``redact``: a long word (a base64 blob in an
    error) took quadratic time (4 s for 32,000 letters)."""
    started = time.monotonic()
    assert redact("a" * 1_000_000 + " done") == "a" * 1_000_000 + " done"
    assert redact("https://u:a " * 20_000).count("***") == 0  # no "@": no password
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("formatter", [TextFormatter(False), JsonFormatter(False)])
def test_log_lines_never_show_a_password_with_special_characters(
    formatter: logging.Formatter,
) -> None:
    for char in SPECIAL:
        secret = Secret(char)
        for address in forms(secret).values():
            record = logging.LogRecord("supervisor", logging.INFO, __file__, 1,
                                       "lost %s", (address,), None)  # fmt: skip
            record.fields = {"db": address}  # type: ignore[attr-defined]
            line = formatter.format(record)
            assert secret.absent(line), line
            if isinstance(formatter, JsonFormatter):
                json.loads(line)  # still one JSON object


# -- the store's refusals ----------------------------------------------------------------------
@pytest.mark.parametrize("char", sorted(set(SPECIAL) - RAW_OK))
def test_a_url_libpq_would_misread_is_refused_without_its_password(
    char: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raw "@" or "/" (libpq would connect elsewhere, and its errors quote the parts), a raw
    space or a stray "%" (libpq's refusal quotes them): one line, nothing opened."""
    monkeypatch.chdir(tmp_path)
    secret = Secret(char)
    address = forms(secret)["raw"]
    with pytest.raises(InvalidOption) as refused:
        open_store(address)
    assert secret.absent(str(refused.value)), refused.value
    assert "postgres:***@127.0.0.1" in str(refused.value)
    result = CliRunner().invoke(cli, ["runs", "--db", address])
    assert result.exit_code == exitcodes.USAGE, result.output
    assert result.stderr.count("\n") == 1 and secret.absent(result.output), result.output


# -- webhook URLs ------------------------------------------------------------------------------
TOKEN = f"tok{secrets.token_hex(8)}"
HOOK_URL = f"https://hooks.example.test/in?token={TOKEN}&channel=ops"


def test_a_webhook_token_is_shown_by_no_command_and_no_page(store: Store, db_path: str) -> None:
    runner = CliRunner()
    added = runner.invoke(cli, ["webhooks", "add", "billing", HOOK_URL, "--db", db_path])
    assert added.exit_code == 0, added.output
    assert "https://hooks.example.test/in?token=***&channel=***" in added.output
    listed = runner.invoke(cli, ["webhooks", "--db", db_path])
    as_json = runner.invoke(cli, ["webhooks", "--db", db_path, "--json"])
    assert listed.exit_code == as_json.exit_code == 0
    assert (
        json.loads(as_json.output)[0]["url"]
        == "https://hooks.example.test/in?token=***&channel=***"
    )
    page = client(store).get("/webhooks")
    assert page.status_code == 200 and "hooks.example.test/in?token=***" in page.text
    refused = runner.invoke(cli, ["webhooks", "add", "x", HOOK_URL.replace("/in", "/i n"),
                                  "--db", db_path])  # fmt: skip
    assert refused.exit_code == exitcodes.USAGE
    for text in (added.output, listed.output, as_json.output, page.text, refused.output):
        assert TOKEN not in text
    with open_store(db_path) as s:  # the deliverer still has the whole URL
        assert [h.url for h in s.webhook_list()] == [HOOK_URL]


# -- the dashboard -----------------------------------------------------------------------------
@pytest.mark.parametrize("char", SPECIAL)
def test_the_dashboard_footer_never_shows_the_password(char: str, store: Store) -> None:
    secret = Secret(char)
    for form, address in forms(secret).items():
        if form == "keywords":
            continue  # --db takes no keyword/value string (refused: see above)
        config = WebConfig(db=address).validate()
        with TestClient(create_app(config, store), base_url="http://localhost") as c:  # type: ignore[arg-type]
            pages = [c.get(p) for p in ("/", "/runs", "/nowhere")]
        assert [p.status_code for p in pages] == [200, 200, 404]
        for page in pages:
            assert secret.absent(page.text), (form, address)
            assert "postgres:***@127.0.0.1" in page.text or "password=***" in page.text


# -- PostgreSQL: the CLI, its errors, and a real pool's start line -----------------------------
@pytest.fixture
def pg_base() -> Iterator[str]:
    yield pg_session.database_url()


def cli_texts(address: str) -> tuple[list[str], list[int]]:
    runner = CliRunner()
    texts, codes = [], []
    for args in (["migrate"], ["runs"], ["webhooks", "--json"], ["enqueue", "t"]):
        result = runner.invoke(cli, [*args, "--db", address])
        texts.append(result.output)
        codes.append(result.exit_code)
    return texts, codes


@pytest.mark.parametrize("char", SPECIAL)
def test_the_cli_never_shows_a_postgresql_password(char: str, pg_base: str) -> None:
    secret = Secret(char)
    schema = f"red{secrets.token_hex(4)}"
    for form, address in forms(secret, f"{pg_base}?schema={schema}").items():
        texts, codes = cli_texts(address)
        assert secret.absent(*texts), (form, address, texts)
        if form == "keywords" or (form == "raw" and char not in RAW_OK):
            assert codes == [exitcodes.USAGE] * 4, (form, texts)
        else:  # the trusting test server connects whatever the password: every command ran
            assert codes == [0, 0, 0, 0], (form, texts)
            assert "postgres:***@127.0.0.1" in texts[0] or "password=***" in texts[0], texts[0]
    # the error of a server that does not answer (retried for busy_timeout: short here)
    nowhere = f"{pg_base.replace(':5432', ':1')}?schema={schema}&busy_timeout=0.2"
    given = forms(secret, nowhere)
    for address in [given["encoded"], given["option"]] + [given["raw"]] * (char in RAW_OK):
        result = CliRunner().invoke(cli, ["runs", "--db", address])
        assert result.exit_code == exitcodes.ERROR and "cannot connect" in result.output
        assert secret.absent(result.output), result.output


@pytest.mark.slow
def test_a_pool_never_logs_a_postgresql_password(tmp_path: Path, pg_base: str) -> None:
    """The "supervisor started" line, the state file and ``status``: one password holding every
    character libpq takes raw, and a second one (every other character, percent-encoded) as
    the ``password`` option (libpq uses that one; the trusting server takes either)."""
    one, two = Secret("?#\":&'\\"), Secret("@/% ")
    url = forms(one, f"{pg_base}?schema=pool{secrets.token_hex(4)}")["raw"]
    url += f"&password={quote(two.value, safe='')}"
    sv = Supervisor(tmp_path)
    sv.db = url
    sv.start("--drain", n=1)
    try:
        assert sv.wait_exit(90) == 0, sv.text()
    finally:
        sv.kill_all()
    started = [e for e in sv.events() if e.get("event") == "supervisor_started"]
    assert started and "postgres:***@127.0.0.1" in json.dumps(started), sv.text()
    status = CliRunner().invoke(cli, ["runs", "--db", url])
    assert status.exit_code == 0, status.output
    assert one.absent(sv.text(), status.output) and two.absent(sv.text(), status.output)
