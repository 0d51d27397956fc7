"""Completion (``workerproc/completer.py``) against real stores: the buffer of finished commits,
one transaction with the claim, retries while the database is busy (a fake clock, so no test
sleeps through a backoff), the one-by-one fallback for a value that cannot be written, and the
settling of conflicts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from helpers import FakeClock, unstarted_heartbeat
from store_backends import Backend

from workerproc.completer import READONLY_EXIT, Completer
from workerproc.heartbeat import Heartbeat
from workerproc.store import (
    BatchOutcome,
    CasResult,
    ClaimRequest,
    Commit,
    InvalidPayload,
    Lease,
    Run,
    Store,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
    open_store,
)

OWNER = "host:1:1.00:w"
TTL = 30.0


class Faulty(Store):
    """The real store; its next ``failures`` batched writes raise ``error`` (a busy database,
    a read-only file), and it counts every conversation."""

    def __init__(self, db: str) -> None:
        super().__init__(open_store(db).dialect)
        self.failures = 0
        self.error: StoreError = StoreUnavailable("database is locked")
        self.calls: list[tuple[int, int]] = []  # (commits, leases asked for)
        self.run_error: StoreError | None = None

    def commit_many(
        self, commits: Sequence[Commit], *, claim: ClaimRequest | None = None
    ) -> BatchOutcome:
        self.calls.append((len(commits), claim.limit if claim else 0))
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().commit_many(commits, claim=claim)

    def get_run(self, run_id: int) -> Run | None:
        if self.run_error is not None:
            raise self.run_error
        return super().get_run(run_id)


class Setup:
    def __init__(self, store: Store) -> None:
        self.clock = FakeClock()
        self.slept: list[float] = []
        self.heartbeat: Heartbeat = unstarted_heartbeat(TTL)
        self.unwritable: list[str] = []
        self.store = store
        self.completer = Completer(
            store, TTL, self.heartbeat, unwritable=self._unwritable, clock=self.clock,
            sleep=self._sleep,
        )  # fmt: skip

    def _sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)

    def _unwritable(self, commit: Commit, exc: InvalidPayload) -> Commit:
        self.unwritable.append(str(exc))
        return Commit(commit.lease, "fail", reason="bad_value", error=f"InvalidPayload: {exc}")

    def claim(self, limit: int) -> list[Lease]:
        """Leases held the way a worker holds them: claimed, and tracked by its heartbeat."""
        leases = list(self.completer.commit_and_claim((), request(limit)))
        assert len(leases) == limit
        return leases


def request(limit: int) -> ClaimRequest:
    return ClaimRequest(OWNER, TTL, 3, limit)


@pytest.fixture
def faulty(db_path: str) -> Any:
    store = Faulty(db_path)
    yield store
    store.close()


# -- the buffer and the one transaction -----------------------------------------------------
def test_the_buffer_keeps_when_its_oldest_commit_finished(faulty: Faulty) -> None:
    setup = Setup(faulty)
    done = setup.completer
    run = faulty.start_run("t")
    (lease,) = setup.claim(1)
    assert done.since is None and not done.pending
    first = setup.clock.now
    done.add(Commit(lease, "finish", new_state={}))
    setup.clock.advance(1.0)
    done.add(Commit(lease, "finish", new_state={}))
    assert done.since == first and len(done.pending) == 2
    assert len(done.take()) == 2 and done.since is None and not done.pending
    assert faulty.get_run(run) is not None


def test_finished_commits_and_hand_backs_go_with_the_claim_in_one_transaction(
    faulty: Faulty,
) -> None:
    setup = Setup(faulty)
    runs = faulty.start_runs([{"task": "t"}] * 5)
    first, second, waiting = setup.claim(3)
    setup.completer.add(Commit(first, "finish", new_state={"ok": 1}))
    setup.completer.add(Commit(second, "finish", new_state={"ok": 2}))
    faulty.calls.clear()
    setup.clock.advance(2.0)
    sent = setup.clock.now
    leases = setup.completer.commit_and_claim([Commit(waiting, "handback")], request(3))
    assert faulty.calls == [(3, 3)]  # one conversation: three commits, then the claim
    assert {lease.run_id for lease in leases} == {waiting.run_id, *runs[3:]}
    assert not setup.completer.pending
    hb = setup.heartbeat
    assert [hb.confirmed_at(lease) for lease in leases] == [sent] * 3  # held from the send
    assert hb.confirmed_at(first) is None and hb.confirmed_at(second) is None  # written
    for run_id in (first.run_id, second.run_id):
        run = faulty.get_run(run_id)
        assert run is not None and run.status == "succeeded"
    (again,) = (lease for lease in leases if lease.run_id == waiting.run_id)
    assert again.tries == 1  # the hand-back spent no attempt


# -- a busy database ------------------------------------------------------------------------
def test_a_busy_database_is_retried_with_backoff(faulty: Faulty) -> None:
    setup = Setup(faulty)
    faulty.start_runs([{"task": "t"}] * 2)
    (lease,) = setup.claim(1)
    setup.completer.add(Commit(lease, "finish", new_state={}))
    faulty.failures = 4
    leases = setup.completer.commit_and_claim((), request(1))
    assert len(faulty.calls) == 1 + 5 and len(leases) == 1
    assert all(0.75 * d <= s <= 1.25 * d for s, d in zip(setup.slept, (0.02, 0.04, 0.08, 0.16),
                                                         strict=True))  # fmt: skip
    sent = setup.heartbeat.confirmed_at(leases[0])
    assert sent == pytest.approx(setup.clock.now)  # the try that succeeded, not the first


def test_an_outage_is_told_once_when_it_begins_and_once_when_it_ends(
    faulty: Faulty, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(faulty)
    faulty.start_runs([{"task": "t"}] * 2)
    (lease,) = setup.claim(1)
    setup.completer.add(Commit(lease, "finish", new_state={}))
    faulty.failures = 30
    began = setup.clock.now
    with caplog.at_level(logging.INFO, logger="workerproc.worker"):
        leases = setup.completer.commit_and_claim((), request(1))
        lasted = setup.clock.now - began
        setup.completer.commit_and_claim((), request(1))  # no incident: nothing more is said
    assert len(leases) == 1
    told = [r.getMessage() for r in caplog.records]
    assert told == [
        "the database did not answer (commit: database is locked); retrying with backoff "
        "until it does (logged once per incident)",
        f"the database answers again after {lasted:.1f}s (30 failed tries)",
    ]
    assert setup.completer.outage.incidents == 1


def test_a_commit_is_given_up_after_a_ttl_and_a_claim_alone_after_one_try(
    faulty: Faulty, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(faulty)
    faulty.start_runs([{"task": "t"}] * 2)
    (lease,) = setup.claim(1)
    faulty.calls.clear()
    faulty.failures = 10_000
    begun = setup.clock.now
    with caplog.at_level(logging.WARNING):
        out = setup.completer.write([Commit(lease, "finish", new_state={})], request(1))
    assert out == BatchOutcome(())  # gave up: its lease lapses, the task is taken over
    assert TTL <= setup.clock.now - begun <= TTL + 1.0
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("giving up on 1 commit after ") for m in messages)
    # the incident is told once, not once per try (the log stays readable through an outage)
    assert sum(m.startswith("the database did not answer") for m in messages) == 1
    faulty.calls.clear()
    assert setup.completer.commit_and_claim((), request(1)) == ()
    assert len(faulty.calls) == 1  # nothing is lost by claiming later


def test_a_database_read_only_for_long_ends_the_worker(faulty: Faulty) -> None:
    setup = Setup(faulty)
    faulty.start_runs([{"task": "t"}] * 2)
    (lease,) = setup.claim(1)
    faulty.error = StoreReadOnly("attempt to write a readonly database")
    faulty.failures = 3  # a short spell: retried like a busy database
    out = setup.completer.write([Commit(lease, "finish", new_state={})], None)
    assert out.results == (CasResult.OK,) and setup.completer.readonly_since is None
    faulty.failures = 10_000
    assert setup.completer.write((), request(1)) == BatchOutcome(())  # the spell begins
    setup.clock.advance(READONLY_EXIT * 0.9)
    assert setup.completer.write((), request(1)) == BatchOutcome(())
    setup.clock.advance(READONLY_EXIT * 0.1)
    with pytest.raises(StoreReadOnly):
        setup.completer.write((), request(1))
    assert setup.completer.readonly_since is not None


# -- one bad value --------------------------------------------------------------------------
def test_an_unwritable_value_fails_its_task_alone_and_the_claim_still_goes_out(
    faulty: Faulty,
) -> None:
    setup = Setup(faulty)
    good_run, bad_run, _ = faulty.start_runs([{"task": "t"}] * 3)
    good, bad = setup.claim(2)
    setup.completer.add(Commit(good, "finish", new_state={"ok": True}))
    setup.completer.add(Commit(bad, "advance", new_state={}, next_task="\ud800"))
    faulty.calls.clear()
    sent = setup.clock.now
    leases = setup.completer.commit_and_claim((), request(1))
    assert faulty.calls[0] == (2, 1) and faulty.calls[-1] == (0, 1)  # the batch, ..., the claim
    assert len(leases) == 1 and setup.heartbeat.confirmed_at(leases[0]) == sent
    assert len(setup.unwritable) == 1 and "surrogate" in setup.unwritable[0]
    done, failed = faulty.get_run(good_run), faulty.get_run(bad_run)
    assert done is not None and done.status == "succeeded"
    assert failed is not None and failed.status == "failed"
    assert failed.failure_reason == "bad_value" and "InvalidPayload" in (failed.last_error or "")


# -- the answers ----------------------------------------------------------------------------
def test_a_conflict_is_settled_in_the_next_batch(backend: Backend) -> None:
    with backend.open() as store:
        setup = Setup(store)
        cancelled, moved = store.start_runs([{"task": "t"}] * 2)
        first, second = setup.claim(2)
        by_run = {first.run_id: first, second.run_id: second}
        store.cancel_run(cancelled)  # an operator: the run is over under its task
        setup.completer.add(Commit(by_run[cancelled], "finish", new_state={}))
        setup.completer.add(Commit(by_run[moved], "finish", new_state={},
                                   expected_revision=by_run[moved].revision + 1))  # fmt: skip
        assert setup.completer.commit_and_claim((), None) == ()
        kinds = {c.lease.run_id: c.kind for c in setup.completer.pending}
        assert kinds == {cancelled: "drop", moved: "release"}
        assert setup.heartbeat.confirmed_at(by_run[moved]) is not None  # held until written
        setup.completer.commit_and_claim((), None)
        assert not setup.completer.pending
        assert store.stats().leased == 0
        run = store.get_run(moved)
        assert run is not None and run.status == "pending"  # given back: nothing leases it


def test_a_lost_lease_is_discarded_and_a_conflict_that_cannot_be_read_lapses(
    faulty: Faulty, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(faulty)
    faulty.start_runs([{"task": "t"}] * 2)
    lost, _ = setup.claim(2)
    faulty.release_owner(OWNER)  # as a supervisor does for a worker it found dead
    again = next(lease for lease in setup.claim(2) if lease.run_id != lost.run_id)
    faulty.run_error = StoreUnavailable("database is locked")  # the conflict cannot be read
    setup.completer.add(Commit(lost, "finish", new_state={}))
    setup.completer.add(Commit(again, "finish", new_state={},
                               expected_revision=again.revision + 1))  # fmt: skip
    with caplog.at_level(logging.WARNING):
        setup.completer.commit_and_claim((), None)
    assert not setup.completer.pending  # neither written again nor settled: it lapses
    messages = [r.getMessage() for r in caplog.records]
    assert any("refused, lease lost" in m for m in messages), messages
    assert any("cannot read run" in m for m in messages), messages
    assert [r.attempt for r in faulty.fence_rejections()] == [lost.attempt]
