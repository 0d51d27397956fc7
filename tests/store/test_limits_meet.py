"""Limits where they meet other features: every way a run comes back into a limited
task's line leaves the line open to it."""

from __future__ import annotations

from collections import Counter

from cli_runner import invoke
from helpers import FakeClock
from store_backends import Backend

from workerproc.store import Commit, Lease, Store, TaskOptions
from workerproc.store.limits import LimitSpec
from workerproc.store.newrun import NewRun
from workerproc.store.types import ClaimRequest

TTL = 30.0


def limited(s: Store, *limits: LimitSpec, task: str = "call") -> None:
    s.register_tasks({task: TaskOptions(limits=tuple(x.name for x in limits))})
    assert s.declare_limits({x.name: x for x in limits}, by="here") == []


def commit(s: Store, lease: Lease, kind: str, **kw: object) -> str:
    c = Commit(lease, kind, expected_revision=lease.revision, **kw)  # type: ignore[arg-type]
    return s.commit_many([c]).results[0].value


CAP = LimitSpec.declare("m", concurrency=2)


def test_a_retried_run_runs_again(s: Store) -> None:
    limited(s, CAP)
    run = s.start_run("call", {})
    (lease,) = s.claim("w", TTL, limit=5)
    assert commit(s, lease, "fail", reason="boom") == "ok"
    assert s.claim("w", TTL, limit=5) == []  # closes the line: nothing waits
    assert s.retry_run(run)
    (again,) = s.claim("w", TTL, limit=5)
    assert again.run_id == run


def test_a_delayed_run_never_holds_back_a_due_one(s: Store, clock: FakeClock) -> None:
    limited(s, CAP)
    s.start_run("call", {}, delay=100)
    assert s.claim("w", TTL, limit=5) == []  # closes until the delayed run is due
    due = s.start_run("call", {})
    got = s.claim("w", TTL, limit=5)
    assert [x.run_id for x in got] == [due]


def test_a_signal_resumes_a_gated_wait(s: Store, clock: FakeClock) -> None:
    limited(s, CAP, task="after")
    s.register_tasks({"call": TaskOptions()})
    run = s.start_run("call", {})
    (lease,) = s.claim("w", TTL, limit=5)
    out = commit(s, lease, "wait", next_task="after", delay=3600, wait_for="signal:go",
                 new_state={})  # fmt: skip
    assert out == "ok"
    assert s.claim("w", TTL, limit=5) == []
    s.signal(run, "go", {})
    (got,) = s.claim("w", TTL, limit=5)
    assert got.run_id == run and got.task == "after"


def test_children_join_into_a_gated_task(s: Store, clock: FakeClock) -> None:
    limited(s, CAP, task="merge")
    s.register_tasks({"call": TaskOptions()})
    run = s.start_run("call", {})
    (lease,) = s.claim("w", TTL, limit=5)
    kid = NewRun.from_item({"task": "child"})
    out = commit(s, lease, "spawn", next_task="merge", delay=3600, wait_for="children",
                 new_state={}, children=(kid,))  # fmt: skip
    assert out == "ok"
    (child,) = s.claim("w", TTL, limit=5)
    assert s.claim("w", TTL, limit=5) == []
    assert commit(s, child, "finish", new_state={}) == "ok"
    (got,) = s.claim("w", TTL, limit=5)
    assert got.run_id == run and got.task == "merge"


def test_a_cancelled_runs_holder_keeps_its_slot_until_it_lets_go(s: Store) -> None:
    limited(s, LimitSpec.declare("one", concurrency=1))
    first = s.start_run("call", {})
    second = s.start_run("call", {})
    (lease,) = s.claim("w", TTL, limit=5)
    assert lease.run_id == first
    assert s.cancel_run(first)
    assert s.claim("w", TTL, limit=5) == []  # its handler still runs (B15): the cap holds
    assert commit(s, lease, "drop") == "ok"  # it stopped: its slot is free at once
    (got,) = s.claim("w", TTL, limit=5)
    assert got.run_id == second


def test_a_reaped_holder_reopens_the_lines_its_global_slot_kept_closed(s: Store) -> None:
    limited(s, LimitSpec.declare("t", concurrency=5, per="tenant"),
            LimitSpec.declare("g", concurrency=1))  # fmt: skip
    first = s.start_run("call", {"tenant": "x"})
    second = s.start_run("call", {"tenant": "y"})
    (lease,) = s.claim("dead", TTL, limit=5)
    assert lease.run_id == first
    assert s.claim("w", TTL, limit=5) == []  # y's line closes behind the global cap
    assert s.cancel_run(first)  # so that only y's line can take the slot
    assert s.release_owner("dead") == 1
    (got,) = s.claim("w", TTL, limit=5)
    assert got.run_id == second


