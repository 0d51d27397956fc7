"""Talking to a running supervisor through its pidfile: stop, reload, scale, health."""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

import psutil

from .. import exitcodes
from ..errors import ConfigError, NotRunning, ReloadFailed, SupervisorError
from ..loop.pidfile import (
    live_pid,
    read_state,
    state_age,
    state_path,
    state_touched_age,
    supervisor_pid,
)
from ..operations.render import plural


def send(pidfile: str, signum: int) -> int:
    pid = supervisor_pid(pidfile)  # checked: a live leasekeeper supervisor, never another pid
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise NotRunning(f"no supervisor is running: pid {pid} exited") from None
    except PermissionError:
        raise SupervisorError(f"not allowed to signal pid {pid} (run as its user)") from None
    return pid


def wait_gone(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def running_state(pidfile: str) -> dict[str, Any]:
    live_pid(pidfile)
    state = read_state(pidfile)
    if state is None or state.get("phase") == "starting":
        raise NotRunning(f"the supervisor behind {pidfile} is still starting; try again")
    return state


_SCALE = re.compile(r"^([+-]?)(\d+)$")


def parse_scale(spec: str) -> tuple[str, int]:
    """``N`` (absolute), ``+K`` or ``-K`` (relative) -> (sign, value); checked before any signal."""
    match = _SCALE.match(spec.strip())
    if not match:
        raise ConfigError(f"scale takes N, +K or -K (got {spec!r})")
    sign, digits = match.groups()
    if not sign and int(digits) < 1:
        raise ConfigError(f"cannot scale to {digits} workers: at least 1 must run")
    return sign, int(digits)


def scale_target(sign: str, value: int, current: int) -> int:
    target = current + value if sign == "+" else current - value if sign == "-" else value
    if target < 1:
        raise ConfigError(f"cannot scale to {target} workers: at least 1 must run")
    return target


@dataclass(frozen=True)
class ScaleResult:
    before: int
    after: int


def scale(pidfile: str, spec: str, timeout: float = 10.0) -> ScaleResult:
    """Send TTIN/TTOU one at a time, each confirmed by the state file (signals coalesce)."""
    sign, value = parse_scale(spec)
    current = int(running_state(pidfile)["target"])
    target = scale_target(sign, value, current)
    before = current
    while current != target:
        signum = signal.SIGTTIN if target > current else signal.SIGTTOU
        expected = current + (1 if target > current else -1)
        send(pidfile, signum)
        deadline = time.monotonic() + timeout
        while True:
            state = read_state(pidfile)
            if state is not None and int(state["target"]) == expected:
                current = expected
                break
            if time.monotonic() >= deadline:
                raise SupervisorError(
                    f"the supervisor did not confirm scaling to {expected} within {timeout:g}s"
                )
            time.sleep(0.02)
    return ScaleResult(before, target)


@dataclass(frozen=True)
class ReloadResult:
    id: int
    generation: int
    workers: int


def reload(pidfile: str, timeout: float) -> ReloadResult:
    """HUP, then wait until a reload the supervisor began after our signal is done or failed.

    The supervisor stamps each reload with the monotonic clock of the moment it read the HUP;
    CLOCK_MONOTONIC is one clock for every process of the machine, so "requested after we sent"
    is exact even when signals coalesce or another reload was under way (a HUP during a reload
    starts it over, so the reload we wait for saw the code as it was when we signalled).
    """
    sent = time.monotonic()
    pid = send(pidfile, signal.SIGHUP)
    deadline = sent + timeout
    seen: dict[str, Any] | None = None
    while True:
        state = read_state(pidfile)
        record = state.get("reload") if state and state.get("pid") == pid else None
        if isinstance(record, dict) and float(record.get("requested_monotonic", -1.0)) >= sent:
            seen = record
            if record.get("status") == "done":
                return ReloadResult(
                    int(record["id"]),
                    int(record.get("generation") or 0),
                    int(record.get("workers_on_generation") or 0),
                )
            if record.get("status") == "failed":
                raise ReloadFailed(
                    f"reload {record.get('id')} failed: {record.get('error')} "
                    "(the old workers keep serving)"
                )
        try:
            alive = live_pid(pidfile) == pid
        except NotRunning:
            alive = False
        if not alive:
            raise NotRunning(f"supervisor {pid} exited before the reload finished")
        if time.monotonic() >= deadline:
            raise SupervisorError(_reload_timeout(pid, timeout, seen, state))
        time.sleep(0.05)


def _reload_timeout(
    pid: int, timeout: float, seen: dict[str, Any] | None, state: dict[str, Any] | None
) -> str:
    if seen is None:
        return f"supervisor {pid} did not start the reload within {timeout:g}s"
    target = state.get("target") if state else "?"
    progress = (
        "still importing the new code"
        if seen.get("status") == "importing"
        else f"{seen.get('workers_on_generation')}/{target} workers on generation "
        f"{seen.get('generation')}"
    )
    return f"reload {seen.get('id')} did not finish within {timeout:g}s ({progress}); it goes on"


def _free(free: object) -> str:
    return f"{free} workers are free" if free != 1 else "1 worker is free"


def health(pidfile: str, max_age: float, max_stall: float = 60.0) -> tuple[int, str]:
    """(exit code, message): alive, ticking and making progress -> 0.

    A state file older than ``max_age`` whose mtime is fresh means the loop runs but cannot
    rewrite it (it touches the old file when a write fails): STATE_UNWRITABLE, not UNHEALTHY.
    """
    pid = live_pid(pidfile)
    state = read_state(pidfile)
    if state is None:
        return exitcodes.UNHEALTHY, f"supervisor {pid} is alive but wrote no state yet"
    age = state_age(state)
    if age > max_age:
        touched = state_touched_age(pidfile)
        if touched is not None and touched <= max_age:
            return exitcodes.STATE_UNWRITABLE, (
                f"supervisor {pid}: the main loop runs (last seen {touched:.1f}s ago) but cannot "
                f"write its state file {state_path(pidfile)} (last written {age:.1f}s ago): "
                "is the disk full or read-only?"
            )
        return exitcodes.UNHEALTHY, f"supervisor {pid}: main loop silent for {age:.1f}s"
    stalled = stalled_for(state)
    if stalled is not None and stalled >= max_stall:
        free = (state.get("progress") or {}).get("free", "?")
        return exitcodes.STALLED, (
            f"supervisor {pid}: no task claimed for {stalled:.1f}s although work is ready and "
            f"{_free(free)} (is the database read-only, locked or full?)"
        )
    workers = state.get("workers", [])
    return exitcodes.OK, (
        f"supervisor {pid} healthy: {state.get('phase')}, {plural(len(workers), 'worker')} "
        f"(target {state.get('target')}), last tick {age:.1f}s ago"
    )


def stalled_for(state: dict[str, Any]) -> float | None:
    """How long the pool has made no progress while work was ready (None: it has not stalled)."""
    progress = state.get("progress")
    since = progress.get("stalled_since") if isinstance(progress, dict) else None
    if not isinstance(since, (int, float)):
        return None
    return max(0.0, float(state.get("tick", time.time())) - float(since))
