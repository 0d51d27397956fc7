"""On both backends: the webhooks' delivery runs are the system's. They are
numbered apart (from ``SYSTEM_RUNS`` up, never a user's id, never given twice), hidden from
``store.events()``, the run lists, ``supervisor runs``, ``supervisor events`` and the dashboard's
run list unless asked for (``system=True``, ``--all``, ``?all=1``), and the delivery runs of a
database made before this move into their range when it is migrated."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import cli_runner
import pg_session
import psycopg
import pytest
from event_stream import EventStreamClient
from helpers import FakeClock
from store_backends import Backend
from web_helpers import client
from web_process import WebProcess

from workerproc.context import TaskContext
from workerproc.delivery import Deliverer
from workerproc.store import Store, open_async_store, open_store
from workerproc.store.postgres import admin
from workerproc.store.sqlite import dialect as sqlite_dialect
from workerproc.store.types import SYSTEM_RUNS
from workerproc.store.webhooks import DELIVERY_TASK, WEBHOOK_QUEUE

SECRET = "system-secret"
URL = "http://127.0.0.1:9/hook"  # (nothing listens: no test here delivers)


def parked(s: Store, name: str) -> int:
    """Add webhook ``name``, run its delivery once (nothing to send: it parks) and wake it:
    its run has written run.enqueued, step.claimed, step.committed, run.waiting and
    run.signalled. Its run id."""
    hook = s.add_webhook(name, URL, secret=SECRET, kinds=["run.failed"])
    (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    ctx = TaskContext(lease, threading.Event())
    Deliverer(lambda: s).deliver(ctx, s)
    assert ctx.commit is not None and ctx.commit.kind == "wait"
    s.commit_many([ctx.commit])
    assert s.wake_webhook(hook.run_id)
    return hook.run_id


def test_a_webhook_takes_no_user_run_id_and_no_id_is_given_twice(
    s: Store, clock: FakeClock
) -> None:
    """With a webhook, a user's first run got id 2."""
    first = s.add_webhook("a", URL, secret=SECRET)
    assert first.run_id == SYSTEM_RUNS + 1
    assert s.start_run("noop") == 1, "the user's first run is run 1"
    second = s.add_webhook("b", URL, secret=SECRET)
    assert second.run_id == SYSTEM_RUNS + 2
    assert s.start_runs([{"task": "noop"}] * 2) == [2, 3]
    assert s.get_run(second.run_id).system and not s.get_run(3).system  # type: ignore[union-attr]
    # the newest system run and the newest user run pruned: neither id is given again
    assert s.remove_webhook("b") and s.cancel_run(3)
    clock.advance(7200.0)
    assert s.prune(3600) >= 2
    assert s.get_run(second.run_id) is None and s.get_run(3) is None
    assert s.add_webhook("c", URL, secret=SECRET).run_id == SYSTEM_RUNS + 3
    assert s.start_run("noop") == 4


def test_the_system_runs_and_their_events_are_hidden_unless_asked(s: Store) -> None:
    """The delivery runs' run.waiting and run.signalled showed in the event stream,
    and the runs themselves in every list."""
    mine = s.start_run("noop")
    system = parked(s, "h")
    theirs = {e.kind for e in s.events(run=system)}  # a run named: its events, as ever
    assert {"run.waiting", "run.signalled", "step.claimed"} <= theirs
    assert {e.run_id for e in s.events(limit=1000)} == {mine}
    assert {e.run_id for e in s.events(limit=1000, system=True)} == {mine, system}
    followed = s.follow(after=0)
    assert next(followed).run_id == mine
    assert [r.id for r in s.list_runs()] == [mine]
    assert [r.id for r in s.list_runs(system=True)] == [system, mine]
    assert [r.id for r in s.list_runs(queue=WEBHOOK_QUEUE)] == []
    assert [r.id for r in s.list_runs(queue=WEBHOOK_QUEUE, system=True)] == [system]
    assert [r.id for r in s.list_runs("waiting", system=True)] == []  # (woken: pending)
    assert [r.id for r in s.list_runs("pending")] == [mine]
    assert [r.id for r in s.runs_page()] == [mine]
    assert [r.id for r in s.runs_page(after=0)] == [mine]
    assert [r.id for r in s.runs_page(system=True)] == [system, mine]
    assert [r.id for r in s.runs_page(after=mine, system=True)] == [system]
    assert s.task_names() == ["noop"]
    assert s.task_names(system=True) == [DELIVERY_TASK, "noop"]
    assert s.last_event_id() >= max(e.id for e in s.events(system=True, limit=1000))


