"""Shared test helpers: an injectable clock and bounded waits on state (never bare sleeps)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import TypeVar

from workerproc.events import (
    Event,
    HandlerStuck,
    HeartbeatDied,
    LeaseLost,
    Post,
    Reaction,
    RunCancelled,
    TaskTimedOut,
)
from workerproc.heartbeat import Heartbeat
from workerproc.store import Commit, Lease, Store
from workerproc.worker import Worker

T = TypeVar("T")


class FakeClock:
    """A clock the test moves by hand: no test sleeps for a ttl."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def wait_for(
    predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds.

    Bounds are generous on purpose (a loaded 2-core CI machine): tests assert behaviour, and
    benchmarks under scripts/ measure speed.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


class Drains(Worker):
    """A worker in-process that stops (as TERM would) once nothing is pending in the
    database: tests run it to the end with ``run()``."""

    def _wait(self, want: int) -> None:
        if self.store.stats().pending_work == 0 and not self.holdings.running:
            self.signals.stop = signal.SIGTERM
            return
        super()._wait(want)


def unstarted_heartbeat(ttl: float = 30.0) -> Heartbeat:
    """A real heartbeat whose thread never starts: it keeps the leases it is given (``track``,
    ``confirmed_at``) and renews none. For the parts of a worker that only record leases."""

    def no_store() -> Store:
        raise AssertionError("the heartbeat was not meant to start")

    return Heartbeat(no_store, ttl=ttl, interval=ttl / 3, post=reports())


def reports(
    on_lost: Callable[[Lease, str], object] | None = None,
    on_timeout: Callable[[Lease], object] | None = None,
    on_death: Callable[[BaseException], object] | None = None,
    on_stuck: Callable[[Lease], object] | None = None,
    on_cancelled: Callable[[Lease], object] | None = None,
) -> Post:
    """A heartbeat's ``post`` for tests: each kind of report to its own callable (none: ignored);
    what a callable returns that is a ``Reaction`` is the heartbeat's to carry out."""

    def post(report: Event) -> Reaction | None:
        answer: object = None
        match report:
            case LeaseLost(lease, why) if on_lost is not None:
                answer = on_lost(lease, why)
            case TaskTimedOut(lease) if on_timeout is not None:
                answer = on_timeout(lease)
            case HeartbeatDied(error) if on_death is not None:
                answer = on_death(error)
            case HandlerStuck(lease) if on_stuck is not None:
                answer = on_stuck(lease)
            case RunCancelled(lease) if on_cancelled is not None:
                answer = on_cancelled(lease)
        return answer if isinstance(answer, Reaction) else None

    return post


def failed_at_step_two(s: Store) -> int:
    """A run that entered two steps (``a`` with {"n": 0}, ``b`` with {"n": 1}) and failed in
    ``b``: what a fork from a step starts from."""
    run_id = s.start_run("a", {"p": 1}, {"n": 0})
    lease = s.claim("w", 60)
    assert lease is not None
    advance = Commit(lease, "advance", new_state={"n": 1}, next_task="b", next_payload={})
    assert s.commit_many([advance]).results[0].value == "ok"
    lease = s.claim("w", 60)
    assert lease is not None
    failed = Commit(lease, "fail", reason="gave_up", error="boom")
    assert s.commit_many([failed]).results[0].value == "ok"
    return run_id
