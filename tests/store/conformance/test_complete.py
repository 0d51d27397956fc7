"""The driver's completions (``Driver.complete``): N >= 1 fenced writes of distinct runs, each
typed (``Finish``, ``Advance``, ``Release``, ``Handback``, ``Ack``, ``SetState``) and judged
on its own, answered in order, on both drivers. What each writes is read back through the
store; refusals are the protocol's to record, so the verb itself records none. And the paid
call's keep (``Driver.keep_call``) and an operator's cancel (``Driver.cancel_run``)."""

from __future__ import annotations

from collections.abc import Sequence

from workerproc.store.calls import CallKey
from workerproc.store.dialect import Tx
from workerproc.store.driver import (
    Ack,
    Advance,
    CancelRow,
    Completed,
    Completion,
    Finish,
    Handback,
    Keep,
    KeepRow,
    Release,
    SetState,
)
from workerproc.store.types import Lease

from .kit import TTL, Driver, last_word, verb
from .test_calls import key


def complete(driver: Driver, batch: Sequence[Completion]) -> list[Completed]:
    def run(tx: Tx) -> list[Completed]:
        return tx.complete(batch)

    return driver.store.dialect.write(run, runs=[c.run_id for c in batch])


def held(lease: Lease, attempt: int | None = None) -> tuple[int, int, int, str]:
    """The lease's fence (``attempt``: another one's, a stale fence)."""
    return lease.run_id, lease.task_id, lease.attempt if attempt is None else attempt, lease.owner


@verb("Driver.complete")
def test_each_kind_writes_its_completion_and_answers_in_order(driver: Driver) -> None:
    runs = [driver.store.start_run("t", state={"n": 0}) for _ in range(6)]
    leases = {lease.run_id: lease for lease in driver.store.claim("w1", TTL, limit=6)}
    fin, adv, rel, back, ack, cas = (held(leases[run]) for run in runs)
    batch: list[Completion] = [
        SetState(*cas, revision=0, state='{"n": 5}'),
        Finish(*fin, revision=0, state='{"n": 1}', result='{"ok": true}'),
        Advance(
            *adv,
            revision=0,
            state='{"n": 2}',
            queue=None,
            name="next",
            payload='{"p": 1}',
            delay=0.0,
        ),
        Release(*rel, delay=30.0, error="boom"),
        Handback(*back),
        Ack(*ack),
    ]
    done = complete(driver, batch)
    assert done == [Completed(True), Completed(True, True), Completed(True), Completed(True),
                    Completed(True), Completed(True, True)]  # fmt: skip
    assert driver.store.fence_rejections() == []  # the verb records nothing itself
    got = {run: driver.store.get_run(run) for run in runs}
    assert (got[runs[0]].status, got[runs[0]].result, got[runs[0]].revision) == (
        "succeeded", {"ok": True}, 1)  # fmt: skip
    assert (got[runs[1]].state, got[runs[1]].revision) == ({"n": 2}, 1)
    assert [t.name for t in driver.store.get_tasks(runs[1])] == ["t", "next"]
    assert got[runs[2]].last_error == "boom" and got[runs[2]].status == "pending"
    assert got[runs[3]].status == "pending"
    assert got[runs[4]].status == "succeeded"  # its last task acknowledged
    assert (got[runs[5]].state, got[runs[5]].revision) == ({"n": 5}, 1)
    assert driver.store.renew(leases[runs[5]], TTL)  # a compare-and-set keeps its lease
    assert not driver.store.renew(leases[runs[3]], TTL)  # handed back: the lease is gone
    again = driver.store.claim("w2", TTL, limit=6)  # the release waits for its delay
    assert {lease.run_id for lease in again} == {runs[1], runs[3]}


