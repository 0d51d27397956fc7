"""Step 33 (``webhook_in_flight``, both engines): each webhook's window is a column of its row.
A webhook made before it keeps the window every webhook had then (8, ``WINDOW``); one added
after says its own."""

from __future__ import annotations

import os
import sqlite3

import pg_session
import psycopg
import pytest

from workerproc.store import open_store
from workerproc.store.migrations import HISTORY, SCHEMA_VERSION
from workerproc.store.postgres import admin
from workerproc.store.webhooks import RetryNumbers
from workerproc.window import WINDOW

BEFORE = HISTORY.index("webhook_in_flight")  # the version before the step
ROW = """INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
                               backoff_max, timeout, created_at, position)
         VALUES ('old', 'https://example.test/hook', NULL, 's', 1000000000000001, 5, 1.0,
                 60.0, 10.0, 1.0, 0)"""


def check(url: str) -> None:
    """The store at the current version: the old webhook at 8, its other numbers as they were;
    a new one with its own window."""
    with open_store(url) as store:
        old = store.webhook("old")
        assert old is not None
        assert (old.retry.in_flight, old.retry.max_failures, old.retry.backoff_max) == (8, 5, 60)
        assert WINDOW == 8
        store.add_webhook("new", "https://example.test/", secret="s", after=0,
                          retry=RetryNumbers(in_flight=2))  # fmt: skip
        assert {h.name: h.retry.in_flight for h in store.webhook_list()} == {"old": 8, "new": 2}


def test_sqlite_webhooks_from_before_keep_a_window_of_8(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(os.fspath(tmp_path), "old.db")
    with monkeypatch.context() as m:
        m.setattr("workerproc.store.sqlite.dialect.SCHEMA_VERSION", BEFORE)
        open_store(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == BEFORE
        conn.execute(ROW)
    finally:
        conn.close()
    check(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


def test_postgres_webhooks_from_before_keep_a_window_of_8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = pg_session.schema_url("window")
    schema = url.rsplit("schema=", 1)[1]
    with monkeypatch.context() as m:
        m.setattr(admin, "SCHEMA_VERSION", BEFORE)
        m.setattr("workerproc.store.postgres.dialect.SCHEMA_VERSION", BEFORE)
        open_store(url).close()
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(ROW)
    check(url)
