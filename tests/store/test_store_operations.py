"""The store beyond the pinned rules, on every backend: fenced commits (advance, finish, fail,
drop, fused claim), operators (retry, cancel, release_owner), delays and the reads."""

from __future__ import annotations

import pytest
from helpers import FakeClock, wait_for
from store_backends import TTL, Backend, advance, claim, commit, fail_run, finish, snapshot

from workerproc.store import (
    CasResult,
    ClaimRequest,
    Commit,
    InvalidPayload,
    RunNotFound,
    Store,
)


class TestStoreOperations:
    # -- fenced commits ---------------------------------------------------------------------
    def test_advance_casts_state_enqueues_next_and_acks(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("a", state={"n": 0})
        lease = claim(s)
        assert advance(s, lease, 0, {"n": 1}, "b", payload={"x": 1}) is CasResult.OK
        first, second = s.get_tasks(run_id)
        assert first.done_at == clock.now and first.lease_owner is None
        assert (second.name, second.payload, second.available_at) == ("b", {"x": 1}, clock.now)
        nxt = claim(s, "w2")
        assert (nxt.task, nxt.state, nxt.revision, nxt.attempt) == ("b", {"n": 1}, 1, 1)

    def test_advance_with_delay_makes_a_delayed_task(self, s: Store, clock: FakeClock) -> None:
        s.start_run("a")
        assert advance(s, claim(s), 0, None, "b", delay=30) is CasResult.OK
        assert s.claim("w1", TTL) is None
        assert s.next_ready_at() == clock.now + 30
        clock.advance(30)
        assert claim(s).task == "b"

    def test_advance_conflict_writes_nothing(self, s: Store) -> None:
        run_id = s.start_run("a")
        lease = claim(s)
        before = snapshot(s, run_id)
        assert advance(s, lease, 7, {"n": 1}, "b") is CasResult.CONFLICT
        assert snapshot(s, run_id) == before

    def test_finish_succeeds_run_with_result(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("a", state={"n": 0})
        lease = claim(s)
        assert finish(s, lease, 0, {"n": 1}, result={"ok": True}) is CasResult.OK
        run = s.get_run(run_id)
        assert run is not None
        assert (run.status, run.state, run.revision, run.result) == (
            "succeeded", {"n": 1}, 1, {"ok": True},
        )  # fmt: skip
        assert run.finished_at == clock.now and s.get_tasks(run_id)[0].done_at == clock.now
        assert s.claim("w2", TTL) is None

    @pytest.mark.parametrize(
        "call",
        [
            lambda s, lease: advance(s, lease, 0, {"bad": object()}, "b"),
            lambda s, lease: advance(s, lease, 0, None, "b", payload={1j}),
            lambda s, lease: advance(s, lease, 0, None, ""),
            lambda s, lease: finish(s, lease, 0, {"n": float("nan")}),
            lambda s, lease: finish(s, lease, 0, None, result=b"bytes"),
            lambda s, lease: s.compare_and_set(lease, 0, {"n": {1, 2}}),
        ],
        ids=["advance-state", "advance-payload", "advance-noname", "finish-nan", "finish-result",
             "cas-state"],
    )  # fmt: skip
    def test_advance_finish_atomic_bad_json_writes_nothing(self, s: Store, call: object) -> None:
        run_id = s.start_run("a", state={"n": 0})
        lease = claim(s)
        before = snapshot(s, run_id)
        with pytest.raises(InvalidPayload):
            call(s, lease)  # type: ignore[operator]
        assert snapshot(s, run_id) == before
        assert s.renew(lease, TTL)  # the lease is untouched and still live

    def test_commit_fail_fails_run_and_keeps_task(self, s: Store) -> None:
        run_id = s.start_run("a")
        lease = claim(s)
        out = commit(s, Commit(lease, "fail", reason="bad_input", error="Traceback ..."))
        assert out.result is CasResult.OK
        run = s.get_run(run_id)
        assert run is not None and (run.status, run.failure_reason, run.last_error) == (
            "failed", "bad_input", "Traceback ...",
        )  # fmt: skip
        (task,) = s.get_tasks(run_id)
        assert task.done_at is None and task.lease_owner is None

    def test_commit_drop_marks_task_done_only(self, s: Store) -> None:
        run_id = s.start_run("a", state={"n": 0})
        lease = claim(s)
        assert s.cancel_run(run_id)
        assert commit(s, Commit(lease, "drop")).result is CasResult.OK
        run = s.get_run(run_id)
        assert run is not None and (run.status, run.state) == ("cancelled", {"n": 0})
        assert s.get_tasks(run_id)[0].done_at is not None

    def test_commit_fuses_the_next_claim(self, s: Store) -> None:
        s.start_run("a")
        other = s.start_run("b")
        lease = claim(s)
        done = Commit(lease, "finish", expected_revision=0, new_state=None)
        out = commit(s, done, claim=ClaimRequest("w1", TTL))
        assert out.result is CasResult.OK
        assert out.next_lease is not None and out.next_lease.run_id == other
        lost = commit(s, done, claim=ClaimRequest("w1", TTL))  # lost lease: still claims
        assert lost.result is CasResult.LEASE_LOST and lost.next_lease is None

    # -- operators ----------------------------------------------------------------------------
    def test_cancel_run_then_holder_commit_answers_conflict(self, s: Store) -> None:
        run_id = s.start_run("a", state={"n": 0})
        lease = claim(s)
        assert s.cancel_run(run_id)
        assert not s.cancel_run(run_id)  # already ended
        assert s.compare_and_set(lease, 0, {"n": 1}) is CasResult.CONFLICT
        assert advance(s, lease, 0, {"n": 1}, "b") is CasResult.CONFLICT
        assert finish(s, lease, 0, {"n": 1}) is CasResult.CONFLICT
        run = s.get_run(run_id)
        assert run is not None and (run.status, run.state, run.revision) == (
            "cancelled",
            {"n": 0},
            0,
        )
        with pytest.raises(RunNotFound):
            s.cancel_run(run_id + 100)

    def test_retry_run_fencing_attempts_never_repeat(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("a")
        zombie = claim(s, "w1", max_attempts=1)  # attempt 1, still live
        assert fail_run(s, run_id, "operator", "stuck")
        assert s.retry_run(run_id)
        run = s.get_run(run_id)
        assert run is not None and (run.status, run.failure_reason) == ("pending", None)
        assert s.compare_and_set(zombie, 0, {"z": 1}) is CasResult.LEASE_LOST  # old lease gone
        assert s.claim("w1", TTL, max_attempts=1) is None  # not before it would have expired
        clock.advance(TTL)
        fresh = claim(s, "w1", max_attempts=1)  # same owner: attempt 2, tries start again at 1
        assert (fresh.task_id, fresh.attempt, fresh.tries) == (zombie.task_id, 2, 1)
        assert not s.ack(zombie) and not s.renew(zombie, TTL) and not s.release(zombie)
        assert s.release(fresh)
        assert s.claim("w1", TTL, max_attempts=1) is None  # exhausted again: failed again
        assert s.retry_run(run_id)
        again = claim(s, "w2", max_attempts=1)
        assert again.attempt == 4  # attempt 3 was the refused one: tokens never repeat
        assert s.ack(again) and not s.retry_run(run_id)  # succeeded: nothing to retry

    def test_retry_run_only_for_failed_or_cancelled(self, s: Store) -> None:
        run_id = s.start_run("a")
        assert not s.retry_run(run_id)  # pending
        assert s.cancel_run(run_id) and s.retry_run(run_id)
        assert claim(s).run_id == run_id
        with pytest.raises(RunNotFound):
            s.retry_run(run_id + 100)

    def test_release_owner_expires_only_that_owners_live_leases(
        self, s: Store, clock: FakeClock
    ) -> None:
        for _ in range(3):
            s.start_run("a")
        dead1, dead2, alive = claim(s, "dead"), claim(s, "dead"), claim(s, "alive")
        assert s.release_owner("dead") == 2
        assert s.release_owner("dead") == 0
        assert not s.renew(dead1, TTL) and not s.ack(dead2)
        assert s.renew(alive, TTL)
        taken = {claim(s, "w2").task_id, claim(s, "w3").task_id}
        assert taken == {dead1.task_id, dead2.task_id}
        assert {lease.attempt for lease in (dead1, dead2)} == {1}
        assert s.claim("w4", TTL) is None

    def test_prune_deletes_runs_finished_before_the_cutoff_in_batches(
        self, s: Store, clock: FakeClock
    ) -> None:
        old = [s.start_run("t") for _ in range(5)]
        for run_id in old[:4]:
            assert s.cancel_run(run_id)
        alive = s.start_run("t")
        zombie = claim(s, "z", 1)  # a refused write, recorded now
        clock.advance(10)
        assert not s.renew(zombie, TTL)
        assert len(s.fence_rejections()) == 1
        clock.advance(3601)
        recent = s.start_run("t")
        assert s.cancel_run(recent)
        assert s.prune(3600, batch=3) == 4  # two batches: 3, then 1
        assert [r.id for r in s.list_runs()] == [recent, alive, old[4]]
        assert all(s.get_tasks(r) == [] for r in old[:4])
        assert s.fence_rejections() == []
        assert s.prune(3600) == 0

    def test_run_ids_are_never_given_out_again_after_a_prune(
        self, s: Store, clock: FakeClock
    ) -> None:
        """A caller holding an old run id must never meet somebody else's run under it."""
        old = [s.start_run("t") for _ in range(3)]
        for run_id in old:
            assert s.cancel_run(run_id)
        clock.advance(10)
        assert s.prune(1) == 3 and s.list_runs() == []
        new = [s.start_run("t"), *s.start_runs([{"task": "t"}, {"task": "t"}])]
        assert min(new) > max(old), (old, new)
        assert s.get_run(old[-1]) is None

    def test_renew_many_answers_each_lease_by_its_own_attempt(
        self, s: Store, clock: FakeClock
    ) -> None:
        """A holder that took its own expired task over holds the stale lease and the new one
        of the same task: one renewal of both renews the new one only."""
        s.start_run("t")
        stale = claim(s, "w", 10)
        clock.advance(11)
        fresh = claim(s, "w", 10)
        assert (fresh.task_id, fresh.attempt) == (stale.task_id, stale.attempt + 1)
        assert s.renew_many([stale, fresh], 20) == [None, clock.now + 20]
        refused = s.fence_rejections()
        assert [(r.attempt, r.op) for r in refused] == [(stale.attempt, "renew")]

    def test_fail_run(self, s: Store) -> None:
        run_id = s.start_run("a")
        assert fail_run(s, run_id, "operator", "why")
        assert not fail_run(s, run_id, "again")
        run = s.get_run(run_id)
        assert run is not None and (run.failure_reason, run.last_error) == ("operator", "why")

    # -- delays, reads ------------------------------------------------------------------------
    def test_delayed_start_run_and_next_ready_at(self, s: Store, clock: FakeClock) -> None:
        assert s.next_ready_at() is None
        s.start_run("a", delay=20)
        s.start_run("b", delay=10)
        assert s.next_ready_at() == clock.now + 10
        clock.advance(10)
        lease = claim(s, "w1", 5)
        assert lease.task == "b"
        assert s.next_ready_at() == clock.now + 5  # b's lease expiry comes before a
        assert s.ack(lease)
        assert s.next_ready_at() == clock.now + 10

    def test_change_token_moves_on_another_connections_commit(self, backend: Backend) -> None:
        reader, writer = backend.open(), backend.open()
        try:
            token = reader.change_token()
            writer.start_run("a")  # PostgreSQL delivers the notification a moment later
            wait_for(lambda: reader.change_token() != token, timeout=10, interval=0.005)
        finally:
            reader.close()
            writer.close()

    def test_a_run_reads_running_only_while_a_live_lease_holds_it(
        self, s: Store, clock: FakeClock
    ) -> None:
        """After a graceful stop handed back its prefetched tasks, a run showed
        ``running`` with nothing leased. Running is read from the leases, never written."""
        run_id = s.start_run("t")

        def shown() -> tuple[str, str, dict[str, int]]:
            run = s.get_run(run_id)
            assert run is not None
            listed = [r.id for r in s.list_runs("running")]
            return run.status, "listed" if run_id in listed else "-", s.stats().runs

        held = claim(s, "w1", 10)
        assert shown() == ("running", "listed", {"running": 1})
        assert s.commit_many([Commit(held, "handback")]).results[0] is CasResult.OK
        assert shown() == ("pending", "-", {"pending": 1})  # handed back: nothing leases it
        claim(s, "w1", 10)
        clock.advance(10)  # the lease expired: nobody holds the run (claimable again)
        assert shown() == ("pending", "-", {"pending": 1})
        held = claim(s, "w2", 10)
        assert held.takeover and shown()[0] == "running"
        assert s.release_owner("w2") == 1  # a dead worker's lease, released
        assert shown() == ("pending", "-", {"pending": 1})
        assert s.release(claim(s, "w3", 10), delay=5)
        assert shown() == ("pending", "-", {"pending": 1})
        assert [r.id for r in s.list_runs("pending")] == [run_id]

    def test_stats_counts(self, s: Store, clock: FakeClock) -> None:
        # a delayed, b leased, c expired, d done, e and g ready, f cancelled: every count differs
        runs = [s.start_run(n) for n in "abcdefg"]
        assert s.cancel_run(runs[5])
        assert s.release(claim(s), delay=100)  # run a: delayed now
        held = claim(s, "w1", 100)  # b
        s.release(claim(s, "w2", 5))  # c back to ready
        claim(s, "w3", 5)  # c again
        assert s.ack(claim(s, "w4"))  # d succeeded
        clock.advance(6)  # c's lease (w3) expired
        st = s.stats()
        assert st.now == clock.now
        # running: a live lease holds it (b); a released run (a) and one whose lease expired
        # (c) are pending, as are e and g
        assert st.runs == {"running": 1, "pending": 4, "succeeded": 1, "cancelled": 1}
        assert (st.ready, st.delayed, st.leased, st.expired) == (2, 1, 1, 1)
        assert st.pending_work == 5
        default = st.queues["default"]
        assert (default.ready, default.delayed, default.leased, default.expired) == (2, 1, 1, 1)
        assert default.runs == st.runs
        assert {(le.owner, le.task_id, le.attempt) for le in st.leases} == {
            ("w1", held.task_id, 1), ("w3", s.get_tasks(runs[2])[0].id, 2),
        }  # fmt: skip

    def test_get_tasks_and_list_runs(self, s: Store, clock: FakeClock) -> None:
        first = s.start_run("a", {"p": 1})
        second = s.start_run("b")
        assert s.get_run(second + 1) is None and s.get_tasks(second + 1) == []
        lease = claim(s)
        assert advance(s, lease, 0, None, "a2", payload=[1, 2]) is CasResult.OK
        tasks = s.get_tasks(first)
        assert [(t.name, t.payload, t.attempts) for t in tasks] == [
            ("a", {"p": 1}, 1),
            ("a2", [1, 2], 0),
        ]
        assert tasks[0].created_at == clock.now and tasks[0].done_at == clock.now
        assert [r.id for r in s.list_runs()] == [second, first]
        assert [r.id for r in s.list_runs(limit=1)] == [second]
        assert s.list_runs("running") == []  # a2 is not leased yet
        assert [r.id for r in s.list_runs("pending")] == [second, first]
        held = claim(s)
        assert [r.id for r in s.list_runs("running")] == [held.run_id]
        assert [r.id for r in s.list_runs("pending")] == [second if held.run_id == first else first]
        assert s.release(held)
        assert fail_run(s, second, "x")
        assert [r.id for r in s.list_runs(status="failed")] == [second]
        assert s.list_runs(status="cancelled") == []
