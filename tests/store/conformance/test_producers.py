"""Producers (B7, B9): ``start_run``, ``start_runs``, ``wait``; and what every role has:
``get_run``, ``close``, ``now`` and ``url``."""

from __future__ import annotations

import threading

import pytest

from workerproc.store import InvalidPayload, RunNotFound, StoreError, open_store

from .kit import Driver, verb


@verb("start_run", "get_run")
def test_start_run_writes_a_pending_run_and_its_first_task(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    run_id = s.start_run("t", {"doc": 1}, {"n": 0}, 5, queue="q", priority=2)
    run = s.get_run(run_id)
    assert run is not None
    assert (run.status, run.state, run.revision, run.queue, run.priority, run.task) == (
        "pending", {"n": 0}, 0, "q", 2, "t")  # fmt: skip
    assert run.created_at == clock.now and run.finished_at is None and run.result is None
    (task,) = s.get_tasks(run_id)
    assert (task.name, task.payload, task.available_at) == ("t", {"doc": 1}, clock.now + 5)
    assert s.get_run(s.start_run("u")).state == {}  # type: ignore[union-attr]
    assert [e.kind for e in s.events(run=run_id)] == ["run.enqueued"]


@verb("start_run")
def test_a_key_makes_a_start_idempotent(driver: Driver) -> None:
    s = driver.store
    first = s.start_run("t", {"a": 1}, key="k1")
    assert s.start_run("t", {"a": 2}, key="k1") == first
    assert len(s.list_runs()) == 1 and s.get_run(first).key == "k1"  # type: ignore[union-attr]


@verb("start_run")
def test_start_run_refuses_bad_input_and_writes_nothing(driver: Driver) -> None:
    s = driver.store
    for call in (lambda: s.start_run(""), lambda: s.start_run("t", {"x": float("inf")}),
                 lambda: s.start_run("t", object()), lambda: s.start_run("t", delay=-1),
                 lambda: s.start_run("t", queue="bad queue"),
                 lambda: s.start_run("t", priority="high")):  # type: ignore[arg-type]  # fmt: skip
        with pytest.raises(InvalidPayload):
            call()
    assert s.list_runs() == [] and s.events() == []


@verb("start_run", "start_runs")
def test_no_run_of_an_app_takes_leasekeepers_own_task_or_queue(driver: Driver) -> None:
    """The webhooks' delivery lane claims its reserved queue apart, with slots of its own: a run
    of an app put there would hold a delivery slot, and one of the built-in task would be
    delivered by it. Both are refused, and nothing is written."""
    s = driver.store
    for call in (lambda: s.start_run("t", queue="leasekeeper.webhooks"),
                 lambda: s.start_run("t", queue="leasekeeper.mine"),
                 lambda: s.start_run("leasekeeper.webhook", {"webhook": "w"}),
                 lambda: s.start_runs([{"task": "t"},
                                       {"task": "t", "queue": "leasekeeper.x"}])):  # fmt: skip
        with pytest.raises(InvalidPayload, match="leasekeeper's own"):
            call()
    assert s.list_runs(system=True) == [] and s.events() == []
    assert s.get_run(s.start_run("t", queue="leasekeeperish")) is not None  # (only the prefix)


@verb("get_run")
def test_get_run_of_an_unknown_run_is_none(driver: Driver) -> None:
    assert driver.store.get_run(12345) is None


@verb("start_runs")
def test_start_runs_in_one_transaction_in_order(driver: Driver) -> None:
    s = driver.store
    ids = s.start_runs([{"task": "a"}, {"task": "b", "payload": [1], "key": "k"},
                        {"task": "c", "key": "k"}, {"task": "d", "queue": "q"}])  # fmt: skip
    assert ids[1] == ids[2] and len(set(ids)) == 3
    assert [s.get_run(i).task for i in ids] == ["a", "b", "b", "d"]  # type: ignore[union-attr]
    assert s.start_runs([]) == []


@verb("start_runs")
def test_start_runs_with_one_bad_item_starts_none(driver: Driver) -> None:
    s = driver.store
    for bad in ({"payload": 1}, {"task": "t", "colour": "red"}, {"task": "t", "delay": "soon"}):
        with pytest.raises(InvalidPayload):
            s.start_runs([{"task": "ok"}, bad])
    assert s.list_runs() == []


@verb("wait")
def test_wait_returns_the_ended_run(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    other = driver.open()
    done: list[object] = []
    waiter = threading.Thread(target=lambda: done.append(other.wait(lease.run_id, 30)))
    waiter.start()
    assert driver.finish(lease, {"r": 1}).value == "ok"
    waiter.join(30)
    (run,) = done
    assert run.status == "succeeded" and run.result == {"r": 1}  # type: ignore[attr-defined]
    assert s.wait(lease.run_id, 0).status == "succeeded"  # already over: at once


@verb("wait")
def test_wait_times_out_refuses_a_bad_timeout_and_an_unknown_run(driver: Driver) -> None:
    s = driver.store
    run_id = s.start_run("t")
    with pytest.raises(TimeoutError):
        s.wait(run_id, 0.05)
    with pytest.raises(RunNotFound):
        s.wait(999, 1)
    for bad in (-1, float("nan"), "soon"):
        with pytest.raises(ValueError):
            s.wait(run_id, bad)  # type: ignore[arg-type]


@verb("now")
def test_now_is_the_injected_clock(driver: Driver) -> None:
    assert driver.store.now() == driver.clock.now
    driver.clock.advance(7.5)
    assert driver.store.now() == driver.clock.now


@verb("url", "close")
def test_url_reopens_the_same_database_and_close_ends_the_store(driver: Driver) -> None:
    s = driver.store
    run_id = s.start_run("t")
    again = open_store(s.url)
    try:
        assert again.get_run(run_id) is not None
    finally:
        again.close()
    other = driver.open()
    other.close()
    other.close()  # twice is harmless
    assert s.get_run(run_id) is not None  # closing another store closes nothing of this one
    with pytest.raises(StoreError):
        open_store(s.url + ("&" if "?" in s.url else "?") + "bogus=1")
