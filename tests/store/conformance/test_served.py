"""A claim serves only the tasks its claimer has handlers for (B22): a run whose next task is
none of them is left where it is (no lease, no attempt spent) for a worker that serves it, on
the plain walk and through a limit's line alike; the worker list keeps what each worker serves
(``worker_seen``, ``workers``), which ``unserved`` reads back as "no worker serves task X"."""

from __future__ import annotations

import dataclasses

import pytest

from workerproc.store import ClaimRequest, InvalidPayload, TaskOptions, WorkerInfo
from workerproc.store.limits import LimitSpec

from .kit import TTL, Driver, last_word, verb


@verb("commit_many")
def test_a_claim_passes_over_runs_of_tasks_it_does_not_serve(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    new = s.start_run("summarize_v2", {"n": 1})  # started by a newer release
    clock.advance(1)
    old = s.start_run("summarize", {"n": 2})
    assert s.claim("old-worker", TTL, limit=5, tasks=["summarize"]) != []
    (task,) = s.get_tasks(new)
    assert (task.lease_owner, task.attempts) == (None, 0)  # untouched: no attempt spent
    assert s.claim("old-worker", TTL, limit=5, tasks=["summarize"]) == []
    lease = s.claim("new-worker", TTL, tasks=["summarize", "summarize_v2"])
    assert lease is not None and (lease.run_id, lease.task) == (new, "summarize_v2")
    assert s.get_run(old).status == "running"  # type: ignore[union-attr]
    assert s.claim("anyone", TTL, tasks=[]) is None  # serves nothing: claims nothing


@verb("commit_many")
def test_the_filter_reads_the_run_s_next_task_not_its_first(driver: Driver) -> None:
    s = driver.store
    run_id = s.start_run("fetch")
    lease = s.claim("w", TTL, tasks=["fetch"])
    assert lease is not None
    commit = dataclasses.replace(last_word(lease, "advance"), next_task="render")
    s.commit_many((commit,))
    assert s.claim("w", TTL, tasks=["fetch"]) is None  # its next task is another one
    nxt = s.claim("w", TTL, tasks=["fetch", "render"])
    assert nxt is not None and (nxt.run_id, nxt.task) == (run_id, "render")


@verb("commit_many", "declare_limits")
def test_a_gated_run_of_an_unserved_task_stays_in_its_line(driver: Driver) -> None:
    s = driver.store
    limit = LimitSpec.declare("api", concurrency=5)
    assert s.declare_limits({"api": limit}, by="here") == []
    s.register_tasks(
        {"call": TaskOptions(limits=("api",)), "call_v2": TaskOptions(limits=("api",))}
    )
    new = s.start_run("call_v2")
    old = s.start_run("call")
    got = driver.exchange(claim=ClaimRequest("old", TTL, limit=5, tasks=("call",))).leases
    assert [lease.run_id for lease in got] == [old]
    assert driver.exchange(claim=ClaimRequest("old", TTL, limit=5, tasks=("call",))).leases == ()
    (task,) = s.get_tasks(new)
    assert task.attempts == 0
    got = driver.exchange(claim=ClaimRequest("new", TTL, limit=5, tasks=("call_v2",))).leases
    assert [lease.run_id for lease in got] == [new]
    assert (s.limits()[0].in_use, s.limits()[0].waiting) == (2, 0)  # each counted once


@verb("worker_seen", "workers")
def test_the_worker_list_keeps_what_each_worker_serves(driver: Driver) -> None:
    s = driver.store
    info = WorkerInfo("host:1:1.0:w", "host", 1, 1_000_000.0, 5.0, 4, None, "9.9")
    s.worker_seen(dataclasses.replace(info, tasks=("a", "b")), starting=True)
    s.worker_seen(dataclasses.replace(info, owner="host:2:1.0:w"))  # an older worker: any
    assert [w.tasks for w in s.workers()] == [("a", "b"), None]
    with pytest.raises(InvalidPayload):
        s.worker_seen(dataclasses.replace(info, tasks=("bad\x00name",)))


@verb("unserved")
def test_a_due_run_the_live_workers_do_not_serve_is_told_as_such(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    old = s.start_run("summarize", {"n": 1})
    new = s.start_run("summarize_v2", {"n": 2}, queue="batch")
    later = s.start_run("summarize_v2", {"n": 3}, delay=60)
    everything = [old, new, later]
    assert s.unserved(everything) == {}  # no worker runs: the pool is down, the runs pending
    info = WorkerInfo("host:1:1.0:old", "host", 1, 1_000_000.0, 5.0, 4, None, "9.9",
                      tasks=("summarize",))  # fmt: skip
    s.worker_seen(info, starting=True)
    assert s.unserved(everything) == {new: "no worker serves task summarize_v2"}
    s.worker_seen(dataclasses.replace(info, owner="host:2:1.0:new", queues=("default",),
                                      tasks=("summarize", "summarize_v2")))  # fmt: skip
    assert s.unserved(everything) == {new: "no worker serves task summarize_v2"}  # (its queue)
    s.worker_seen(dataclasses.replace(info, owner="host:3:1.0:any", tasks=None))  # any task
    assert s.unserved(everything) == {}
    lease = s.claim("w", TTL, tasks=["summarize"])
    assert lease is not None and lease.run_id == old
    clock.advance(16)  # every worker silent for three of its periods: none is live
    assert s.unserved(everything) == {}
    s.worker_seen(info)  # the old release's worker beats again
    assert s.unserved(everything) == {new: "no worker serves task summarize_v2"}  # (old: held)
    s.worker_seen(dataclasses.replace(info, owner="host:3:1.0:any", tasks=None, state="draining"))
    assert new in s.unserved(everything)  # a draining worker claims nothing more
    assert s.unserved([]) == {}


@verb("unserved")
def test_a_pool_judges_its_own_tasks_without_the_worker_list(driver: Driver) -> None:
    """A pool's drain asks with its own tasks: its workers may not have listed themselves yet,
    and another pool's live workers say nothing of what this one serves."""
    s = driver.store
    mine, other = s.start_run("noop"), s.start_run("render")
    info = WorkerInfo("host:1:1.0:gpu", "host", 1, 1_000_000.0, 5.0, 4, None, "9.9",
                      tasks=("render",))  # fmt: skip
    s.worker_seen(info, starting=True)  # another pool's worker, serving another task
    assert s.unserved([mine, other]) == {mine: "no worker serves task noop"}
    assert s.unserved([mine, other], tasks=["noop"]) == {other: "no worker serves task render"}
    assert s.unserved([mine, other], tasks=["noop", "render"]) == {}


@verb("pending_ids")
def test_the_newest_pending_ids_of_the_queues_asked(driver: Driver) -> None:
    s = driver.store
    first = s.start_run("t", {})
    other = s.start_run("t", {}, queue="batch")
    last = s.start_run("t", {})
    done = s.start_run("t", {}, queue="batch")
    lease = s.claim("w", TTL, queues=["batch"])
    assert lease is not None and lease.run_id == other
    s.ack(lease)
    assert s.pending_ids() == [done, last, first]  # newest first; an ended run is not pending
    assert s.pending_ids(2) == [done, last]
    assert s.pending_ids(queues=["default"]) == [last, first]
    assert s.pending_ids(queues=["batch", "default"], limit=1) == [done]
    assert s.pending_ids(queues=[]) == []
    assert s.pending_ids(0) == []
    with pytest.raises(ValueError):
        s.pending_ids(queues=["bad\x00queue"])
