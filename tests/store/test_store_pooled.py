"""The PostgreSQL store behind a transaction pooler (``pooler=transaction``): its URL options are
checked before anything is opened, and with ``listen=poll`` (no LISTEN anywhere) a waiter is
still woken by another connection's commit, through a real PgBouncer (tests/support/pgbouncer.py).
The whole conformance suite through PgBouncer is the suite's ``postgres-pgbouncer`` driver."""

from __future__ import annotations

import threading
import time

import pg_session
import pgbouncer as pgbouncer_support
import pytest

from workerproc.store import InvalidOption, open_store

URL = "postgresql://u@pgbouncer.invalid:6432/jobs"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("pooler=session", "pooler must be one of none, transaction"),
        ("pooler=transaction&listen=always", "listen must be one of direct, poll"),
        ("pooler=transaction&listen=direct", "needs listen_port"),
        ("listen_port=5432", "are for pooler=transaction"),
        ("pooler=transaction&listen=poll&listen_port=5432", "are for listen=direct"),
        ("pooler=transaction&listen=direct&listen_port=70000", "a port from 1 to 65535"),
        ("pooler=transaction&listen=direct&listen_host=a%20b", "a host name or address"),
    ],
)
def test_pooler_options_are_checked_before_anything_is_opened(query: str, said: str) -> None:
    with pytest.raises(InvalidOption, match=said):
        open_store(f"{URL}?{query}")


@pytest.mark.postgres
@pytest.mark.pgbouncer
def test_a_polling_store_through_pgbouncer_wakes_on_another_connections_commit(
    pgbouncer: pgbouncer_support.Bouncer,
) -> None:
    direct = pg_session.schema_url("poll")
    url = pgbouncer.url(direct, "poll")
    waiter, writer = open_store(url), open_store(direct)
    try:
        assert "pooler=transaction" in waiter.url and "listen=poll" in waiter.url  # reopens so
        assert waiter.change_watch() is None  # nothing to sleep on: it polls
        token = waiter.change_token()
        timer = threading.Timer(0.5, lambda: writer.start_run("step", {}))
        began = time.monotonic()
        timer.start()
        seen, looks = None, 0  # a wake-up may be anyone's transaction: look, wait again if not
        while seen is None and time.monotonic() - began < 30:
            token = waiter.wait_change(token, 30)
            seen, looks = waiter.next_ready_at(None), looks + 1
        timer.join()
        assert seen is not None and time.monotonic() - began < 25
        assert looks < 100  # it slept between looks (a poll every 0.1 s at most), never spun
    finally:
        waiter.close()
        writer.close()