def test_the_async_store_hides_them_too(backend: Backend) -> None:
    with backend.open() as s:
        mine = s.start_run("noop")
        system = parked(s, "h")

    async def read() -> tuple[set[int | None], set[int | None]]:
        store = await open_async_store(backend.url)
        async with store:
            hidden = {e.run_id for e in await store.events(limit=1000)}
            shown = {e.run_id for e in await store.events(limit=1000, system=True)}
        return hidden, shown

    assert asyncio.run(read()) == ({mine}, {mine, system})


def invoke(*args: str) -> Any:
    """A command that must succeed."""
    result = cli_runner.invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def test_supervisor_runs_and_events_show_them_with_all(backend: Backend) -> None:
    with backend.open() as s:
        mine = s.start_run("noop")
        system = parked(s, "h")
    db = backend.url
    runs = json.loads(invoke("runs", "--db", db, "--json").output)
    assert [r["id"] for r in runs] == [mine]
    every = json.loads(invoke("runs", "--db", db, "--json", "--all").output)
    assert [r["id"] for r in every] == [system, mine]
    named = json.loads(invoke("runs", "--db", db, "--json", "--queue", WEBHOOK_QUEUE).output)
    assert [r["id"] for r in named] == [system], "their queue named: asked for"
    text = invoke("events", "--db", db).output
    assert "run.waiting" not in text and "run.signalled" not in text and f"run {mine}" in text
    lines = invoke("events", "--db", db, "--json", "--all").output.splitlines()
    kinds = {json.loads(line)["kind"] for line in lines}
    assert {"run.waiting", "run.signalled"} <= kinds
    one = invoke("events", "--db", db, "--json", "--run", str(system)).output.splitlines()
    assert {json.loads(line)["run_id"] for line in one} == {system}


def test_the_dashboard_lists_them_only_when_asked(s: Store) -> None:
    mine = s.start_run("noop")
    system = parked(s, "h")
    plain = client(s).get("/runs").text
    assert f'href="/runs/{mine}"' in plain and f'href="/runs/{system}"' not in plain
    assert DELIVERY_TASK not in plain
    every = client(s).get("/runs?all=1").text
    assert f'href="/runs/{system}"' in every and DELIVERY_TASK in every
    assert client(s).get(f"/runs/{system}").status_code == 200


