"""Every failure is said where the user looks.

- A run that fails logs one line at warning level (run, task, reason, error), whoever decided
  it: the handler's last attempt, or the store inside a claim (attempts spent, an unknown task).
- ``start --drain`` counts the runs that failed during it on its last line, and with
  ``--fail-on-failed`` exits 16 when there are any.
- A value that cannot be stored (``InvalidPayload``) fails its run at once: no retry can fix it.
- ``@app.task(limits=[])`` means no limits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Drains, FakeClock
from store_backends import TTL, claim
from sv_harness import Supervisor

from supervisor import exitcodes
from supervisor.config import StartConfig, start_config
from supervisor.errors import ConfigError
from workerproc import App, RetryAfter, TaskContext
from workerproc import exitcodes as worker_exits
from workerproc.completer import Completer
from workerproc.config import WorkerConfig
from workerproc.store import (
    ClaimRequest,
    Commit,
    InvalidPayload,
    Lease,
    RunFailure,
    Store,
    open_store,
)
from workerproc.store.calls import MAX_RESULT

APP = "apps.failures_app:app"


def failed_lines(sv: Supervisor) -> list[dict[str, Any]]:
    return sv.events("run_failed")


def test_every_failed_run_is_one_warning_line_and_fail_on_failed_exits_16(
    sv_each: Supervisor,
) -> None:
    """On both backends: on PostgreSQL the failures a claim's exchange decided before it looked
    at the gates went unsaid (their events were written, and forgotten, in that round trip)."""
    sv = sv_each
    typo = sv.enqueue("draft")
    unstorable = sv.enqueue("unstorable")
    fine = [sv.enqueue("fine") for _ in range(2)]
    assert sv.start("--drain", n=1, app=APP).wait_exit(60) == exitcodes.OK  # not asked to fail
    lines = {line["run_id"]: line for line in failed_lines(sv)}
    assert set(lines) == {unstorable}, sv.text()
    assert all(line["level"] == "warning" for line in lines.values())
    assert lines[unstorable]["reason"] == "invalid_payload"
    assert "not JSON-serializable" in lines[unstorable]["msg"]
    # the typo's step ("sumarise") is no task of the app: no worker claims it (B22), the run
    # waits for one that serves it, and the drain ends without it, saying so
    (finished,) = sv.events("drain_finished")
    assert "3 runs done, 1 failed, 1 of them during this drain" in finished["msg"], finished
    assert "1 run left waiting: no worker serves task sumarise" in finished["msg"], finished
    store = open_store(sv.db)
    try:
        (task,) = store.get_tasks(unstorable)
        assert task.attempts == 1  # failed at once: no retry could write a set as JSON
        assert {store.get_run(r).status for r in fine} == {"succeeded"}  # type: ignore[union-attr]
        assert store.get_run(typo).status == "pending"  # type: ignore[union-attr]
        assert [t.attempts for t in store.get_tasks(typo)] == [1, 0]  # draft ran; sumarise not
    finally:
        store.close()

    # the next drain: the old failures are not its own
    assert sv.start("--drain", "--fail-on-failed", n=1, app=APP).wait_exit(60) == exitcodes.OK
    sv.enqueue("unstorable")
    sv.enqueue("fine")
    code = sv.start("--drain", "--fail-on-failed", n=1, app=APP).wait_exit(60)
    assert code == exitcodes.RUNS_FAILED, sv.text()
    last = sv.events("drain_finished")[-1]
    assert last["failed_in_drain"] == 1
    assert "1 run failed during the drain: exiting 16" in sv.text()


def test_fail_on_failed_needs_drain() -> None:
    with pytest.raises(ConfigError, match="--fail-on-failed needs --drain"):
        start_config({"db": "lk.db", "app": APP, "fail_on_failed": True})
    config = start_config({"db": "lk.db", "app": APP, "fail_on_failed": True, "drain": True})
    assert isinstance(config, StartConfig) and config.fail_on_failed


def test_a_run_the_claim_fails_is_logged_by_the_worker_that_claimed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """R6 decided inside the store: the claim that would start a fourth attempt fails the run;
    the worker whose exchange it was says so, once."""
    clock = FakeClock()
    store = open_store(str(tmp_path / "lk.db"), clock=clock)
    try:
        run_id = store.start_run("poison")
        for i in range(3):  # three handlers began and died with their workers
            assert store.claim(f"gone{i}", 10.0) is not None
            clock.advance(10.001)
        completer = Completer(store, 10.0, _NoRenewals(), clock=clock)
        with caplog.at_level(logging.WARNING, logger="workerproc.worker"):
            leases = completer.commit_and_claim((), ClaimRequest("w", 10.0, 3, 1))
        assert leases == ()
        (line,) = [r for r in caplog.records if getattr(r, "event", None) == "run_failed"]
        assert line.levelno == logging.WARNING
        assert line.getMessage().startswith(f"run {run_id} (poison) failed: "
                                            "task_attempts_exhausted: 3 attempts")  # fmt: skip
    finally:
        store.close()


class _NoRenewals:
    def track(self, lease: Lease, lease_start: float) -> None:
        pass

    def untrack(self, leases: Any) -> None:
        pass


def test_an_unstorable_state_fails_the_run_at_once(tmp_path: Path) -> None:
    app = App()

    @app.task
    def step(ctx: TaskContext) -> None:
        ctx.advance({"at": object()}, next="step")

    store: Store = open_store(str(tmp_path / "lk.db"))
    try:
        run = app.run_inline(step, store=store, raise_errors=False)
        assert (run.status, run.failure_reason) == ("failed", "invalid_payload")
        (task,) = store.get_tasks(run.id)
        assert task.attempts == 1
    finally:
        store.close()


BAD = {"at": object()}  # no JSON for it
# each way a handler's own last word can hold a value that cannot be stored
LAST_WORDS: dict[str, Callable[[TaskContext], object]] = {
    "advance state": lambda ctx: ctx.advance(BAD, next="step"),
    "advance payload": lambda ctx: ctx.advance({}, next="step", payload=BAD),
    "advance next": lambda ctx: ctx.advance({}, next="no\x00name"),
    "advance delay": lambda ctx: ctx.advance({}, next="step", delay=-1),
    "finish result": lambda ctx: ctx.finish({}, result=BAD),
    "wait_for timeout": lambda ctx: ctx.wait_for("go", next="step", timeout=float("nan")),
    "spawn child": lambda ctx: ctx.spawn([{"task": "step", "payload": BAD}], then="step"),
    "return value": lambda ctx: BAD,
}


@pytest.mark.parametrize("last_word", sorted(LAST_WORDS))
def test_a_value_of_the_commit_itself_fails_the_run_at_once(last_word: str) -> None:
    """Every try writes the same value: ``InvalidCommit``, no retry."""
    app = App()
    tries: list[int] = []

    @app.task
    def step(ctx: TaskContext) -> object:
        tries.append(ctx.tries)
        return LAST_WORDS[last_word](ctx)

    run = app.run_inline(step, raise_errors=False)
    assert (run.status, run.failure_reason, tries) == ("failed", "invalid_payload", [1])
    assert run.last_error is not None and run.last_error.startswith("InvalidCommit: ")


def test_a_paid_answer_too_long_to_keep_is_retried() -> None:
    """``once``'s answer is the call's, not the commit's: a model may answer too long once and
    not the next time, so the step is retried (it used to fail the run at its first try)."""
    app = App()
    tries: list[int] = []

    @app.task
    def step(ctx: TaskContext) -> None:
        tries.append(ctx.tries)
        big = len(tries) == 1
        answer = ctx.once("llm", {"q": 1}, lambda: "x" * (MAX_RESULT + 10) if big else "ok")
        ctx.finish({"answer": answer})

    run = app.run_inline(step, raise_errors=False)
    assert (run.status, run.state, tries) == ("succeeded", {"answer": "ok"}, [1, 2])


def test_a_bad_token_count_of_a_paid_call_is_retried() -> None:
    app = App()
    tries: list[int] = []

    @app.task
    def step(ctx: TaskContext) -> None:
        tries.append(ctx.tries)
        used = -1 if len(tries) == 1 else 5  # a usage read from a flaky answer
        ctx.finish({"answer": ctx.once("llm", {"q": len(tries)}, lambda: "ok", tokens=used)})

    run = app.run_inline(step, raise_errors=False)
    assert (run.status, tries) == ("succeeded", [1, 2])


def test_an_invalid_payload_of_the_handlers_own_is_a_handler_error() -> None:
    """Raised by the handler's own code (not its commit): retried, then exhausted."""
    app = App()
    tries: list[int] = []

    @app.task
    def step(ctx: TaskContext) -> None:
        tries.append(ctx.tries)
        raise InvalidPayload("the upstream answer was not JSON")

    run = app.run_inline(step, raise_errors=False)
    assert (run.status, run.failure_reason, tries) == ("failed", "task_attempts_exhausted",
                                                       [1, 2, 3])  # fmt: skip


