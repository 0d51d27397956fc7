"""What the dashboard reads from the store, on every backend: keyset pages of runs filtered by
status and first task, the distinct task names, the attempt history (every attempt that ended
without a commit, and who committed), the writes the fence refused, and runs finished per
bucket. Time is a FakeClock."""

from __future__ import annotations

import pytest
from helpers import FakeClock
from store_backends import TTL, advance, claim, commit, finish

from workerproc.store import Commit, Store


def ids(runs: list[object]) -> list[int]:
    return [r.id for r in runs]  # type: ignore[attr-defined]


class TestRunsPage:
    def test_keyset_pages_newest_first_in_both_directions(self, s: Store) -> None:
        made = [s.start_run("t") for _ in range(7)]
        first = s.runs_page(limit=3)
        assert ids(first) == made[::-1][:3]
        second = s.runs_page(before=first[-1].id, limit=3)
        assert ids(second) == made[::-1][3:6]
        last = s.runs_page(before=second[-1].id, limit=3)
        assert ids(last) == [made[0]]
        assert s.runs_page(before=made[0], limit=3) == []
        # back up: the page newer than the second one is the first one, still newest first
        assert ids(s.runs_page(after=second[0].id, limit=3)) == ids(first)
        with pytest.raises(ValueError, match="not both"):
            s.runs_page(before=1, after=2)

    def test_filters_by_status_and_first_task(self, s: Store) -> None:
        a1, b1, a2, b2 = (s.start_run(name) for name in ("alpha", "beta", "alpha", "beta"))
        lease = claim(s)  # alpha run a1 is running now
        assert lease.run_id == a1
        assert ids(s.runs_page(task="alpha")) == [a2, a1]
        assert ids(s.runs_page(task="beta")) == [b2, b1]
        assert ids(s.runs_page(status="running")) == [a1]
        assert ids(s.runs_page(status="pending", task="alpha")) == [a2]
        assert ids(s.runs_page(status="pending", task="alpha", before=a2)) == []
        assert s.runs_page(task="gamma") == []
        run = s.get_run(a1)
        assert run is not None and run.task == "alpha"

    def test_a_runs_task_is_its_first_task_even_after_it_advanced(self, s: Store) -> None:
        run_id = s.start_run("prepare", state={})
        lease = claim(s)
        assert advance(s, lease, 0, {"n": 1}, "call").value == "ok"
        assert ids(s.runs_page(task="prepare")) == [run_id]
        assert s.runs_page(task="call") == []

    def test_task_names_are_distinct_and_sorted(self, s: Store) -> None:
        for name in ("zeta", "alpha", "zeta", "mid", "alpha"):
            s.start_run(name)
        assert s.task_names() == ["alpha", "mid", "zeta"]
        assert s.task_names(limit=2) == ["alpha", "mid"]