def test_the_dashboards_event_stream_leaves_them_out_unless_asked(
    backend: Backend, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    """Its pages reload on the users' events; the Webhooks page asks for the deliveries' too."""
    with backend.open() as s:
        mine = s.start_run("noop")
        system = parked(s, "h")
    web = WebProcess(tmp_path, "--db", backend.url, "--port", "0")
    web_procs.append(web)
    plain = EventStreamClient(web.url(), "/events/stream?after=0")
    every = EventStreamClient(web.url(), "/events/stream?after=0&all=1")
    try:
        assert plain.event()["run_id"] == mine
        with backend.open() as s:
            later = s.start_run("noop")
        assert plain.event()["run_id"] == later, "the delivery's events in between: left out"
        got = [every.event()["run_id"] for _ in range(7)]
        assert got == [mine, *[system] * 5, later], got
    finally:
        plain.close()
        every.close()
    assert 'data-stream="/events/stream?all=1"' in client_page(backend, "/webhooks")


def client_page(backend: Backend, path: str) -> str:
    with backend.open() as s:
        return str(client(s).get(path).text)


# -- a database made before: its delivery runs move into the system's range ---------------------
OLD_STATE = {"cursor": 5, "delivered": 3, "last_delivery_at": 1.5, "failures": 0}


def old_sqlite(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database at schema v18 (before delivery runs were the system's) holding user run 1, then
    webhook h's delivery run 2 (its position in its state), a task, an event and a signal of
    it."""
    with monkeypatch.context() as m:
        m.setattr(sqlite_dialect, "SCHEMA_VERSION", 18)
        open_store(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(f"""
            BEGIN IMMEDIATE;
            INSERT INTO runs (id, state, task, queue, created_at, updated_at)
                VALUES (1, '{{}}', 'noop', 'default', 1, 1),
                       (2, '{json.dumps(OLD_STATE)}', '{DELIVERY_TASK}', '{WEBHOOK_QUEUE}', 1, 1);
            INSERT INTO tasks (run_id, name, payload, available_at, created_at)
                VALUES (1, 'noop', 'null', 1, 1), (2, '{DELIVERY_TASK}', '{{"webhook":"h"}}', 1, 1);
            INSERT INTO events (at, run_id, kind, task, data)
                VALUES (1, 1, 'run.enqueued', 'noop', '{{}}'),
                       (1, 2, 'run.enqueued', '{DELIVERY_TASK}', '{{}}');
            INSERT INTO signals (run_id, name, sent_at) VALUES (2, 'events', 1);
            INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
                                  backoff_max, timeout, created_at)
                VALUES ('h', '{URL}', NULL, '{SECRET}', 2, 20, 1, 600, 10, 1);
            COMMIT;""")  # fmt: skip
    finally:
        conn.close()


def old_postgres(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same at schema v18 (PostgreSQL's v12 before the shared history), its ids drawn as the
    old code drew them."""
    with monkeypatch.context() as m:
        m.setattr(admin, "SCHEMA_VERSION", 18)
        m.setattr("workerproc.store.postgres.dialect.SCHEMA_VERSION", 18)
        open_store(url).close()
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(
            """INSERT INTO runs (id, state, task, queue, created_at, updated_at, head_at,
                                 head_created, head_id)
               VALUES (1, '{}', 'noop', 'default', 1, 1, 1, 1, 101),
                      (2, %s, %s, %s, 1, 1, 1, 1, 102)""",
            (json.dumps(OLD_STATE), DELIVERY_TASK, WEBHOOK_QUEUE),
        )
        conn.execute(
            """INSERT INTO tasks (id, run_id, name, payload, available_at, created_at)
               VALUES (101, 1, 'noop', 'null', 1, 1), (102, 2, %s, '{"webhook":"h"}', 1, 1)""",
            (DELIVERY_TASK,),
        )
        conn.execute("SELECT setval(pg_get_serial_sequence('runs', 'id'), 2)")
        conn.execute("SELECT setval(pg_get_serial_sequence('tasks', 'id'), 102)")
        conn.execute(
            """INSERT INTO events (at, run_id, kind, task) VALUES (1, 1, 'run.enqueued', 'noop'),
               (1, 2, 'run.enqueued', %s)""",
            (DELIVERY_TASK,),
        )
        conn.execute("INSERT INTO signals (run_id, name, sent_at) VALUES (2, 'events', 1)")
        conn.execute(
            """INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
                                     backoff_max, timeout, created_at)
               VALUES ('h', %s, NULL, %s, 2, 20, 1, 600, 10, 1)""",
            (URL, SECRET),
        )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_delivery_runs_of_an_older_database_move_into_the_system_range(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "sqlite":
        url = str(tmp_path / "old.db")
        old_sqlite(url, monkeypatch)
    else:
        url = pg_session.schema_url("old")
        old_postgres(url, monkeypatch)
    with open_store(url) as s:  # migrated now
        (info,) = s.webhooks()
        moved = info.run_id
        assert moved == SYSTEM_RUNS + 1 and s.get_run(2) is None
        assert (info.cursor, info.delivered, info.last_delivery_at) == (5, 3, 1.5)
        assert [t.run_id for t in s.get_tasks(moved)] == [moved]
        assert [x.name for x in s.run_signals(moved)] == ["events"]
        assert [e.kind for e in s.events(run=moved)] == ["run.enqueued"]
        assert [e.run_id for e in s.events()] == [1], "its events are the system's now"
        assert [r.id for r in s.list_runs()] == [1]
        assert s.start_run("noop") == 3, "its old id is never given again"
        assert s.add_webhook("h2", URL, secret=SECRET).run_id == SYSTEM_RUNS + 2
        assert s.integrity_violations() == [] and s.check_integrity() == []
