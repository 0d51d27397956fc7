"""The supervisor's main loop: a list of steps run in order, then a sleep until a signal or the
earliest moment some step asked to be woken.

The arbiter holds the shared state (phase, pool, exit code) and the actions steps take (stop,
fast stop, reload, scale). The steps themselves live in ``steps.py``. Later features plug in
without touching the loop: ``add_step`` inserts a step (chaos faults, watchdog pings, metrics),
and ``events.on`` subscribes to lifecycle events (``ready``, ``reloading``, ``reload_failed``,
``stopping``, ``worker_started``, ``worker_exited``, ``tick``). The reload state machine lives in
``reload.py``.
"""

from __future__ import annotations

import enum
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workerproc import App
from workerproc.status import StatusBoard
from workerproc.store import redact_url

from .. import exitcodes
from ..config import StartConfig
from ..logs import Progress, event
from .pidfile import Pidfile
from .pool import Pool, WorkerProcess
from .reload import Reloads
from .signals import SignalInbox
from .storegate import StoreGate

if TYPE_CHECKING:
    from workerproc.store.sqlite.watch import FileWatch


class Phase(enum.StrEnum):
    RUNNING = "running"
    STOPPING = "stopping"  # graceful: workers finish their task, then exit
    FAST_STOPPING = "fast_stopping"  # SIGKILL sent to every worker; reap, release, exit
    DONE = "done"


StepFn = Callable[["Arbiter"], None]


@dataclass
class Step:
    name: str
    run: StepFn


class Events:
    """A tiny synchronous event bus: subscribers run inside the main loop, never in a handler."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Callable[..., None]]] = defaultdict(list)

    def on(self, name: str, fn: Callable[..., None]) -> None:
        self._subscribers[name].append(fn)

    def emit(self, name: str, **data: Any) -> None:
        for fn in list(self._subscribers.get(name, ())):
            try:
                fn(**data)
            except Exception:  # a broken subscriber must not take the supervisor down
                logging.getLogger("supervisor").exception("event subscriber for %s failed", name)


@dataclass
class Arbiter:
    config: StartConfig
    app: App
    pool: Pool
    inbox: SignalInbox
    gate: StoreGate
    board: StatusBoard
    reloads: Reloads = field(default_factory=Reloads)
    pidfile: Pidfile | None = None
    progress: Progress | None = None
    clock: Callable[[], float] = time.monotonic
    phase: Phase = Phase.RUNNING
    exit_code: int = exitcodes.OK
    steps: list[Step] = field(default_factory=list)
    events: Events = field(default_factory=Events)
    ready_announced: bool = False
    stop_started_at: float | None = None
    started_at: float = 0.0
    drain_since: float | None = None  # --drain: the database's clock when it began
    drain_failed: int | None = None  # --drain: the runs that failed during it, once finished
    drain_watch: FileWatch | None = None  # --drain on SQLite: wakes the loop at a commit
    drain_changed: bool = False  # --drain: a commit was seen since the last drain check
    drain_settling: float = 0.0  # --drain: quick looks go on until then (a commit may not be done)
    pending_release: dict[str, float] = field(default_factory=dict)  # owner -> give up at
    last_run: dict[str, float] = field(default_factory=dict)  # periodic steps: last run
    state_dirty: bool = True
    extra_state: dict[str, Any] = field(default_factory=dict)  # more keys for the state file
    rng: random.Random = field(default_factory=random.Random)  # jitter of max tasks per worker
    # run when the loop is done, in order; each may change the exit code (chaos: violations)
    exit_hooks: list[Callable[[Arbiter, int], int]] = field(default_factory=list)
    _wake_at: float = float("inf")

    # -- the loop ----------------------------------------------------------------------------
    def add_step(self, step: Step, *, before: str | None = None) -> None:
        """Insert ``step`` before the step named ``before`` (or at the end)."""
        names = [s.name for s in self.steps]
        index = names.index(before) if before in names else len(self.steps)
        self.steps.insert(index, step)

    def run(self) -> int:
        self.started_at = self.clock()
        event(
            "supervisor_started",
            f"supervisor started: {self.config.workers} workers, app {self.config.worker.app}, "
            f"db {redact_url(self.config.worker.db)}",
            workers=self.config.workers,
            app=self.config.worker.app,
            db=redact_url(self.config.worker.db),
        )
        while not self.done:
            self.turn()
            if not self.done:
                self.inbox.wait(max(0.0, self._wake_at - self.clock()))
        for hook in self.exit_hooks:
            self.exit_code = hook(self, self.exit_code)
        return self.exit_code

    def turn(self) -> None:
        """One pass over the steps, in order (stops early once the arbiter is done)."""
        self._wake_at = self.clock() + self.config.timing.tick
        for step in self.steps:
            step.run(self)
            if self.done:
                break

    def wake_at(self, when: float) -> None:
        """Ask the loop to run again no later than ``when`` (monotonic seconds)."""
        self._wake_at = min(self._wake_at, when)

    def due(self, name: str, every: float) -> bool:
        """For periodic steps: True (and remembered) when ``every`` seconds passed since last."""
        now = self.clock()
        last = self.last_run.get(name)
        if last is not None and now - last < every:
            self.wake_at(last + every)
            return False
        self.last_run[name] = now
        self.wake_at(now + every)
        return True

    # -- actions -----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def stopping(self) -> bool:
        return self.phase is not Phase.RUNNING

    def stop(self, why: str, exit_code: int = exitcodes.OK) -> None:
        """Graceful stop: every worker finishes its task; --graceful-timeout later, SIGKILL."""
        if exit_code != exitcodes.OK and self.exit_code == exitcodes.OK:
            self.exit_code = exit_code
        if self.stopping:
            return
        self.phase = Phase.STOPPING
        self.stop_started_at = self.clock()
        self.reloads.abandon(self)
        event(
            "stopping",
            f"graceful stop ({why}): {len(self.pool.workers)} workers finish their tasks, "
            f"timeout {self.config.worker.graceful_timeout:g}s",
            why=why,
        )
        self.events.emit("stopping", why=why, fast=False)
        for worker in list(self.pool.workers.values()):
            self.pool.retire(worker, "stop")
        self.state_dirty = True

    def fast_stop(self, why: str) -> None:
        """Kill every worker now; their leases are released as they are reaped."""
        if self.phase in (Phase.FAST_STOPPING, Phase.DONE):
            return
        self.phase = Phase.FAST_STOPPING
        self.stop_started_at = self.clock()
        self.reloads.abandon(self)
        event("fast_stop", f"fast stop ({why}): killing {len(self.pool.workers)} workers", why=why)
        self.events.emit("stopping", why=why, fast=True)
        for worker in list(self.pool.workers.values()):
            self.pool.kill_now(worker, "fast stop")
        self.state_dirty = True

    def reload(self) -> None:
        """HUP: RELOADING at once, then an import probe and a rolling restart (see reload.py)."""
        self.reloads.request(self)

    def scale(self, delta: int) -> None:
        if self.stopping:
            return
        before = self.pool.target
        self.pool.target = max(1, before + delta)
        if self.pool.target != before:
            event(
                "scaled",
                f"scaling from {before} to {self.pool.target} workers",
                before=before,
                after=self.pool.target,
            )
        self.state_dirty = True

    # -- views -------------------------------------------------------------------------------
    @property
    def rolling(self) -> bool:
        """A HUP rolling restart is replacing workers."""
        return self.reloads.rolling

    def is_up(self, worker: WorkerProcess) -> bool:
        """The worker has entered its claim loop (it published its phase)."""
        state = self.board.read(worker.slot)
        return state is not None and state.pid == worker.pid
