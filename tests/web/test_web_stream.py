"""The dashboard's event stream: ``GET /events/stream`` on a real
``supervisor web`` process, on both backends. Events arrive in commit order; a reconnect with
``Last-Event-ID`` resumes without losing one; ``?run=`` keeps one run's; streams beyond
``--max-streams`` get 503; a TERM with a stream open stops the dashboard at once (the stream
ends cleanly, uvicorn never waits out its graceful timeout); the token guards the stream too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from event_stream import EventStreamClient
from helpers import wait_for
from web_helpers import client
from web_process import WebProcess

from supervisor.web.connections import PER_CLIENT
from supervisor.web.stream import KEEPALIVE, PER_CLIENT_STREAMS
from workerproc.store import CasResult, Commit, Store, open_store
from workerproc.store.codec import WAIT_FOREVER
from workerproc.store.newrun import NewRun
from workerproc.store.protocol.events import KINDS

TOKEN = "stream-token-0123456789"


@pytest.fixture
def db(db: str) -> str:
    """The database (each backend), with one event written before the dashboard starts."""
    url = db
    with open_store(url) as store:
        store.start_run("before")
    return url


def serve(tmp_path: Path, web_procs: list[WebProcess], db: str, *args: str) -> WebProcess:
    web = WebProcess(tmp_path, "--db", db, "--port", "0", *args)
    web_procs.append(web)
    web.url()
    return web


def test_the_newest_event_id(s: Store) -> None:
    assert s.last_event_id() == 0
    s.start_runs([{"task": "a"}, {"task": "b"}])
    assert s.last_event_id() == s.events()[-1].id


def test_events_arrive_in_order_and_a_reconnect_resumes(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    web = serve(tmp_path, web_procs, db)
    with open_store(db) as store:
        stream = EventStreamClient(web.url())
        assert stream.status == 200
        assert stream.response.getheader("content-type", "").startswith("text/event-stream")
        first = stream.message()  # no cursor given: it starts at the newest event
        assert first["id"] == str(store.last_event_id()) and first["retry"] == "5000"
        runs = store.start_runs([{"task": f"t{i}"} for i in range(3)])
        store.cancel_run(runs[1])
        got = [stream.event() for _ in range(4)]
        assert [(e["run_id"], e["kind"]) for e in got] == [
            *((r, "run.enqueued") for r in runs), (runs[1], "run.cancelled")]  # fmt: skip
        assert [e["id"] for e in got] == sorted(e["id"] for e in got)
        assert got == [
            {"id": e.id, "at": e.at, "run_id": e.run_id, "kind": e.kind, "task": e.task,
             "attempt": e.attempt, "data": e.data}
            for e in store.events(after=int(first["id"]))
        ]  # fmt: skip
        stream.close()
        # gone for a while: what commits meanwhile comes with the reconnect, nothing twice
        later = store.start_runs([{"task": "x"}, {"task": "y"}])
        again = EventStreamClient(web.url(), "/events/stream?after=0",
                                  {"Last-Event-ID": str(got[-1]["id"])})  # fmt: skip
        assert [again.event()["run_id"] for _ in range(2)] == later
        again.close()
        # one run's events only, from ?after=
        mine = EventStreamClient(web.url(), f"/events/stream?run={runs[2]}&after=0")
        assert mine.event()["run_id"] == runs[2]
        store.cancel_run(later[0])
        store.cancel_run(runs[2])
        last = mine.event()
        assert (last["run_id"], last["kind"]) == (runs[2], "run.cancelled")
        mine.close()
    assert web.stop() == 0
    assert "Traceback" not in web.stderr()


def test_streams_beyond_the_cap_get_503(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    web = serve(tmp_path, web_procs, db, "--max-streams", "2")
    held = [EventStreamClient(web.url()) for _ in range(2)]
    assert [s.status for s in held] == [200, 200] and all(s.message() for s in held)
    over = EventStreamClient(web.url())
    assert over.status == 503 and over.response.getheader("retry-after") == "30"
    assert "--max-streams" in over.response.read().decode()
    assert web.get("/runs")[0] == 200  # the pages answer beside them
    held.pop().close()

    def admitted() -> bool:
        probe = EventStreamClient(web.url())
        if probe.status == 200:
            held.append(probe)
            return True
        probe.close()
        return False

    wait_for(admitted, timeout=30, interval=0.2, what="a stream admitted once one closed")
    for stream in held:
        stream.close()
    assert web.stop() == 0


def test_one_client_holds_at_most_half_its_connections_in_streams(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    """The connection guard never closes a busy connection: were a client's streams allowed to
    fill its PER_CLIENT connections, its next page could find no room."""
    web = serve(tmp_path, web_procs, db)
    held = [EventStreamClient(web.url()) for _ in range(PER_CLIENT_STREAMS)]
    assert {s.status for s in held} == {200}
    over = EventStreamClient(web.url())
    assert over.status == 503 and "this client holds" in over.response.read().decode()
    assert PER_CLIENT_STREAMS < PER_CLIENT and web.get("/runs")[0] == 200
    for stream in held:
        stream.close()
    assert web.stop() == 0


@pytest.mark.e2e
@pytest.mark.slow
def test_a_quiet_stream_sends_a_keep_alive_comment(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    web = serve(tmp_path, web_procs, db)
    stream = EventStreamClient(web.url(), timeout=KEEPALIVE * 4)
    assert "id" in stream.message()
    started = time.monotonic()
    assert stream.message() == {"comment": "keep-alive"}
    assert time.monotonic() - started >= KEEPALIVE * 0.9
    stream.close()


def test_no_stream_at_all_with_max_streams_0(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    web = serve(tmp_path, web_procs, db, "--max-streams", "0")
    assert web.get("/events/stream")[0] == 503
    assert web.stop() == 0


def test_term_with_a_stream_open_stops_at_once(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    web = serve(tmp_path, web_procs, db)
    stream = EventStreamClient(web.url(), "/events/stream?after=0")
    assert stream.event()["task"] == "before"
    started = time.monotonic()
    assert web.stop() == 0
    took = time.monotonic() - started
    assert stream.message() == {}  # the stream ended cleanly: EOF, not a reset
    stream.close()
    # uvicorn's graceful timeout (5 s) was never waited out: nothing had to be cancelled
    assert "timeout graceful shutdown exceeded" not in web.stderr()
    assert "Traceback" not in web.stderr()
    assert took < 30


@pytest.mark.parametrize("query", ["after=-1", "after=x", "run=1e3", "after=99999999999999999999"])
def test_bad_positions_are_400(
    db: str, tmp_path: Path, web_procs: list[WebProcess], query: str
) -> None:
    web = serve(tmp_path, web_procs, db)
    assert web.get(f"/events/stream?{query}")[0] == 400
    assert web.get("/events/stream", {"Last-Event-ID": "nope"})[0] == 400


def test_the_token_guards_the_stream(db: str, tmp_path: Path, web_procs: list[WebProcess]) -> None:
    web = WebProcess(tmp_path, "--db", db, "--port", "0", env={"SUPERVISOR_WEB_TOKEN": TOKEN})
    web_procs.append(web)
    assert web.get("/events/stream")[0] == 401
    stream = EventStreamClient(web.url(), headers={"Authorization": f"Bearer {TOKEN}"})
    assert stream.status == 200 and stream.message()
    stream.close()


def test_each_live_part_names_its_stream_and_the_kinds_it_refetches_on(s: Store) -> None:
    parent = s.start_run("fan_out")
    lease = s.claim("w", 60)
    assert lease is not None
    kids = (NewRun.make("kid", 1, None, 0, None, "default", 0),)
    spawn = Commit(lease, "spawn", expected_revision=0, new_state={}, next_task="merge",
                   delay=WAIT_FOREVER, children=kids)  # fmt: skip
    assert s.commit_many([spawn]).results == (CasResult.OK,)
    c = client(s)
    kinds = f'data-kinds="{" ".join(sorted(KINDS))}"'
    for path in ("/", "/runs", "/leases", "/limits"):
        assert f'data-stream="/events/stream" {kinds}' in c.get(path).text, path
    assert f'data-stream="/events/stream?run={parent + 1}"' in c.get(f"/runs/{parent + 1}").text
    # a parent's page draws its children, whose events are not its own: it reads them all
    assert 'data-stream="/events/stream" ' in c.get(f"/runs/{parent}").text
    assert "data-stream" not in c.get("/chaos").text  # a file, not the database
    assert "data-stream" not in client(s, max_streams=0).get("/runs").text


def test_an_open_stream_ends_once_its_database_file_is_deleted(
    tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    """As every page answers 503 then: an open SQLite connection keeps reading a deleted file,
    so a stream left open would show a database that is no longer there."""
    db = str(tmp_path / "lk.db")
    open_store(db).close()
    web = serve(tmp_path, web_procs, db)
    stream = EventStreamClient(web.url(), timeout=30)
    assert "id" in stream.message()
    for suffix in ("", "-wal", "-shm"):
        Path(db + suffix).unlink(missing_ok=True)
    started = time.monotonic()
    assert stream.message() == {}, "the stream ended"
    assert time.monotonic() - started < 20  # within a check or two, not a keep-alive or more
    assert web.get("/events/stream")[0] == 503
    assert web.stop() == 0
