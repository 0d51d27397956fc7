"""Fork from a step (B24) on every driver: a new run begins at step N of another run with the
state (and queue) that step was entered with, or a state given; the source is left exactly as
it was; what cannot be forked is refused with nothing written; the async store forks alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from workerproc.store import (
    ClaimRequest,
    Commit,
    InvalidOption,
    InvalidPayload,
    RunNotFound,
    TaskOptions,
)
from workerproc.store import open_async_store as open_async
from workerproc.store.errors import ForkRefused
from workerproc.store.limits import LimitSpec
from workerproc.store.protocol.forks import MAX_STEP
from workerproc.store.types import JSON

from .kit import TTL, Driver, last_word, verb


def three_steps(driver: Driver, *, fail: bool = True) -> int:
    """A run of three steps (a, b in queue q2, c), each entered with state {"n": step - 1},
    its last step failed (or left pending)."""
    s, clock = driver.store, driver.clock
    run_id = s.start_run("a", {"p": 1}, {"n": 0}, priority=5)
    for n, (name, queue) in enumerate((("b", "q2"), ("c", None)), start=1):
        clock.advance(1)
        lease = driver.claim()
        advance = Commit(lease, "advance", expected_revision=n - 1, new_state={"n": n},
                         next_task=name, next_payload={"p": n + 1}, next_queue=queue)  # fmt: skip
        assert driver.commit(advance).value == "ok"
    if fail:
        clock.advance(1)
        lease = driver.claim()
        assert lease.task == "c"
        assert driver.commit(Commit(lease, "fail", reason="gave_up", error="boom")).value == "ok"
    return run_id


def snapshot(driver: Driver, run_id: int) -> tuple[Any, ...]:
    """Everything the store shows of a run: a fork must leave every part as it was."""
    s = driver.store
    return (s.get_run(run_id), s.get_tasks(run_id), s.attempt_history(run_id),
            s.events(after=0, run=run_id, limit=1000), s.paid_calls(run_id),
            s.run_rejections(run_id))  # fmt: skip


@verb("fork")
def test_a_fork_begins_at_the_step_with_what_it_was_entered_with(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    source = three_steps(driver)
    before = snapshot(driver, source)
    totals = s.stats()
    clock.advance(5)
    new = s.fork(source, from_step=2)
    assert new != source
    run = s.get_run(new)
    assert run is not None
    assert (run.status, run.state, run.revision, run.task) == ("pending", {"n": 1}, 0, "b")
    assert (run.queue, run.priority, run.key, run.result) == ("q2", 5, None, None)
    (task,) = s.get_tasks(new)
    assert (task.name, task.payload, task.attempts) == ("b", {"p": 2}, 0)
    assert task.available_at == pytest.approx(clock()) and run.created_at == pytest.approx(clock())
    kinds = [(e.kind, e.data) for e in s.events(after=0, run=new)]
    assert kinds == [("run.enqueued", {"queue": "q2"}),
                     ("run.forked", {"from_run": source, "from_step": 2})]  # fmt: skip
    assert snapshot(driver, source) == before  # not a column, not an event of the source
    counts = s.stats().runs
    assert (counts.get("failed"), counts.get("pending")) == (totals.runs.get("failed"), 1)
    # the new run is due now and runs on from there: b, then c, then it succeeds
    lease = driver.claim(queues=("q2",))
    assert (lease.run_id, lease.task, lease.state) == (new, "b", {"n": 1})
    nxt = Commit(lease, "advance", new_state={"n": 2}, next_task="c", next_payload={"p": 3})
    assert driver.commit(nxt).value == "ok"
    lease = driver.claim(queues=("q2",))
    assert (lease.run_id, lease.task) == (new, "c")
    done = Commit(lease, "finish", expected_revision=1, new_state={"n": 3}, result={"ok": 1})
    assert driver.commit(done).value == "ok"
    run = s.get_run(new)
    assert run is not None and (run.status, run.state) == ("succeeded", {"n": 3})
    assert [t.name for t in s.get_tasks(new)] == ["b", "c"]  # steps b and c only
    assert snapshot(driver, source) == before


@verb("fork")
def test_a_state_given_replaces_the_step_s_and_each_step_keeps_its_own(driver: Driver) -> None:
    s = driver.store
    source = three_steps(driver)
    first = s.get_run(s.fork(source, 1))
    assert first is not None and (first.state, first.queue, first.task) == ({"n": 0}, "default",
                                                                           "a")  # fmt: skip
    third = s.get_run(s.fork(source, 3))
    assert third is not None and (third.state, third.queue) == ({"n": 2}, "q2")
    given = s.get_run(s.fork(source, 3, state={"fixed": [1, 2]}))
    assert given is not None and given.state == {"fixed": [1, 2]}
    forked = s.fork(source, 2)
    again = s.get_run(s.fork(forked, 1))  # a fork forks like any run: its step 1 is b
    assert again is not None and (again.state, again.task, again.queue) == ({"n": 1}, "b", "q2")


@verb("fork")
def test_a_live_run_forks_too_and_goes_on_untouched(driver: Driver) -> None:
    s = driver.store
    source = three_steps(driver, fail=False)  # on step c, not yet claimed
    before = snapshot(driver, source)
    new = s.fork(source, 3)
    assert snapshot(driver, source) == before
    got = {lease.run_id for lease in s.claim("w", TTL, limit=5)}
    assert got == {source, new}  # both due, each its own run


@verb("fork")
def test_what_cannot_be_forked_is_refused_and_nothing_is_written(driver: Driver) -> None:
    s = driver.store
    source = three_steps(driver)
    before = (s.list_runs(limit=1000), s.last_event_id())
    with pytest.raises(RunNotFound):
        s.fork(source + 1000, 1)
    with pytest.raises(RunNotFound):
        s.fork("1", 1)  # type: ignore[arg-type]
    with pytest.raises(ForkRefused, match=r"never entered step 4 \(it entered 3 steps\)"):
        s.fork(source, 4)
    for bad in (0, -1, True, "2", 2.0, MAX_STEP + 1):
        with pytest.raises(InvalidOption, match="a fork's step"):
            s.fork(source, bad)  # type: ignore[arg-type]
    deep: JSON = []
    for _ in range(200):
        deep = [deep]
    for state in (deep, {"x": "y" * (9 << 20)}, {"x": float("nan")}):
        with pytest.raises(InvalidPayload, match="the fork's state"):
            s.fork(source, 2, state=state)
    assert (s.list_runs(limit=1000), s.last_event_id()) == before


@verb("fork")
def test_a_step_entered_before_inputs_were_kept_needs_a_state(driver: Driver) -> None:
    s = driver.store
    source = three_steps(driver)
    driver.backend.tamper("UPDATE tasks SET input_state = NULL, input_queue = NULL")
    with pytest.raises(ForkRefused, match="give the state to fork with"):
        s.fork(source, 2)
    new = s.get_run(s.fork(source, 2, state={"n": 1}))
    assert new is not None and (new.state, new.queue) == ({"n": 1}, "q2")  # the run's queue


@verb("fork")
def test_a_fork_of_a_gated_task_joins_its_line(driver: Driver) -> None:
    s = driver.store
    assert s.declare_limits({"api": LimitSpec.declare("api", concurrency=1)}, by="here") == []
    s.register_tasks({"b": TaskOptions(limits=("api",))})
    source = three_steps(driver)
    new = s.fork(source, 2)
    (info,) = s.limits()
    assert (info.in_use, info.waiting) == (0, 1)  # in the line of its limit, as a start is
    got = driver.exchange(claim=ClaimRequest("w", TTL, limit=5)).leases
    assert [(lease.run_id, lease.task) for lease in got] == [(new, "b")]
    assert s.limits()[0].in_use == 1


@verb("AsyncStore.fork")
def test_the_async_store_forks_as_the_store_does(driver: Driver) -> None:
    s = driver.store
    source = three_steps(driver)
    before = snapshot(driver, source)

    async def body() -> int:
        async with await open_async(driver.backend.url, clock=driver.clock) as a:
            with pytest.raises(RunNotFound):
                await a.fork(source + 1000, 1)
            with pytest.raises(ForkRefused):
                await a.fork(source, 9)
            with pytest.raises(InvalidOption):
                await a.fork(source, 0)
            return await a.fork(source, 2, state={"async": True})

    new = asyncio.run(body())
    run = s.get_run(new)
    assert run is not None and (run.state, run.task, run.queue) == ({"async": True}, "b", "q2")
    assert [e.kind for e in s.events(after=0, run=new)] == ["run.enqueued", "run.forked"]
    assert snapshot(driver, source) == before


@verb("fork")
def test_a_step_a_signal_resumed_forks_without_the_signal(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("draft", state={"n": 0})
    assert driver.commit(last_word(lease, "wait")).value == "ok"  # waits for signal:go
    s.signal(lease.run_id, "go", {"ok": True})
    resumed = driver.claim()
    assert resumed.task == "resume" and resumed.signal is not None
    new = s.fork(lease.run_id, 2)
    forked = driver.claim("w2")
    assert (forked.run_id, forked.task, forked.signal) == (new, "resume", None)
    assert forked.state == resumed.state  # what the wait commit wrote, as step 2 was entered
