"""Operators' bulk writes: ``retry_many``, ``cancel_many``, ``signal_many``: every run the
filter matches and only those (status, task, queue, age), one transaction per ``BULK`` runs,
the system's runs never touched, an empty filter refused, and each run changed as its single
call would change it."""

from __future__ import annotations

import pytest

from workerproc.store import CasResult, Commit
from workerproc.store.errors import InvalidOption
from workerproc.store.protocol import bulk

from .kit import Driver, last_word, verb


def failed(driver: Driver, task: str, queue: str = "default") -> int:
    """A run of ``task`` that failed (its handler gave up)."""
    run_id = driver.store.start_run(task, queue=queue)
    lease = driver.claim("w", queues=[queue])
    assert lease.run_id == run_id
    assert driver.commit(last_word(lease, "fail")) is CasResult.OK
    return run_id


@verb("retry_many")
def test_retry_many_retries_the_runs_the_filter_matches_and_only_those(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    old = failed(driver, "call")
    clock.advance(7200)
    calls = [failed(driver, "call"), failed(driver, "call", queue="gpu")]
    other = failed(driver, "render")
    cancelled = s.start_run("call")
    assert s.cancel_run(cancelled)
    live = s.start_run("call")
    assert s.retry_many(status="failed", task="call", since=3600) == 2
    assert [s.get_run(i).status for i in calls] == ["pending", "pending"]  # type: ignore[union-attr]
    assert {i: s.get_run(i).status for i in (old, other, cancelled, live)} == {  # type: ignore[union-attr]
        old: "failed", other: "failed", cancelled: "cancelled", live: "pending"}  # fmt: skip
    assert s.retry_many(status="cancelled", queue="default") == 1
    assert s.retry_many() == 2  # every failed run: old and other (the others are pending now)
    assert s.retry_many() == 0
    retried = [e.run_id for e in s.events() if e.kind == "run.retried"]
    assert sorted(retried) == sorted([*calls, cancelled, old, other])


@verb("cancel_many")
def test_cancel_many_cancels_live_runs_by_filter_and_refuses_an_empty_one(driver: Driver) -> None:
    s = driver.store
    held = driver.lease("digest")
    done = driver.lease("digest")
    assert driver.commit(last_word(done, "finish")) is CasResult.OK
    waiting = [s.start_run("digest") for _ in range(3)]
    other = s.start_run("render")
    with pytest.raises(InvalidOption, match="needs a filter"):
        s.cancel_many()
    with pytest.raises(InvalidOption, match="takes status"):
        s.cancel_many(status="failed")
    assert s.cancel_many(task="digest", status="pending") == 3
    assert {s.get_run(i).status for i in waiting} == {"cancelled"}  # type: ignore[union-attr]
    assert s.get_run(held.run_id).status == "running"  # type: ignore[union-attr]
    assert s.get_run(done.run_id).status == "succeeded"  # type: ignore[union-attr]
    assert s.cancel_many(task="digest") == 1  # the running one: its holder meets a conflict
    assert driver.finish(held) is CasResult.CONFLICT
    assert s.get_run(other).status == "pending"  # type: ignore[union-attr]
    assert s.cancel_many(every=True) == 1 and s.get_run(other).status == "cancelled"  # type: ignore[union-attr]


@verb("cancel_many")
def test_cancel_many_by_age_and_queue(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    old = s.start_run("t", queue="batch")
    clock.advance(3600)
    young = [s.start_run("t", queue="batch"), s.start_run("t")]
    assert s.cancel_many(since=600, queue="batch") == 1
    assert s.get_run(young[0]).status == "cancelled"  # type: ignore[union-attr]
    assert {s.get_run(i).status for i in (old, young[1])} == {"pending"}  # type: ignore[union-attr]
    with pytest.raises(InvalidOption, match="since"):
        s.cancel_many(since=float("nan"))


@verb("retry_many", "cancel_many")
def test_a_bulk_write_goes_a_batch_at_a_time_past_the_batch_size(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "BULK", 4)  # (the walk past a full batch, with few runs)
    s = driver.store
    ids = s.start_runs([{"task": "t"} for _ in range(10)])
    assert s.cancel_many(task="t") == 10
    assert s.retry_many(status="cancelled") == 10
    assert {s.get_run(i).status for i in ids} == {"pending"}  # type: ignore[union-attr]


@verb("signal_many")
def test_signal_many_signals_each_live_run_and_says_which(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("ask")
    assert driver.commit(last_word(lease, "wait")) is CasResult.OK  # waits for signal "go"
    kept = s.start_run("later")
    over = s.start_run("t")
    assert s.cancel_run(over)
    answer = s.signal_many([kept, 404, lease.run_id, over, kept], "go", {"ok": True})
    assert answer == {kept: True, 404: False, lease.run_id: True, over: False}
    assert list(answer) == [kept, 404, lease.run_id, over]  # in the order given, once each
    resumed = driver.claim("w2")
    assert resumed.run_id == lease.run_id and resumed.signal is not None
    assert resumed.signal.payload == {"ok": True}
    assert [x.name for x in s.run_signals(kept)] == ["go"]  # kept for its next wait
    assert s.run_signals(over) == []
    assert driver.commit(Commit(resumed, "drop")) is CasResult.OK
