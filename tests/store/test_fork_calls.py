"""A fork and paid calls (B24 with B13), on every backend: answers are kept per step, so a fork's
steps (new steps, from step N on) pay anew, with new idempotency keys, and find none of the
source's answers, while the fork's own answers are reused by its own next attempts as any
step's are; the source's kept calls and intents stay as they were."""

from __future__ import annotations

from helpers import FakeClock
from once_helpers import REQ, TTL, Bill, claim, ctx_of

from workerproc.once import CallBook
from workerproc.store import Commit, Store


def test_a_fork_pays_its_steps_anew_and_keeps_the_source_s_answers_apart(
    s: Store, clock: FakeClock, book: CallBook
) -> None:
    bill = Bill()
    source = s.start_run("a", None, {"n": 0})
    step1 = claim(s, "w1")
    assert ctx_of(step1, book).once("llm", REQ, bill) == {"text": "answer 1"}
    advance = Commit(step1, "advance", new_state={"n": 1}, next_task="b", next_payload={})
    assert s.commit_many([advance]).results[0].value == "ok"
    step2 = claim(s, "w1")
    ctx = ctx_of(step2, book)
    # answers are kept per step: the source's own step 2 did not find step 1's either
    assert ctx.once("llm", REQ, bill) == {"text": "answer 2"} and bill.calls == 2
    source_key = ctx.once_key("llm", REQ)
    failed = Commit(step2, "fail", reason="gave_up", error="the model said no")
    assert s.commit_many([failed]).results[0].value == "ok"
    kept, made = s.paid_calls(source), s.call_timeline(source)
    assert [(c.task_id, c.name) for c in kept] == [(step1.task_id, "llm"), (step2.task_id, "llm")]

    new = s.fork(source, from_step=2)
    lease = claim(s, "w2")
    assert (lease.run_id, lease.task, lease.state) == (new, "b", {"n": 1})
    forked = ctx_of(lease, book)
    # step 2 of the fork is new work: it does not reuse the source's step 2 answer
    assert forked.once("llm", REQ, bill) == {"text": "answer 3"} and bill.calls == 3
    assert forked.last_once is not None and not forked.last_once.reused
    assert forked.once_key("llm", REQ) != source_key  # a new idempotency key for the provider
    # ... and its own next attempt reuses what it paid, as any step's does (B13)
    clock.advance(TTL + 1)
    again = claim(s, "w3")
    assert again.task_id == lease.task_id and again.takeover
    assert ctx_of(again, book).once("llm", REQ, bill) == {"text": "answer 3"}
    assert bill.calls == 3
    assert [(c.task_id, c.reused) for c in s.paid_calls(new)] == [(lease.task_id, 1)]
    # the source's calls are its own, untouched (no reuse counted, no intent added)
    assert s.paid_calls(source) == kept and s.call_timeline(source) == made
