"""Cursors cannot pass the newest event, on every backend: a named
consumer's acknowledgement (``ack_events``, sync and async) and a webhook's start (``add_webhook``,
``supervisor webhooks add --after``) above the newest event's id are refused with one clear
line; a cursor there would skip, for ever, the events that take those ids later."""

from __future__ import annotations

import asyncio

import pytest
from cli_runner import invoke
from store_backends import Backend

from supervisor import exitcodes
from workerproc.store import InvalidOption, Store, open_async_store


def test_an_acknowledgement_past_the_newest_event_is_refused(s: Store) -> None:
    with pytest.raises(InvalidOption, match=r"upto 1 is past the newest event \(0\)"):
        s.ack_events("billing", 1)  # no event at all yet
    assert s.ack_events("billing", 0) == 0
    s.start_runs([{"task": "t"} for _ in range(3)])
    # (on PostgreSQL the events are not numbered yet: the check numbers them first)
    newest = 3
    assert s.ack_events("billing", newest) == newest
    for past in (newest + 1, 10**12):
        with pytest.raises(InvalidOption, match=f"upto {past} is past the newest event"):
            s.ack_events("billing", past)
    assert s.consumer_position("billing") == newest  # nothing moved
    with pytest.raises(InvalidOption, match="is past the newest event"):
        s.ack_events("new", 10**12)  # nor is a new consumer created there
    assert s.consumer_position("new") == 0
    assert [e.id for e in s.events(consumer="billing")] == []
    s.start_run("t")
    assert [e.kind for e in s.events(consumer="billing")] == ["run.enqueued"]


def test_the_async_store_refuses_it_too(backend: Backend) -> None:
    backend.open().close()  # the schema

    async def main() -> None:
        store = await open_async_store(backend.url)
        try:
            await store.start_run("t")
            assert await store.ack_events("c", 1) == 1
            with pytest.raises(InvalidOption, match=r"upto 2 is past the newest event \(1\)"):
                await store.ack_events("c", 2)
            assert await store.consumer_position("c") == 1
        finally:
            await store.close()

    asyncio.run(main())


def test_a_webhook_cannot_start_past_the_newest_event(s: Store) -> None:
    s.start_runs([{"task": "t"} for _ in range(2)])
    with pytest.raises(InvalidOption, match=r"after 3 is past the newest event \(2\)"):
        s.add_webhook("h", "https://example.test/h", secret="x", after=3)
    assert s.webhooks() == [] and s.stats().runs.get("leasekeeper.webhooks") is None
    hook = s.add_webhook("h", "https://example.test/h", secret="x", after=2)
    assert hook.position == 2


def test_webhooks_add_after_past_the_newest_is_one_line(backend: Backend) -> None:
    with backend.open() as store:
        store.start_run("t")
    result = invoke("webhooks", "add", "h", "https://x/", "--db", backend.url,
                    "--after", "999999999999")  # fmt: skip
    assert result.exit_code == exitcodes.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "after 999999999999 is past the newest event (1)" in lines[0]
    with backend.open() as store:
        assert store.webhooks() == []
    ok = invoke("webhooks", "add", "h", "https://x/", "--db", backend.url, "--after", "1")
    assert ok.exit_code == 0, ok.output