def test_a_retry_frees_the_slot_of_the_lease_it_dropped(s: Store) -> None:
    limited(s, LimitSpec.declare("t", concurrency=5, per="tenant"),
            LimitSpec.declare("g", concurrency=1))  # fmt: skip
    first = s.start_run("call", {"tenant": "x"})
    s.start_run("call", {"tenant": "y"})
    (lease,) = s.claim("w", TTL, limit=5)
    assert lease.run_id == first
    assert s.claim("w", TTL, limit=5) == []
    assert s.cancel_run(first) and s.retry_run(first)  # the retry drops its lease (B2)
    assert len(s.claim("w", TTL, limit=5)) == 1  # its slot is free: one run, no more
    assert s.claim("w", TTL, limit=5) == []


def test_check_recounts_the_lines_and_reopens_one_left_closed(
    backend: Backend, s: Store, clock: FakeClock
) -> None:
    """What an older version left behind (a retried run in a line closed for good; a line
    closed until later though its run has room) is said and repaired by ``supervisor check``."""
    limited(s, CAP, LimitSpec.declare("t", concurrency=1, per="tenant"))
    s.register_tasks({"call": TaskOptions(limits=("m",)), "other": TaskOptions(limits=("t",))})
    a = s.start_run("call", {})
    b = s.start_run("other", {"tenant": "x"})
    backend.tamper("UPDATE gates SET ready_at = NULL WHERE gate = 'm'")
    backend.tamper(f"UPDATE gates SET ready_at = {clock.now + 900} WHERE gate <> 'm'")
    assert s.claim("w", TTL, limit=5) == []  # stuck, both
    assert s.repair_lines() == [
        "limit 'm': 1 run(s) waiting, its line was closed with nothing to reopen it: reopened",
        "limit 't' key 'x': 1 run(s) waiting, its line was closed for 900 s more although a "
        "run had room: reopened",
    ]
    assert s.repair_lines() == []  # nothing left to repair; a line full or not due stays
    leases = s.claim("w", TTL, limit=5)
    assert sorted(x.run_id for x in leases) == [a, b]
    for lease in leases:
        assert commit(s, lease, "finish", new_state={}) == "ok"
    backend.tamper("UPDATE gates SET ready_at = NULL")
    result = invoke("check", "--db", backend.url)
    assert result.exit_code == 0 and "repaired:" not in result.output  # no one waits: fine
    c = s.start_run("call", {})
    backend.tamper("UPDATE gates SET ready_at = NULL")
    result = invoke("check", "--db", backend.url)
    assert result.exit_code == 0, result.output
    assert "repaired: limit 'm': 1 run(s) waiting" in result.stdout
    with backend.open() as real:  # the command's clock: the machine's
        (again,) = real.claim("w", TTL, limit=5)
    assert again.run_id == c


def test_lines_a_global_cap_kept_closed_take_their_turns_when_it_frees(
    s: Store, clock: FakeClock
) -> None:
    """Found by the chaos verdict's tests: the lines a full global cap closed all reopened at
    the same moment and were served in name order, so the first tenants took every slot."""
    limited(s, LimitSpec.declare("t", concurrency=5, per="tenant"),
            LimitSpec.declare("g", concurrency=1))  # fmt: skip
    s.start_runs([{"task": "call", "payload": {"tenant": t}} for t in "abcde" for _ in range(4)])
    clock.advance(0.001)
    served = []
    for _ in range(10):
        (lease,) = s.claim("w", TTL, limit=5)
        served.append(lease.payload["tenant"])
        assert commit(s, lease, "finish", new_state={}) == "ok"
        clock.advance(0.001)
    assert served == list("abcde" * 2)  # each key in its turn


def test_a_claim_that_prefetches_admits_no_more_than_its_gates_allow(s: Store) -> None:
    """One transaction claims what begins at once, then what waits (B3's prefetch), and a
    worker's delivery lane after them: together they admit no more than a cap of 2
    and a rate of 2 a minute allow (the gates' states are written at the COMMIT)."""
    limited(s, LimitSpec.declare("cap", concurrency=2))
    limited(s, LimitSpec.declare("rate", rate="2/m", burst=2), task="paced")
    for task in ("call", "paced"):
        s.start_runs([{"task": task, "payload": {"i": i}} for i in range(6)])
    lane = ClaimRequest("w1", 30.0, limit=2, queues=("leasekeeper.webhooks",))
    out = s.commit_many((), claim=ClaimRequest("w1", 30.0, limit=12, start=1, also=lane))
    by_task = Counter(lease.task for lease in out.leases)
    assert by_task == {"call": 2, "paced": 2}, by_task