class TestAttemptHistory:
    def test_the_happy_path_keeps_no_history_but_knows_who_committed(
        self, s: Store, clock: FakeClock
    ) -> None:
        run_id = s.start_run("t", state={})
        lease = claim(s, "w1")
        clock.advance(2)
        assert finish(s, lease, 0, {"done": True}).value == "ok"
        assert s.attempt_history(run_id) == []
        (task,) = s.get_tasks(run_id)
        assert (task.done_owner, task.done_attempt, task.claimed_at) == ("w1", 1, clock.now - 2)

    def test_release_with_error_failure_and_takeover_are_kept(
        self, s: Store, clock: FakeClock
    ) -> None:
        run_id = s.start_run("t", state={})
        first = claim(s, "w1", 10)
        clock.advance(1)
        assert s.release(first, error="ValueError: boom")
        second = claim(s, "w2", 10)
        clock.advance(12)  # w2's lease ran out: w3 takes the task over
        third = claim(s, "w3", 10)
        assert third.takeover
        clock.advance(3)
        assert commit(s, Commit(third, "fail", reason="gave_up", error="nope")).result == "ok"
        history = s.attempt_history(run_id)
        got = [(h.attempt, h.owner, h.outcome, h.error, h.taken_by) for h in history]
        assert got == [
            (1, "w1", "released", "ValueError: boom", None),
            (2, "w2", "taken_over", None, "w3"),
            (3, "w3", "failed", "nope", None),
        ]
        released, taken, failed = s.attempt_history(run_id)
        assert (released.claimed_at, released.ended_at) == (first.claimed_at, first.claimed_at + 1)
        # a takeover ends when the lease ran out; the next claim is when it was taken
        assert (taken.claimed_at, taken.ended_at) == (second.claimed_at, second.expires_at)
        assert third.claimed_at == second.expires_at + 2
        assert failed.ended_at == clock.now

    def test_a_dead_owners_released_lease_is_taken_over_at_the_release(
        self, s: Store, clock: FakeClock
    ) -> None:
        run_id = s.start_run("t")
        claim(s, "dead", 60)
        clock.advance(5)
        assert s.release_owner("dead") == 1
        released_at = clock.now
        clock.advance(0.5)
        assert claim(s, "w2").takeover
        (h,) = s.attempt_history(run_id)
        assert (h.outcome, h.owner, h.taken_by) == ("taken_over", "dead", "w2")
        assert h.ended_at == released_at

    def test_an_exhausted_claim_is_kept(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t")
        for owner in ("w1", "w2"):
            claim(s, owner, 1, max_attempts=2)
            clock.advance(2)
        assert s.claim("w3", TTL, max_attempts=2) is None  # attempt 3 fails the run instead
        outcomes = [(h.attempt, h.owner, h.outcome) for h in s.attempt_history(run_id)]
        assert outcomes == [
            (1, "w1", "taken_over"), (2, "w2", "taken_over"), (3, "w3", "exhausted"),
        ]  # fmt: skip
        run = s.get_run(run_id)
        assert run is not None and run.status == "failed"

    def test_a_retry_keeps_the_lease_it_dropped(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("t")
        claim(s, "holder")
        assert s.cancel_run(run_id) and s.retry_run(run_id)
        (h,) = s.attempt_history(run_id)
        assert (h.attempt, h.owner, h.outcome) == (1, "holder", "released")
        clock.advance(TTL)  # (the new generation waits for the dropped lease's end, B2)
        assert claim(s, "next").takeover is False  # the retry dropped it: no takeover

    def test_refused_zombie_writes_are_listed_per_run(self, s: Store, clock: FakeClock) -> None:
        other = s.start_run("t")
        run_id = s.start_run("t")
        zombie = claim(s, "zombie", 5)
        assert zombie.run_id == other
        clock.advance(6)
        claim(s, "w2")
        assert s.compare_and_set(zombie, 0, {"late": True}).value == "lease_lost"
        assert not s.renew(zombie, TTL)
        refused = s.run_rejections(other)
        assert [(r.owner, r.attempt, r.op) for r in refused] == [
            ("zombie", 1, "compare_and_set"), ("zombie", 1, "renew"),
        ]  # fmt: skip
        assert s.run_rejections(run_id) == []


def test_finished_since_counts_runs_per_bucket_by_outcome(s: Store, clock: FakeClock) -> None:
    start = clock.now
    for step, outcome in enumerate(["ok", "ok", "fail", "cancel", "ok"]):
        run_id = s.start_run("t", state={})
        clock.advance(30)
        if outcome == "cancel":
            assert s.cancel_run(run_id)
            continue
        lease = claim(s)
        if outcome == "ok":
            assert finish(s, lease, 0, {"step": step}).value == "ok"
        else:
            assert commit(s, Commit(lease, "fail", reason="x")).result == "ok"
    s.start_run("t")  # still pending: not counted
    got = [(b.start - start, b.succeeded, b.failed, b.cancelled)
           for b in s.finished_since(start, 60)]  # fmt: skip
    assert got == [(0, 1, 0, 0), (60, 1, 1, 0), (120, 1, 0, 1)]
    # a bounded read: only the newest runs count
    assert sum(b.succeeded for b in s.finished_since(start, 60, newest=2)) == 1
    assert s.finished_since(clock.now + 1, 60) == []


class TestBatchedFinishes:
    def test_each_finish_of_a_batch_is_judged_on_its_own_and_keeps_who_committed(
        self, s: Store, clock: FakeClock
    ) -> None:
        """A batch of finishes (one statement on PostgreSQL: ``FINISH``): a stale revision
        and a lost lease are refused where they are, the others are written, each with its
        own state and result, and each done task names the attempt and owner that committed."""
        for _ in range(4):
            s.start_run("t", state={})
        leases = s.claim("w1", TTL, limit=4)
        assert len(leases) == 4
        assert s.release(leases[3])  # then someone else holds it: this lease is a zombie's
        assert s.claim("w2", TTL) is not None
        clock.advance(1)
        commits = [
            Commit(lease, "finish", expected_revision=5 if i == 1 else 0, new_state={"i": i},
                   result=i)
            for i, lease in enumerate(leases)
        ]  # fmt: skip
        out = s.commit_many(commits)
        assert [r.value for r in out.results] == ["ok", "conflict", "ok", "lease_lost"]
        for i in (0, 2):
            run = s.get_run(leases[i].run_id)
            assert (run.status, run.state, run.result) == ("succeeded", {"i": i}, i)
            assert run.revision == 1
            (task,) = s.get_tasks(leases[i].run_id)
            assert (task.done_owner, task.done_attempt) == ("w1", 1)
        moved = s.get_run(leases[1].run_id)
        assert (moved.status, moved.state, moved.revision) == ("running", {}, 0)
        assert s.renew(leases[1], TTL)  # the conflict left its lease live
        assert s.get_run(leases[3].run_id).status == "running"  # w2 holds it
        assert [r.op for r in s.fence_rejections()] == ["finish"]

    def test_each_advance_of_a_batch_is_judged_on_its_own_and_enqueues_its_next_task(
        self, s: Store, clock: FakeClock
    ) -> None:
        """A batch of advances (one statement on PostgreSQL: ``ADVANCE``): refused where
        the revision moved or the lease was lost; written, each with its own next task (payload,
        delay, queue) that becomes its run's head, where it matched."""
        for _ in range(4):
            s.start_run("t", state={})
        leases = s.claim("w1", TTL, limit=4)
        assert s.release(leases[3])
        assert s.claim("w2", TTL) is not None  # leases[3] is a zombie's now
        commits = [
            Commit(lease, "advance", expected_revision=5 if i == 1 else 0, new_state={"i": i},
                   next_task="u", next_payload={"i": i}, next_queue="other" if i == 2 else None,
                   delay=30 if i == 0 else 0)
            for i, lease in enumerate(leases)
        ]  # fmt: skip
        out = s.commit_many(commits)
        assert [r.value for r in out.results] == ["ok", "conflict", "ok", "lease_lost"]
        assert s.get_run(leases[2].run_id).queue == "other"
        assert s.get_run(leases[1].run_id).revision == 0
        (due,) = s.claim("w3", TTL, limit=4)  # run 0's next task waits 30 s; 1 and 3 are held
        assert (due.run_id, due.task, due.payload, due.queue) == (leases[2].run_id, "u", {"i": 2},
                                                                  "other")  # fmt: skip
        assert s.get_run(due.run_id).state == {"i": 2}
        clock.advance(31)
        later = s.claim("w3", TTL, queues=["default"])  # the other leases are still live
        assert later is not None and (later.run_id, later.payload) == (leases[0].run_id, {"i": 0})
        done = [t for t in s.get_tasks(leases[0].run_id) if t.name == "t"]
        assert [(t.done_owner, t.done_attempt) for t in done] == [("w1", 1)]
