"""The worker pool: who is alive, reaping, exit classification, replacement backoff.

No fork and no database here: spawning goes through a ``Spawner`` (``forking.fork_worker`` in
production, a fake in unit tests) and ``waitpid`` and the clock are injectable, so every reap and
backoff decision is testable without processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from workerproc import exitcodes as wexit
from workerproc.store.backoff import backoff

from ..config import Timing
from .signals import name as signal_name

Clock = Callable[[], float]
WaitPid = Callable[[int, int], tuple[int, int]]


class Spawner(Protocol):
    def __call__(self, slot: int, max_tasks: int | None) -> tuple[int, str]:
        """Start a worker in status slot ``slot``; return its pid and owner string."""
        ...


class ExitKind(enum.StrEnum):
    STOPPED = "stopped"  # exit 0: it was asked to stop, or stopped on its own accord
    RECYCLED = "recycled"  # reached its task budget; a planned replacement
    RETIRED = "retired"  # the supervisor asked it to go (scale down, reload, memory, stop)
    CRASHED = "crashed"  # anything else: a non-zero code or a killing signal
    BOOT_FAILURE = "boot_failure"  # cannot boot: replacing it cannot help


@dataclass
class WorkerProcess:
    """One forked worker process as the supervisor keeps it: pid, slot, owner and why it is
    stopping (the worker's own loop is ``workerproc.worker``)."""

    pid: int
    slot: int
    owner: str
    generation: int
    started_at: float
    max_tasks: int | None = None
    retiring: str | None = None  # why the supervisor asked it to stop; None while active
    term_sent_at: float | None = None
    killed: bool = False  # SIGKILL sent by the supervisor
    expected_death: bool = False  # someone (chaos, say) killed it on purpose: not a crash

    @property
    def active(self) -> bool:
        return self.retiring is None


@dataclass(frozen=True)
class Exit:
    worker: WorkerProcess
    code: int | None  # exit code, or None when a signal killed it
    signal: int | None
    ran_for: float
    kind: ExitKind
    backoff: float = 0.0  # seconds until the next spawn is allowed (crash loop)

    def describe(self) -> str:
        if self.signal is not None:
            how = f"killed by {signal_name(self.signal)}"
        else:
            assert self.code is not None
            how = f"exited with code {self.code} ({wexit.describe(self.code)})"
        return (
            f"worker {self.worker.pid} (index {self.worker.slot}) {how} after {self.ran_for:.1f}s"
        )


def imports_app(generation: int) -> bool:
    """Generation 0 runs the app the supervisor imported at start; every later generation (after
    a reload) imports it in the worker itself, right after fork, so the supervisor never runs code
    that arrived after it started."""
    return generation > 0


def classify(code: int | None, worker: WorkerProcess, ran_for: float) -> ExitKind:
    if code == wexit.BOOT_FAILURE:
        return ExitKind.BOOT_FAILURE
    if worker.retiring is not None or worker.killed or worker.expected_death:
        return ExitKind.RETIRED
    if code == wexit.OK:
        return ExitKind.STOPPED
    if code == wexit.RECYCLE:
        return ExitKind.RECYCLED
    return ExitKind.CRASHED


@dataclass
class Pool:
    spawner: Spawner
    timing: Timing = field(default_factory=Timing)
    capacity: int = 256
    clock: Clock = time.monotonic
    kill: Callable[[int, int], None] = os.kill
    waitpid: WaitPid = os.waitpid
    workers: dict[int, WorkerProcess] = field(default_factory=dict)
    target: int = 1
    generation: int = 0
    crash_streak: int = 0  # boot crashes in a row (a worker dead within crash_window)
    next_spawn_at: float = 0.0
    # Other children we forked (the reload's import probe): pid -> wait status once reaped, None
    # while it runs. ``reap`` collects every child with waitpid(-1), so it must know them: they
    # are neither workers nor strangers to ignore, and their exit status is someone's answer.
    helpers: dict[int, int | None] = field(default_factory=dict)

    # -- views -------------------------------------------------------------------------------
    def active(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.active]

    def _free_slot(self) -> int | None:
        used = {w.slot for w in self.workers.values()}
        return next((i for i in range(self.capacity) if i not in used), None)

    # -- spawning ----------------------------------------------------------------------------
    def backoff_remaining(self) -> float:
        return max(0.0, self.next_spawn_at - self.clock())

    def spawn(self, max_tasks: int | None = None) -> WorkerProcess | None:
        """Start one worker now (the caller checked backoff); None when no slot is free."""
        slot = self._free_slot()
        if slot is None:
            return None
        pid, owner = self.spawner(slot, max_tasks)
        worker = WorkerProcess(pid, slot, owner, self.generation, self.clock(), max_tasks)
        self.workers[pid] = worker
        return worker

    def spawn_failed(self) -> float:
        """fork() itself failed (EAGAIN, ENOMEM, ...): back off like a boot crash."""
        return self._crashed_early(self.clock())

    def _crashed_early(self, now: float) -> float:
        self.crash_streak += 1
        # no jitter: one supervisor, nobody to herd with; the delays stay what the README says
        delay = backoff(self.crash_streak, self.timing.backoff_base, self.timing.backoff_cap, 0.0)
        self.next_spawn_at = max(self.next_spawn_at, now + delay)
        return delay

    def kill_on_purpose(self, worker: WorkerProcess, signum: int = signal.SIGKILL) -> bool:
        """A fault injected on purpose (chaos): the death is not a crash and triggers no
        backoff; its leases follow --fast-release like any other death."""
        worker.expected_death = True
        return self.send(worker, signum)

    # -- stopping ----------------------------------------------------------------------------
    def send(self, worker: WorkerProcess, signum: int) -> bool:
        """Send ``signum``; False when the process is already gone (ESRCH is normal). Only to a
        worker not reaped yet: until ``reap`` collects it, its pid cannot be another process's
        (a dead child stays a zombie), while once reaped the pid may be reused at once (a
        chaos pause's SIGCONT 4 s later, say, on a machine whose pids wrap at 32,768)."""
        if self.workers.get(worker.pid) is not worker:
            return False
        try:
            self.kill(worker.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def retire(self, worker: WorkerProcess, why: str, signum: int = signal.SIGTERM) -> None:
        """Ask ``worker`` to finish its current task and exit; it no longer counts as active."""
        if worker.retiring is None:
            worker.retiring = why
        if worker.term_sent_at is None:
            worker.term_sent_at = self.clock()
            self.send(worker, signum)

    def kill_now(self, worker: WorkerProcess, why: str) -> None:
        worker.retiring = worker.retiring or why
        worker.killed = True
        self.send(worker, signal.SIGKILL)

    def overdue(self, grace: float) -> list[WorkerProcess]:
        """Retiring workers that were asked to stop more than ``grace`` seconds ago."""
        now = self.clock()
        return [
            w
            for w in self.workers.values()
            if w.term_sent_at is not None and not w.killed and now - w.term_sent_at > grace
        ]

    # -- reaping -----------------------------------------------------------------------------
    def reap(self) -> list[Exit]:
        """Collect every exited child without blocking; classify each of ours."""
        exits: list[Exit] = []
        while True:
            try:
                pid, status = self.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in self.helpers:
                self.helpers[pid] = status
                continue
            worker = self.workers.pop(pid, None)
            if worker is not None:
                exits.append(self.record_exit(worker, status))
        return exits

    def record_exit(self, worker: WorkerProcess, status: int) -> Exit:
        now = self.clock()
        ran_for = now - worker.started_at
        code: int | None = None
        killed_by: int | None = None
        if os.WIFSIGNALED(status):
            killed_by = os.WTERMSIG(status)
        else:
            code = os.waitstatus_to_exitcode(status)
        kind = classify(code, worker, ran_for)
        backoff = 0.0
        if kind is ExitKind.CRASHED and ran_for < self.timing.crash_window:
            backoff = self._crashed_early(now)
        elif ran_for >= self.timing.crash_window:
            self.crash_streak = 0
        return Exit(worker, code, killed_by, ran_for, kind, backoff)

    def as_crash(self, ex: Exit) -> Exit:
        """``ex`` reclassified as a crash (a worker that exited 0 still holding a lease, say),
        with the crash-loop backoff a crash that early earns."""
        early = ex.ran_for < self.timing.crash_window
        backoff = self._crashed_early(self.clock()) if early else 0.0
        return dataclasses.replace(ex, kind=ExitKind.CRASHED, backoff=backoff)

    # -- helper children -----------------------------------------------------------------------
    def adopt_helper(self, pid: int) -> None:
        self.helpers[pid] = None

    def helper_running(self, pid: int) -> bool:
        """Forked by us and not reaped yet: its pid cannot have been reused, safe to signal."""
        return pid in self.helpers and self.helpers[pid] is None

    def forget_helper(self, pid: int) -> None:
        self.helpers.pop(pid, None)

    def forget(self, pid: int) -> None:
        with contextlib.suppress(KeyError):
            del self.workers[pid]
