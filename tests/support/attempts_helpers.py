"""Attempts and takeovers: a worker's command line, pausing a real worker past its lease, a
lapse on the fake clock, and a store stand-in for the heartbeat."""

from __future__ import annotations

import signal
import time
from typing import Any

import psutil
from helpers import FakeClock, wait_for
from procs import Proc
from store_backends import TTL

from workerproc.store import Lease, Renewal


def lapse(clock: FakeClock, ttl: float = TTL) -> None:
    clock.advance(ttl + 0.001)


WORKER = ["--app", "apps.attempts_app:app", "--lease-ttl", "1", "--poll-interval", "0.05",
          "--max-attempts", "3", "--concurrency", "2"]  # fmt: skip
PAUSE = 1.6  # past the 1 s ttl: every lease the worker holds lapses meanwhile


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def pause(worker: Proc, seconds: float = PAUSE) -> None:
    worker.signal(signal.SIGSTOP)
    wait_for(lambda: stopped(worker.pid), timeout=10, interval=0.001, what="the worker stopped")
    time.sleep(seconds)  # the pause itself is what is under test
    worker.signal(signal.SIGCONT)


class Renewals:
    """A store stand-in for the heartbeat: renews everything, records what each round marked."""

    def __init__(self) -> None:
        self.starting: list[list[int]] = []

    def renew_each(self, leases: list[Lease], ttl: float, *, starting: Any = ()) -> list[Renewal]:
        self.starting.append([lease.task_id for lease in starting])
        return [Renewal(time.time() + ttl) for _ in leases]

    def close(self) -> None:
        pass
