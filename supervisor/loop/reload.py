"""Reload on SIGHUP, as a small state machine the main loop drives: importing -> rolling -> done,
or failed. The loop never blocks on the new code and the supervisor never imports it.

1. **Requested** (the HUP is read): ``reloading`` is emitted at once (sd_notify sends
   ``RELOADING=1`` with ``MONOTONIC_USEC``), then an **import probe** is forked: a short-lived
   child that imports the app afresh and writes ``ok`` or ``error <line>`` to a pipe the loop
   also waits on. Meanwhile the loop keeps reaping, pinging the watchdog and running chaos. A
   probe past ``Timing.reload_import_timeout`` is killed: the reload failed.
2. **Rolling** (the probe said ok): a new generation; ``steps.roll`` adds one new worker (which
   imports the app itself, after fork), waits until it claims, retires one old; repeat.
3. **Done**: every active worker is of the new generation and claiming; ``ready`` is emitted
   again (``READY=1``).
4. **Failed**: the import failed, or a worker of the new generation could not boot (exit 3 or
   77), or ``reload_crash_limit`` of them died at start in a row, or one did not claim within
   ``reload_boot_timeout``. The new generation's workers are retired, the previous generation
   is the pool's again (so replacements run what ran before), the old workers keep serving.
   ``reload_failed`` is emitted (``READY=1`` with ``STATUS=reload failed: …``: the service is
   still up), and the failure stays in the state file and ``STATUS=`` until the next good one.

A HUP while a reload is under way starts over from step 1 (the code may have changed again): the
running probe is killed, and the new reload rolls every worker that is not of its generation.
Each reload has an id, counting up; the state file carries the latest one (``reload --wait``
waits for a reload requested after it sent its HUP).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from workerproc import exitcodes as wexit

from ..errors import SupervisorError
from ..logs import event
from .forking import one_line
from .pool import Exit, ExitKind
from .signals import name as signal_name

if TYPE_CHECKING:
    from .arbiter import Arbiter


class ReloadStatus(enum.StrEnum):
    IMPORTING = "importing"  # the import probe runs
    ROLLING = "rolling"  # new-generation workers replace the old, one at a time
    DONE = "done"
    FAILED = "failed"


class Probe(Protocol):
    """A running import probe, as the loop sees it (``forking.ImportProbe`` in production)."""

    pid: int
    fd: int

    def read(self) -> bool: ...  # take what the pipe holds; True once the probe closed it

    @property
    def message(self) -> str: ...  # "ok …" or "error <one line>"

    def close(self) -> None: ...


@dataclass
class Reload:
    id: int
    requested: float  # the loop's monotonic clock when the HUP was read
    started: float  # wall clock, for people
    previous_generation: int  # what the pool runs again if this reload fails
    status: ReloadStatus = ReloadStatus.IMPORTING
    generation: int | None = None  # being rolled out; set once the probe passed
    error: str | None = None
    finished: float | None = None
    boot_crashes: int = 0  # new-generation workers that died at start, in a row

    @property
    def in_progress(self) -> bool:
        return self.status in (ReloadStatus.IMPORTING, ReloadStatus.ROLLING)


@dataclass
class Reloads:
    start_probe: Callable[[], Probe] | None = None
    current: Reload | None = None
    count: int = 0
    highest_generation: int = 0  # generations are never reused, even after a failed reload
    probe: Probe | None = None
    probe_started: float = 0.0
    leftover: list[int] = field(default_factory=list)  # probes done with, until reaped

    # -- views -------------------------------------------------------------------------------
    @property
    def rolling(self) -> bool:
        return self.current is not None and self.current.status is ReloadStatus.ROLLING

    @property
    def in_progress(self) -> bool:
        return self.current is not None and self.current.in_progress

    @property
    def failure(self) -> str | None:
        """The last reload's error while no later reload succeeded (or is under way)."""
        r = self.current
        return r.error if r is not None and r.status is ReloadStatus.FAILED else None

    def snapshot(self, arb: Arbiter) -> dict[str, Any] | None:
        r = self.current
        if r is None:
            return None
        on_new = [
            w for w in arb.pool.active() if w.generation == r.generation and arb.is_up(w)
        ]  # fmt: skip
        return {
            "id": r.id,
            "status": str(r.status),
            "generation": r.generation,
            "previous_generation": r.previous_generation,
            "error": r.error,
            "requested_monotonic": r.requested,
            "started": round(r.started, 3),
            "finished": None if r.finished is None else round(r.finished, 3),
            "workers_on_generation": len(on_new),
        }

    # -- transitions -------------------------------------------------------------------------
    def request(self, arb: Arbiter) -> None:
        """The HUP was read: say RELOADING at once, then start the import probe."""
        superseded = self.current if self.in_progress else None
        self._drop_probe(arb)
        self.count += 1
        previous = superseded.previous_generation if superseded else arb.pool.generation
        r = Reload(self.count, arb.clock(), time.time(), previous)
        self.current = r
        arb.state_dirty = True
        if arb.stopping:
            self._conclude_failed(arb, "the supervisor is stopping", notify=False)
            return
        if superseded is not None:
            event("reload_superseded", f"reload {superseded.id} superseded by reload {r.id}")
        arb.events.emit("reloading", id=r.id)
        event("reload_requested", f"reload {r.id}: importing the app in a probe", id=r.id)
        if self.start_probe is None:
            self.fail(arb, "this supervisor cannot import the app afresh")
            return
        try:
            probe = self.start_probe()
        except (OSError, SupervisorError) as exc:
            self.fail(arb, f"cannot start the import probe: {exc}")
            return
        self.probe = probe
        self.probe_started = arb.clock()
        arb.pool.adopt_helper(probe.pid)
        arb.inbox.extra_fds.add(probe.fd)

    def step(self, arb: Arbiter) -> None:
        """A loop step (after ``reap``): read the probe's answer, or give up on it."""
        self._bury(arb)
        probe = self.probe
        if probe is None:
            return
        eof = probe.read()
        if eof:
            arb.inbox.extra_fds.discard(probe.fd)  # at EOF the pipe would wake every select
        status = arb.pool.helpers.get(probe.pid)
        if not eof or (not probe.message and status is None):  # no answer yet
            limit = arb.config.timing.reload_import_timeout
            deadline = self.probe_started + limit
            if arb.clock() >= deadline:
                self.fail(arb, f"importing {arb.config.worker.app} took longer than {limit:g}s")
            else:
                arb.wake_at(deadline)
            return
        message = probe.message
        self._drop_probe(arb, kill=False)  # it answered: it exits on its own, reaped later
        if message.startswith("ok"):
            self._begin_roll(arb)
        elif message.startswith("error "):
            self.fail(arb, message[len("error ") :])
        else:
            self.fail(arb, f"the import probe {_death(status)} before it answered")

    def worker_exited(self, arb: Arbiter, ex: Exit) -> bool:
        """A reaped worker: True when it was of the rolling generation and failed the reload."""
        r = self.current
        if not self.rolling or r is None or ex.worker.generation != r.generation:
            return False
        if ex.code in (wexit.BOOT_FAILURE, wexit.APP_IMPORT):
            self.fail(arb, f"{ex.describe()}: it cannot boot on the new code")
            return True
        if ex.kind is ExitKind.CRASHED and ex.ran_for < arb.config.timing.crash_window:
            r.boot_crashes += 1
            limit = arb.config.timing.reload_crash_limit
            if r.boot_crashes >= limit:
                last = ex.describe()
                self.fail(arb, f"{limit} new workers died at start in a row (last: {last})")
                return True
        elif ex.kind is not ExitKind.RETIRED:
            r.boot_crashes = 0
        return False

    def finish(self, arb: Arbiter) -> None:
        """Every active worker runs the new generation and claims: the reload is done."""
        r = self.current
        if r is None or r.status is not ReloadStatus.ROLLING:
            return
        r.status = ReloadStatus.DONE
        r.finished = time.time()
        arb.state_dirty = True
        event(
            "reloaded",
            f"reload {r.id} finished: {len(arb.pool.active())} workers on generation "
            f"{r.generation}",
            id=r.id,
            generation=r.generation,
        )
        arb.events.emit("ready", reload=True)

    def fail(self, arb: Arbiter, error: str) -> None:
        """Give the reload up: the previous generation is the pool's again; old workers serve."""
        r = self.current
        if r is None or not r.in_progress:
            return
        self._drop_probe(arb)
        pool = arb.pool
        if pool.generation != r.previous_generation:
            pool.generation = r.previous_generation
            for worker in pool.active():
                if worker.generation != r.previous_generation:
                    pool.retire(worker, "reload failed")
        self._conclude_failed(arb, error, notify=True)

    def abandon(self, arb: Arbiter) -> None:
        """The supervisor stops: a reload under way ends failed, and no probe is left behind."""
        if self.in_progress:
            self._drop_probe(arb)
            self._conclude_failed(arb, "the supervisor is stopping", notify=False)

    # -- internals ---------------------------------------------------------------------------
    def _begin_roll(self, arb: Arbiter) -> None:
        r = self.current
        assert r is not None
        self.highest_generation = max(self.highest_generation, arb.pool.generation) + 1
        r.generation = self.highest_generation
        r.status = ReloadStatus.ROLLING
        arb.pool.generation = r.generation
        arb.state_dirty = True
        event(
            "reloading",
            f"reload {r.id}: the app imports cleanly; rolling {len(arb.pool.active())} workers "
            f"to generation {r.generation}",
            id=r.id,
            generation=r.generation,
        )

    def _conclude_failed(self, arb: Arbiter, error: str, *, notify: bool) -> None:
        r = self.current
        assert r is not None
        r.status = ReloadStatus.FAILED
        r.error = one_line(error)
        r.finished = time.time()
        arb.state_dirty = True
        event(
            "reload_failed",
            f"reload {r.id} failed, the running workers keep serving: {r.error}",
            level=logging.ERROR,
            id=r.id,
            error=r.error,
        )
        if notify:
            arb.events.emit("reload_failed", error=r.error)

    def _drop_probe(self, arb: Arbiter, *, kill: bool = True) -> None:
        probe, self.probe = self.probe, None
        if probe is None:
            return
        arb.inbox.extra_fds.discard(probe.fd)
        probe.close()
        if arb.pool.helper_running(probe.pid):  # not reaped: its pid is still ours to signal
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    arb.pool.kill(probe.pid, signal.SIGKILL)
            self.leftover.append(probe.pid)
        else:
            arb.pool.forget_helper(probe.pid)

    def _bury(self, arb: Arbiter) -> None:
        for pid in list(self.leftover):
            if not arb.pool.helper_running(pid):
                arb.pool.forget_helper(pid)
                self.leftover.remove(pid)


def _death(status: int | None) -> str:
    if status is None:
        return "closed its pipe"
    if os.WIFSIGNALED(status):
        return f"was killed by {signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"