def test_a_commit_the_store_refuses_fails_the_run_at_once(db_path: str) -> None:
    """Write time: a commit built past the handler's API (no check at a call) holds a value
    the store cannot encode (a lone surrogate in the next task's name). The worker fails that
    task at once, as at the call: the same commit would be refused every try."""
    app = App()
    tries: list[int] = []

    @app.task
    def step(ctx: TaskContext) -> None:
        tries.append(ctx.tries)
        lease = ctx._lease
        ctx.commit = Commit(lease, "advance", expected_revision=lease.revision, new_state={},
                            next_task="\ud800")  # fmt: skip

    store = open_store(db_path)
    try:
        run_id = store.start_run("step")
        config = WorkerConfig(db=db_path, app="tests:app", poll_interval=0.05, max_attempts=3)
        worker = Drains(store, app, config, owner="host:1:1.00:w",
                        open_store=lambda: open_store(db_path))  # fmt: skip
        assert worker.run() == worker_exits.OK
        run = store.get_run(run_id)
        assert run is not None and (run.status, run.failure_reason, tries) == (
            "failed", "invalid_payload", [1])  # fmt: skip
    finally:
        store.close()


def test_an_empty_list_of_limits_means_none() -> None:
    app = App()

    @app.task(limits=[])
    def step(ctx: TaskContext) -> None:
        return None

    assert step.options.limits is None and step.options.declared == {}
    with pytest.raises(ValueError, match="tokens reserve from limits"):
        app.task("other", limits=[], tokens=5)(lambda ctx: None)


