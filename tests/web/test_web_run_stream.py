"""A run's stream on the dashboard (B21): ``GET /runs/{id}/stream`` on a real ``supervisor
web`` process, on both backends. Chunks arrive in offset order as they are written, a reset
as its own message; a reconnect with ``Last-Event-ID`` resumes after it, without a loss or a
repeat; the stream ends with ``end`` once the run is over; the run page shows the stream as it
stands; the token guards it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from event_stream import EventStreamClient
from helpers import wait_for
from web_process import WebProcess

from workerproc.store import CasResult, ClaimRequest, Commit, Lease, Store, open_store

TOKEN = "run-stream-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def chunk(stream: EventStreamClient) -> dict[str, Any]:
    """The next chunk's message (comments and the retry line skipped)."""
    while True:
        fields = stream.message()
        assert fields, "the stream ended"
        if "data" in fields:
            doc: dict[str, Any] = json.loads(fields["data"])
            if fields["event"] != "end":
                assert fields["id"] == str(doc["offset"]) and fields["event"] == doc["kind"]
            return {**doc, "event": fields["event"]} if isinstance(doc, dict) else fields


def leased(store: Store, owner: str = "w1", ttl: float = 60.0) -> Lease:
    found = store.commit_many([], claim=ClaimRequest(owner, ttl)).leases
    assert found
    return found[0]


def test_chunks_arrive_live_a_reconnect_resumes_and_the_end_ends_it(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    with open_store(db) as store:
        run_id = store.start_run("answer")
        lease = leased(store)
        last = store.append_stream(lease, ['"hello "']).last
        web = WebProcess(tmp_path, "--db", db, "--port", "0", "--token", TOKEN)
        web_procs.append(web)
        path = f"/runs/{run_id}/stream"
        refused = EventStreamClient(web.url(), path)
        assert refused.status == 401  # behind the dashboard's token
        refused.close()
        stream = EventStreamClient(web.url(), path, AUTH)
        assert stream.status == 200
        assert stream.response.getheader("content-type", "").startswith("text/event-stream")
        first = chunk(stream)
        assert (first["offset"], first["kind"], first["data"]) == (1, "data", "hello ")
        last = store.append_stream(lease, ['"world"', '{"n": 1}'], after=last).last
        assert [chunk(stream)["data"] for _ in range(2)] == ["world", {"n": 1}]
        stream.close()
        # written while nobody listened: a reconnect after offset 2 gets 3, then what comes
        store.append_stream(lease, ['"!"'], after=last)
        again = EventStreamClient(web.url(), path, {**AUTH, "Last-Event-ID": "2"})
        assert [chunk(again)["offset"] for _ in range(2)] == [3, 4]
        assert store.commit_many([Commit(lease, "finish", result=None)]).results == (CasResult.OK,)
        end = chunk(again)
        assert end["event"] == "end" and json.loads(end["data"]) == "succeeded"
        assert again.message() == {}  # and the response ends
        again.close()
        status, page = web.get(f"/runs/{run_id}", AUTH)
        assert status == 200 and "hello world" in page and 'data-run-stream="/runs/' in page
        assert web.get("/runs/999/stream", AUTH)[0] == 404


def test_a_takeover_is_a_reset_message_before_the_new_attempts_chunks(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    with open_store(db) as store:
        run_id = store.start_run("answer")
        old = leased(store, "zombie", ttl=0.5)
        store.append_stream(old, ['"draft"'])
        web = WebProcess(tmp_path, "--db", db, "--port", "0")
        web_procs.append(web)
        stream = EventStreamClient(web.url(), f"/runs/{run_id}/stream")
        assert chunk(stream)["data"] == "draft"
        new = wait_for(  # once the zombie's lease ran out (the database's clock)
            lambda: next(iter(store.commit_many([], claim=ClaimRequest("w2", 60.0)).leases), None),
            timeout=30, what="the takeover",
        )  # fmt: skip
        assert store.append_stream(old, ['"late"']).outcome == "lost"
        store.append_stream(new, ['"final"'])
        reset, final = chunk(stream), chunk(stream)
        assert (reset["kind"], reset["attempt"]) == ("reset", new.attempt)
        assert (final["data"], final["attempt"]) == ("final", new.attempt)
        stream.close()
