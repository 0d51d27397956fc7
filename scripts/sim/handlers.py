"""The simulated app: its tasks, its limit, and what each handler execution does.

An execution's plan is fixed when it begins, from the seed, its task and its attempt (never
from the order of the schedule), so a shrunk schedule replays the same handlers. A plan is
a list of steps the scheduler takes one at a time: an optional paid call (``intent``, ``fn``,
``keep``: ``ctx.once``'s three moments), batches of streamed output (``emit``) and a last
word. The last word is made into the commit
the worker's real code would write (``execution.failure`` for a raise: release with backoff,
or fail on the last try).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from workerproc.config import WorkerConfig
from workerproc.execution import failure
from workerproc.store import Commit, Lease, TaskOptions
from workerproc.store.codec import WAIT_FOREVER
from workerproc.store.limits import LimitSpec
from workerproc.store.newrun import NewRun

from .world import MAX_ATTEMPTS

LIMIT = "g"
TASKS = {
    "job": TaskOptions(limits=(LIMIT,), max_attempts=MAX_ATTEMPTS),
    "free": TaskOptions(max_attempts=MAX_ATTEMPTS),
    "child": TaskOptions(limits=(LIMIT,), max_attempts=MAX_ATTEMPTS),
    "resume": TaskOptions(max_attempts=MAX_ATTEMPTS),
    "join": TaskOptions(max_attempts=MAX_ATTEMPTS),
}
LIMITS = {LIMIT: LimitSpec.declare(LIMIT, concurrency=2)}
ROOTS = ("job", "free")  # what producers start
WAIT_TIMEOUT = 40.0  # a wait's timeout (a timed-out wait resumes with no signal)
MAX_WAITS = 2  # waits per run, at most
SIGNAL = "go"

# the last words, weighted, per task
LAST_WORDS: dict[str, tuple[tuple[str, int], ...]] = {
    "job": (("finish", 4), ("raise", 3), ("retry_after", 1), ("wait", 2), ("spawn", 2)),
    "free": (("finish", 4), ("raise", 3), ("retry_after", 1), ("wait", 2), ("spawn", 1)),
    "child": (("finish", 5), ("raise", 2), ("retry_after", 1)),
    "resume": (("finish", 4), ("raise", 1), ("wait", 3)),
    "join": (("finish", 5), ("raise", 1)),
}


@dataclass(frozen=True)
class Plan:
    steps: tuple[str, ...]  # "intent", "fn", "keep", then the last word
    pause_retry: bool = False

    @property
    def last(self) -> str:
        return self.steps[-1]


def plan(seed: int, lease: Lease) -> Plan:
    """What this execution does: the same for the same seed, task and attempt."""
    rng = random.Random(f"{seed}/{lease.task_id}/{lease.attempt}")
    words = LAST_WORDS[lease.task]
    last = rng.choices([w for w, _ in words], [n for _, n in words])[0]
    waits = int((lease.payload or {}).get("waits", 0)) if isinstance(lease.payload, dict) else 0
    if last == "wait" and waits >= MAX_WAITS:
        last = "finish"
    paid = lease.task in ("job", "free", "child") and rng.random() < 0.5
    steps = ("intent", "fn", "keep", last) if paid else (last,)
    pause_retry = rng.random() < 0.3
    emits = rng.choice((0, 0, 1, 2))  # batches of output it streams before its last word
    steps = (*steps[:-1], *("emit",) * emits, steps[-1])
    return Plan(steps, pause_retry=pause_retry)


def last_word(
    lease: Lease, p: Plan, config: WorkerConfig, answer: object, rng: random.Random
) -> Commit:
    """The commit the worker's code writes for the handler's last word."""
    state = lease.state
    if p.last == "finish":
        return Commit(lease, "finish", expected_revision=lease.revision, new_state=state,
                      result={"attempt": lease.attempt, "answer": answer})  # fmt: skip
    if p.last == "raise":
        return failure(lease, RuntimeError("simulated handler error"), config)
    if p.last == "retry_after":
        return Commit(lease, "retry_after", delay=2.0, pause=p.pause_retry,
                      error="RetryAfter: simulated")  # fmt: skip
    if p.last == "wait":
        waits = int((lease.payload or {}).get("waits", 0)) if isinstance(lease.payload, dict) else 0
        timeout = WAIT_TIMEOUT if rng.random() < 0.7 else WAIT_FOREVER
        return Commit(lease, "wait", expected_revision=lease.revision, new_state=state,
                      next_task="resume", next_payload={"waits": waits + 1}, delay=timeout,
                      wait_for=f"signal:{SIGNAL}")  # fmt: skip
    if p.last == "spawn":
        n = rng.randint(0, 2)
        children = tuple(NewRun.from_item({"task": "child", "payload": {"k": i}})
                         for i in range(n))  # fmt: skip
        return Commit(lease, "spawn", expected_revision=lease.revision, new_state=state,
                      next_task="join", next_payload={}, delay=WAIT_FOREVER,
                      children=children)  # fmt: skip
    raise AssertionError(p.last)
