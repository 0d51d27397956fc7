"""Cancel in flight (B15), the store's part, on every backend: the renewal of a
lease whose run was cancelled answers ``cancelled`` (and still renews it, so its holder can drop
the task under its own fence), and no write of the holder changes the run after the cancel."""

from __future__ import annotations

import pytest
from helpers import FakeClock
from store_backends import TTL, advance, claim, commit, finish

from workerproc.store import CasResult, Commit, Lease, Renewal, Store


class TestCancelInFlightStore:
    def test_the_renewal_answers_cancelled_after_cancel_run(
        self, s: Store, clock: FakeClock
    ) -> None:
        cancelled_run = s.start_run("a")
        other_run = s.start_run("b")
        doomed, alive = s.claim("w1", TTL, limit=2)
        assert {doomed.run_id, alive.run_id} == {cancelled_run, other_run}
        if doomed.run_id != cancelled_run:
            doomed, alive = alive, doomed
        assert s.renew_each([doomed, alive], TTL) == [
            Renewal(clock.now + TTL, cancelled=False),
            Renewal(clock.now + TTL, cancelled=False),
        ]
        assert s.cancel_run(cancelled_run)
        clock.advance(5)
        # still renewed (its holder drops the task under its own fence), and told
        assert s.renew_each([doomed, alive], TTL) == [
            Renewal(clock.now + TTL, cancelled=True),
            Renewal(clock.now + TTL, cancelled=False),
        ]
        assert s.renew_many([doomed, alive], TTL) == [clock.now + TTL, clock.now + TTL]
        assert s.fence_rejections() == []
        # the holder ends its lease: the run stays cancelled, its task pending for a retry
        before = s.get_run(cancelled_run)
        error = "RunCancelled: the run was cancelled while this task ran"
        assert commit(s, Commit(doomed, "release", error=error)).result is CasResult.OK
        assert s.get_run(cancelled_run) == before
        assert s.renew_each([doomed], TTL) == [Renewal(None)]  # the lease is gone
        assert s.retry_run(cancelled_run)
        again = claim(s, "w2")
        assert (again.run_id, again.attempt, again.tries) == (cancelled_run, doomed.attempt + 1, 1)

    def test_a_lost_lease_of_a_cancelled_run_answers_lost(self, s: Store, clock: FakeClock) -> None:
        run_id = s.start_run("a")
        lease = claim(s)
        assert s.cancel_run(run_id)
        clock.advance(TTL + 1)
        assert s.renew_each([lease], TTL) == [Renewal(None)]
        assert [r.op for r in s.fence_rejections()] == ["renew"]

    @pytest.mark.parametrize(
        "kind", ["finish", "advance", "compare_and_set", "fail", "release", "retry_after"]
    )
    def test_no_write_of_the_holder_changes_a_cancelled_run(
        self, s: Store, clock: FakeClock, kind: str
    ) -> None:
        """Whatever the holder of a cancelled run's lease sends (a handler that did not hear of
        the cancel yet), the run stays as the cancel left it, and no next task appears; the
        commits that would have moved the run answer ``conflict``."""
        run_id = s.start_run("a", state={"n": 0})
        lease = claim(s)
        assert s.cancel_run(run_id)
        before = s.get_run(run_id)
        tasks_before = s.get_tasks(run_id)
        clock.advance(1)
        result = _send(s, lease, kind)
        expected = CasResult.OK if kind in ("release", "retry_after") else CasResult.CONFLICT
        assert result is expected
        assert s.get_run(run_id) == before  # state, revision, status, result, error, times
        tasks = s.get_tasks(run_id)
        assert [t.id for t in tasks] == [t.id for t in tasks_before]  # no next task
        if kind not in ("release", "retry_after"):  # a release ends the lease on the task only
            assert tasks == tasks_before
        assert s.claim("w2", TTL) is None  # nothing of a cancelled run is ever claimed again


def _send(s: Store, lease: Lease, kind: str) -> CasResult:
    if kind == "finish":
        return finish(s, lease, 0, {"n": 1}, result={"r": 1})
    if kind == "advance":
        return advance(s, lease, 0, {"n": 1}, "b")
    if kind == "compare_and_set":
        return s.compare_and_set(lease, 0, {"n": 1})
    if kind == "fail":
        commit_ = Commit(lease, "fail", reason="task_attempts_exhausted", error="Boom: late")
        return commit(s, commit_).result
    if kind == "release":
        return commit(s, Commit(lease, "release", delay=1, error="Boom: late")).result
    return commit(s, Commit(lease, "retry_after", delay=1, error="RetryAfter: 1s")).result