def test_failed_since_counts_the_runs_failed_from_a_moment_per_queue(
    s: Store, clock: FakeClock
) -> None:
    """What ``--drain`` counts as its own failures, on every backend."""

    def fail(run_id: int) -> None:
        lease = s.claim("w", 60.0)
        assert lease is not None and lease.run_id == run_id
        out = s.commit_many([Commit(lease, "fail", reason="broken", error="E: no")])
        assert out.failed == (RunFailure(run_id, "t", "broken", "E: no"),)

    fail(s.start_run("t"))
    since = clock.advance(1.0)
    fail(s.start_run("t", queue="other"))
    fail(s.start_run("t", queue="other"))
    assert s.failed_since(since) == {"other": 2}
    assert s.failed_since(since - 1.0) == {"default": 1, "other": 2}


def test_an_exchange_answers_every_run_it_failed(s: Store, clock: FakeClock) -> None:
    """``BatchOutcome.failed`` names every run the exchange failed, whether a commit or its own
    claim failed it, on every backend. PostgreSQL writes the events emitted so far in the
    round trip that locks the gates, in the middle of the claim: a failure read back from the
    events then was lost, and its run never got its warning line. A claim looks at the gates
    first or last, in turn: each case runs twice, with a claim of nothing (one turn) between,
    so that both orders are seen."""

    def last_try() -> None:  # a handler's last try, in the exchange that claims the next task
        doomed = s.start_run("t")
        s.start_run("t")
        lease = claim(s, "h")
        assert lease.run_id == doomed
        out = s.commit_many([Commit(lease, "fail", reason="broken", error="E: no")],
                            claim=ClaimRequest("h", TTL, 3, 1))  # fmt: skip
        assert out.failed == (RunFailure(doomed, "t", "broken", "E: no"),)
        (nxt,) = out.leases
        assert s.ack(nxt)

    def exhausted() -> None:  # the claim's own: a fourth attempt after three died
        poison = s.start_run("poison")
        for i in range(3):  # (three workers: a takeover of one's own lease would wait, B3)
            assert claim(s, f"gone{i}").run_id == poison
            clock.advance(TTL + 0.001)
        fine = s.start_run("t")
        out = s.commit_many((), claim=ClaimRequest("w", TTL, 3, 2))
        ((failed,), (lease,)) = out.failed, out.leases
        assert (failed.run_id, failed.task, failed.reason) == (
            poison, "poison", "task_attempts_exhausted")  # fmt: skip
        assert lease.run_id == fine and s.ack(lease)
        assert s.get_run(poison).status == "failed"  # type: ignore[union-attr]

    for case in (last_try, exhausted):
        case()
        assert s.claim("other", TTL, queues=["nowhere"]) is None  # the other order next
        case()


def test_a_handler_reads_its_try_within_the_budget() -> None:
    """``ctx.tries`` is what ``max_attempts`` bounds; ``ctx.attempt`` (the fencing token) also
    counts the claims that spent nothing (here a ``RetryAfter``)."""
    app = App()
    seen: list[tuple[int, int]] = []

    @app.task
    def step(ctx: TaskContext) -> None:
        seen.append((ctx.attempt, ctx.tries))
        if ctx.attempt == 1:
            raise RetryAfter(1.0)  # back without spending an attempt
        raise ValueError("again")

    run = app.run_inline(step, raise_errors=False, max_attempts=2)
    assert run.failure_reason == "task_attempts_exhausted"
    assert seen == [(1, 1), (2, 1), (3, 2)]


def test_every_log_line_names_an_attempt_and_its_try_alike(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App()

    @app.task
    def step(ctx: TaskContext) -> None:
        if ctx.attempt == 1:
            raise RetryAfter(1.0)
        raise ValueError("again")

    with caplog.at_level(logging.INFO, logger="workerproc.worker"):
        app.run_inline(step, raise_errors=False, max_attempts=2)
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("task 1 (step) attempt 1 (try 1 of 2): retry after") for m in lines)
    assert any(m.startswith("task 1 (step) attempt 2 (try 1 of 2) failed: ") for m in lines)
    assert any(m.startswith("task 1 (step) attempt 3 (try 2 of 2) failed: ") for m in lines)