@verb("Driver.complete")
def test_a_lost_lease_or_a_moved_revision_is_refused_alone(driver: Driver) -> None:
    a, b, c = (driver.store.start_run("t", state={}) for _ in range(3))
    leases = {lease.run_id: lease for lease in driver.store.claim("w1", TTL, limit=3)}
    stale = held(leases[a], leases[a].attempt + 1)
    batch: list[Completion] = [
        Finish(*stale, revision=0, state="{}", result="null"),
        SetState(*held(leases[b]), revision=7, state="{}"),
        Ack(*held(leases[c])),
    ]
    assert complete(driver, batch) == [Completed(False), Completed(False), Completed(True, True)]
    assert driver.store.get_run(a).status == "running"  # nothing written under a stale fence
    assert driver.store.get_run(b).revision == 0
    driver.clock.advance(TTL + 1)  # every lease has expired: nothing is written any more
    assert complete(driver, [Handback(*held(leases[a]))]) == [Completed(False)]


@verb("Driver.complete")
def test_an_ack_ends_its_run_only_with_its_last_task(driver: Driver) -> None:
    run = driver.store.start_run("t", state={})
    lease = driver.claim()
    first = complete(driver, [Advance(*held(lease), revision=0, state="{}", queue=None,
                                      name="next", payload="null", delay=0.0)])  # fmt: skip
    assert first == [Completed(True)]
    nxt = driver.claim()
    assert nxt.run_id == run and nxt.task == "next"
    assert complete(driver, [Ack(*held(nxt))]) == [Completed(True, True)]
    assert driver.store.get_run(run).status == "succeeded"


def keep(driver: Driver, keeping: Keep) -> KeepRow:
    return driver.store.dialect.write(lambda tx: tx.keep_call(keeping))


@verb("Driver.keep_call")
def test_keep_call_keeps_the_first_answer_and_counts_a_later_one(driver: Driver) -> None:
    lease = driver.lease()
    start = driver.store.begin_call(lease, key(lease))
    assert start.intent is not None
    call = key(lease)
    first = Keep(*held_call(call), '{"a": 1}', lease.attempt, lease.owner, 10, start.intent)
    assert keep(driver, first) == KeepRow("kept", '{"a": 1}', lease.attempt, 10)
    assert keep(driver, first) == KeepRow("answered")  # its intent answered: a retried keep
    later = Keep(*held_call(call), '{"a": 2}', lease.attempt, "w9", 7)
    assert keep(driver, later) == KeepRow("lost_race", '{"a": 1}', lease.attempt, 10)
    (paid,) = driver.store.paid_calls(lease.run_id)
    assert (paid.unused, paid.unused_tokens, paid.owner) == (1, 7, lease.owner)
    assert driver.finish(lease).value == "ok"  # the step done: nothing is kept any more
    other = Keep(*held_call(key(lease, request="h2")), "3", lease.attempt, lease.owner)
    assert keep(driver, other) == KeepRow("none")
    assert [p.request_hash for p in driver.store.paid_calls(lease.run_id)] == [call.request_hash]


def held_call(call: CallKey) -> tuple[int, int, str, str]:
    return call.run_id, call.task_id, call.name, call.request_hash


def cancel(driver: Driver, run_id: int) -> CancelRow | None:
    return driver.store.dialect.write(lambda tx: tx.cancel_run(run_id), runs=[run_id])


@verb("Driver.cancel_run")
def test_cancel_run_ends_a_live_run_with_its_live_descendants(driver: Driver) -> None:
    lease = driver.lease()
    assert driver.commit(last_word(lease, "spawn")).value == "ok"
    (child,) = (c[0] for c in driver.store.run_children(lease.run_id))
    got = cancel(driver, lease.run_id)  # (a waiting run is stored pending)
    assert got == CancelRow("pending", "default", True, [("default", child)])
    assert driver.store.get_run(child).status == "cancelled"
    assert cancel(driver, lease.run_id) == CancelRow("cancelled", "default", False, [])
    assert cancel(driver, 10_000) is None  # no such run
