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
from ..errors import ConfigError, NotRunning, SupervisorError
from ..loop.pidfile import live_pid, read_state, state_age


def send(pidfile: str, signum: int) -> int:
    pid = live_pid(pidfile)
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
    if state is None:
        raise NotRunning(f"the supervisor behind {pidfile} has not written its state yet")
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


def health(pidfile: str, max_age: float) -> tuple[int, str]:
    """(exit code, message): alive and ticking -> 0."""
    pid = live_pid(pidfile)
    state = read_state(pidfile)
    if state is None:
        return exitcodes.UNHEALTHY, f"supervisor {pid} is alive but wrote no state yet"
    age = state_age(state)
    if age > max_age:
        return exitcodes.UNHEALTHY, f"supervisor {pid}: main loop silent for {age:.1f}s"
    workers = state.get("workers", [])
    return exitcodes.OK, (
        f"supervisor {pid} healthy: {state.get('phase')}, {len(workers)} workers "
        f"(target {state.get('target')}), last tick {age:.1f}s ago"
    )
