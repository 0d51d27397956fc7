"""``supervisor webhooks``, ``webhooks add`` and ``webhooks remove`` against a real
SQLite database: each webhook with its delivery record and dead letters, as text and as JSON; a
secret read from a file (or made and shown once); bad input is one line on stderr and a non-zero
exit, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import error_line, invoke

from supervisor import exitcodes
from workerproc.store import open_store
from workerproc.webhooks import signature_header, verify


@pytest.fixture
def db(sqlite_db: str) -> str:
    """SQLite only: what these tests pin does not depend on the backend."""
    return sqlite_db


def test_add_list_and_remove(db: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("whsec-from-a-file\n")
    secret.chmod(0o600)
    done = invoke("webhooks", "add", "billing", "https://example.test/hook", "--db", db,
                  "--kinds", "run.failed,run.succeeded", "--secret-file", str(secret),
                  "--max-failures", "5", "--backoff", "2", "--backoff-max", "60")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "webhook billing: run.failed,run.succeeded to https://example.test/hook" in done.output
    assert "whsec" not in done.output, "a secret from a file is never printed"
    made = invoke("webhooks", "add", "audit", "http://127.0.0.1:9/a", "--db", db)
    assert made.exit_code == 0 and "secret (shown once" in made.output
    shown = made.output.rsplit(": ", 1)[1].strip()
    with open_store(db) as store:
        hooks = {h.name: h for h in store.webhook_list()}
        assert hooks["billing"].secret == "whsec-from-a-file"
        assert hooks["audit"].secret == shown and len(shown) >= 40
        assert (hooks["billing"].retry.max_failures, hooks["billing"].retry.backoff) == (5, 2.0)
    body = b'{"id":1}'
    assert verify(shown, signature_header(shown, body), body) > 0
    text = invoke("webhooks", "--db", db)
    assert text.exit_code == 0
    assert "billing" in text.output and "run.failed,run.succeeded" in text.output
    assert "pending" in text.output and "whsec" not in text.output and shown not in text.output
    docs = json.loads(invoke("webhooks", "--db", db, "--json").output)
    assert [d["name"] for d in docs] == ["audit", "billing"]
    assert docs[1]["max_failures"] == 5 and docs[1]["dead"] == [] and "secret" not in docs[1]
    assert invoke("webhooks", "remove", "billing", "--db", db).exit_code == 0
    assert error_line(invoke("webhooks", "remove", "billing", "--db", db), exitcodes.ERROR) == (
        "supervisor: error: no webhook 'billing' (see 'supervisor webhooks')"
    )


def test_a_webhooks_window_is_set_by_in_flight_and_shown(db: str) -> None:
    for name, more in (
        ("one", ["--in-flight", "1"]),
        ("most", ["--in-flight", "64"]),
        ("plain", []),
    ):
        done = invoke("webhooks", "add", name, "https://example.test/", "--db", db, *more)
        assert done.exit_code == 0, done.output
    with open_store(db) as store:
        stored = {h.name: h.retry.in_flight for h in store.webhook_list()}
    assert stored == {"one": 1, "most": 64, "plain": 8}
    docs = json.loads(invoke("webhooks", "--db", db, "--json").output)
    assert {d["name"]: d["window"] for d in docs} == stored
    assert all(d["in_flight"] is False for d in docs), "(whether a delivery holds its lease)"
    header, *rows = invoke("webhooks", "--db", db).output.splitlines()
    at = header.split().index("WINDOW")
    assert {row.split()[0]: int(row.split()[at]) for row in rows} == stored


def test_a_secret_from_standard_input(db: str) -> None:
    done = invoke("webhooks", "add", "h", "https://example.test/", "--db", db,
                  "--secret-file", "-", stdin="piped-secret\n")  # fmt: skip
    assert done.exit_code == 0, done.output
    with open_store(db) as store:
        assert store.webhook("h").secret == "piped-secret"  # type: ignore[union-attr]


def test_dead_letters_are_listed(db: str) -> None:
    with open_store(db) as store:
        hook = store.add_webhook("h", "https://example.test/", secret="s")
        lease = store.claim("w", 30.0, queues=["leasekeeper.webhooks"])
        assert lease is not None
        dead = [{"event": 7, "run_id": 3, "kind": "run.failed", "error": "HTTP 410", "at": 1.0}]
        state = {"cursor": 7, "delivered": 2, "dead": dead, "dead_total": 4, "failures": 0}
        assert store.compare_and_set(lease, lease.revision, state).value == "ok"
    text = invoke("webhooks", "--db", db).output
    assert "dead letters of h (newest 1 of 4)" in text and "HTTP 410" in text
    (doc,) = json.loads(invoke("webhooks", "--db", db, "--json").output)
    assert doc["dead"][0]["event"] == 7 and doc["dead_total"] == 4 and doc["run_id"] == hook.run_id


def test_how_far_behind_each_webhook_is(db: str) -> None:
    """The events after its cursor that it wants (the drain waits for them)."""
    with open_store(db) as store:
        store.add_webhook("all", "https://example.test/", secret="s", after=0)
        store.add_webhook("ends", "https://example.test/", secret="s", after=0,
                          kinds=["run.succeeded"])  # fmt: skip
        store.start_runs([{"task": "t"}] * 3)
    docs = {d["name"]: d for d in json.loads(invoke("webhooks", "--db", db, "--json").output)}
    assert (docs["all"]["backlog"], docs["ends"]["backlog"]) == (3, 0)
    assert docs["all"]["next_try_at"] is None
    text = invoke("webhooks", "--db", db).output
    header, first, second = text.splitlines()[:3]
    assert header.split()[:7] == ["WEBHOOK", "URL", "KINDS", "DELIVERY", "CURSOR", "BEHIND",
                                  "DELIVERED"]  # fmt: skip
    assert first.split()[4:6] == ["0", "3"] and second.split()[4:6] == ["0", "0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ftp://x/"], "must be http:// or https://"),
        (["https://x/", "--kinds", "run.nope"], "unknown event kind 'run.nope'"),
        (["https://x/", "--max-failures", "0"], "--max-failures"),
        (["https://x/", "--backoff", "9", "--backoff-max", "2"], "--backoff must not exceed"),
        (["https://x/", "--secret-file", "/nonexistent/s"], "--secret-file /nonexistent/s"),
        (["https://x/", "--timeout", "nan"], "--timeout"),
        (["https://x/", "--in-flight", "0"], "--in-flight must be a number from 1 to 64 (got 0)"),
        (["https://x/", "--in-flight", "65"], "--in-flight must be a number from 1 to 64 (got 65)"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(db: str, args: list[str], message: str) -> None:
    result = invoke("webhooks", "add", "h", *args, "--db", db)
    assert result.exit_code != 0
    assert message in error_line(result, result.exit_code)
    with open_store(db) as store:
        assert store.webhooks() == [] and store.stats().runs == {}


def test_an_empty_or_binary_secret_file_is_refused(db: str, tmp_path: Path) -> None:
    for content in (b"\n", b"\xff\xfe"):
        path = tmp_path / "s"
        path.write_bytes(content)
        result = invoke(
            "webhooks", "add", "h", "https://x/", "--db", db, "--secret-file", str(path)
        )
        assert "--secret-file" in error_line(result, exitcodes.USAGE)


def test_a_missing_database_is_one_line(tmp_path: Path) -> None:
    result = invoke("webhooks", "--db", str(tmp_path / "none.db"))
    assert "does not exist" in error_line(result, exitcodes.ERROR)
