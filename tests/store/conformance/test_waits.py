"""Runs that wait (B14): ``signal``, ``run_signals``, ``run_children``."""

from __future__ import annotations

import pytest

from workerproc.store import CasResult, Commit, InvalidPayload, RunNotFound, RunOver
from workerproc.store.newrun import NewRun

from .kit import Driver, last_word, verb


@verb("signal", "run_signals")
def test_a_signal_resumes_the_wait_that_waits_for_it(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    assert driver.commit(last_word(lease, "wait")) is CasResult.OK
    other = s.signal(lease.run_id, "other", {"x": 0})  # kept: no wait takes it
    assert s.next_ready_at() is not None and s.next_ready_at() > driver.clock.now  # type: ignore[operator]
    sid = s.signal(lease.run_id, "go", {"x": 1})
    resumed = driver.claim("w2")
    assert resumed.task == "resume" and resumed.signal is not None
    assert (resumed.signal.name, resumed.signal.payload) == ("go", {"x": 1})
    shown = s.run_signals(lease.run_id)
    assert [(i.id, i.name, i.task_id) for i in shown] == [
        (sid, "go", resumed.task_id), (other, "other", None)]  # fmt: skip
    assert len(s.run_signals(lease.run_id, limit=1)) == 1


@verb("signal")
def test_a_signal_sent_before_the_wait_is_kept_for_it(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    s.signal(lease.run_id, "go", 5)
    assert driver.commit(last_word(lease, "wait")) is CasResult.OK
    resumed = driver.claim("w2")
    assert resumed.signal is not None and resumed.signal.payload == 5


@verb("signal")
def test_signal_to_an_unknown_or_finished_run_or_with_bad_values(driver: Driver) -> None:
    s = driver.store
    with pytest.raises(RunNotFound):
        s.signal(999, "go")
    lease = driver.lease("t")
    assert driver.finish(lease) is CasResult.OK
    with pytest.raises(RunOver):
        s.signal(lease.run_id, "go")
    live = s.start_run("u")
    with pytest.raises(InvalidPayload):
        s.signal(live, "", None)
    with pytest.raises(InvalidPayload):
        s.signal(live, "go", object())
    assert s.run_signals(live) == [] and s.run_signals(999) == []


@verb("run_children")
def test_run_children_lists_a_spawns_children_in_order(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("parent")
    kids = tuple(NewRun.make(f"kid{i}", i, None, 0, None, "default", 0) for i in range(3))
    spawn = Commit(lease, "spawn", next_task="join", delay=100.0, children=kids)
    assert driver.commit(spawn) is CasResult.OK
    children = s.run_children(lease.run_id)
    assert [(c[1], c[2]) for c in children] == [("pending", f"kid{i}") for i in range(3)]
    assert len(s.run_children(lease.run_id, limit=2)) == 2
    for run_id, _, _ in children:
        child = driver.claim("w2")
        assert child.run_id == run_id and child.parent_id == lease.run_id
        assert driver.finish(child, {"c": run_id}) is CasResult.OK
    join = driver.claim("w3")  # the last child's end made the join due
    assert join.task == "join" and join.children is not None
    assert [c.result for c in join.children] == [{"c": c[0]} for c in children]
    assert s.run_children(999) == []
