"""A lane thread's ``Senders`` kept across deliveries: after a wide webhook's delivery, a
narrow one's (its window smaller) keeps no more sender threads, nor their posters' kept
connections to its receiver, than its window (one job at a time never goes round them)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, ClassVar

from workerproc.window import Senders, Slot


class Context:
    """A sender's context (a poster in the deliverer): which thread made it."""

    lock: ClassVar[threading.Lock] = threading.Lock()
    threads: ClassVar[list[threading.Thread]] = []

    def __init__(self) -> None:
        self.thread = threading.current_thread()
        with Context.lock:
            Context.threads.append(self.thread)


def alive(most: int) -> int:
    """The sender threads that made a context and still run, once at most ``most`` (10 s)."""
    deadline = time.monotonic() + 10
    while True:
        with Context.lock:
            n = sum(t.is_alive() for t in Context.threads)
        if n <= most or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


def test_a_shrunk_pool_does_not_spread_one_at_a_time_jobs_over_the_wider_pools_threads() -> None:
    Context.threads.clear()
    senders = Senders(Context, 8)
    answers: queue.SimpleQueue[tuple[Slot, Any]] = queue.SimpleQueue()
    gate = threading.Barrier(8)
    for _ in range(8):  # a webhook at 8: eight senders at once
        senders.submit(lambda c: gate.wait(5), answers, None)  # type: ignore[arg-type]
    for _ in range(8):
        answers.get(timeout=10)
    senders.size = 1  # the next delivery, a webhook at 1: one POST at a time
    used = set()
    for _ in range(64):
        senders.submit(lambda c: id(c), answers, None)  # type: ignore[arg-type]
        used.add(answers.get(timeout=10)[1])
        time.sleep(0.002)
    assert len(used) == 1, f"one POST at a time went through {len(used)} senders' posters"
    assert alive(1) <= 1, "sender threads kept beyond a window of 1"


def test_a_shrink_under_busy_senders_loses_no_job_and_ends_the_extra_threads() -> None:
    """A smaller size while every sender is busy (an earlier delivery's POSTs, left when it
    raised): the new job waits for one of them, is run, and the threads beyond end."""
    Context.threads.clear()
    senders = Senders(Context, 8)
    answers: queue.SimpleQueue[tuple[Slot, Any]] = queue.SimpleQueue()
    left: queue.SimpleQueue[tuple[Slot, Any]] = queue.SimpleQueue()
    release = threading.Event()
    for _ in range(8):
        senders.submit(lambda c: release.wait(10), left, None)  # type: ignore[arg-type]
    senders.size = 1
    senders.submit(lambda c: "mine", answers, None)  # type: ignore[arg-type]
    release.set()
    assert answers.get(timeout=10)[1] == "mine"
    for _ in range(8):
        left.get(timeout=10)
    assert alive(1) <= 1, "sender threads kept beyond a window of 1"
    senders.size = 4  # and it grows again as needed
    gate = threading.Barrier(4)
    for _ in range(4):
        senders.submit(lambda c: gate.wait(5), answers, None)  # type: ignore[arg-type]
    for _ in range(4):
        assert answers.get(timeout=10)[1] is not None  # (a broken barrier: its error text)
