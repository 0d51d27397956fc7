"""systemd's notify protocol (``Type=notify``) and its watchdog, without a dependency.

The protocol is one datagram of ``KEY=VALUE`` lines sent to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace). What we send:

- ``READY=1`` (with ``MAINPID=`` and a ``STATUS=``) on the arbiter's ``ready`` event: every one of
  the N workers entered its claim loop;
- ``RELOADING=1`` (with ``MONOTONIC_USEC=``) on ``reloading``, as soon as the loop reads the
  SIGHUP and before the new code is imported, then ``READY=1`` when every worker runs the new
  generation (the ``ready`` event again, ``reload=True``), or ``READY=1`` with
  ``STATUS=reload failed: …`` on ``reload_failed``: the service is up on its old workers, and
  systemd leaves its reloading state only on READY (``supervisor reload --wait``, the unit's
  ``ExecReload=``, carries the failure to ``systemctl reload``);
- ``STOPPING=1`` on ``stopping`` (graceful or fast);
- ``STATUS=`` with workers and queue counts when it changes, at most every ``STATUS_EVERY`` s,
  from the cached probe (no database round trip of its own);
- ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC``, from a step of the main loop and only while it
  is healthy: the step sits after ``reap`` in the turn (so a turn that reaches it has reaped), and
  the database answered within ``db_stale_after``. A wedged loop or a dead database stops the
  petting and systemd restarts the unit.

The socket is opened per message and closed at once: nothing survives into a forked worker. The
variables are removed from our environment once read (like ``sd_notify(unset_environment=1)``)
so workers and the programs they start never talk to systemd in our name.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ..logs import event
from ..loop.arbiter import Arbiter, Step
from .probe import StatsProbe

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"
STATUS_EVERY = 5.0  # STATUS= refresh (and the probe's read interval when nothing needs faster)
SEND_TIMEOUT = 1.0  # a full socket buffer must never block the loop for long


def socket_address(value: str) -> str | None:
    """``$NOTIFY_SOCKET`` as an address for ``sendto``; None for kinds we do not speak."""
    if value.startswith("@"):
        return "\0" + value[1:]  # the abstract namespace
    if value.startswith("/"):
        return value
    return None  # vsock: and other transports of newer systemd versions


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between two ``WATCHDOG=1``: half of ``$WATCHDOG_USEC``, when it is meant for us."""
    raw = environ.get(ENV_WATCHDOG_USEC, "")
    owner = environ.get(ENV_WATCHDOG_PID, "")
    try:
        usec = int(raw)
        if owner and int(owner) != pid:
            return None  # set for another process (a wrapper that exec'd a child, say)
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier:
    """Sends notify datagrams; a failure is logged once per streak and never raised."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sent: int = 0
        self._failing = False

    def send(self, *assignments: str) -> bool:
        data = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT)
                sock.sendto(data, self.address)
        except OSError as exc:
            if not self._failing:
                event(
                    "notify_failed",
                    f"cannot notify systemd at {self.address.lstrip(chr(0))}: {exc}",
                    level=logging.WARNING,
                )
            self._failing = True
            return False
        self._failing = False
        self.sent += 1
        return True


@dataclass
class SystemdNotify:
    notifier: Notifier
    probe: StatsProbe
    watchdog_every: float | None = None
    db_stale_after: float = 30.0
    status_every: float = STATUS_EVERY
    last_ping: float | None = None
    last_status: str = ""
    status_at: float | None = None
    withheld: str | None = None  # why the watchdog is not being petted (logged on change)
    pings: int = 0
    _arb: Arbiter | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str], probe: StatsProbe) -> SystemdNotify | None:
        value = environ.pop(ENV_SOCKET, "")
        every = watchdog_interval(environ, os.getpid())
        environ.pop(ENV_WATCHDOG_USEC, None)
        environ.pop(ENV_WATCHDOG_PID, None)
        address = socket_address(value) if value else None
        if address is None:
            if value:
                event("notify_unsupported", f"ignoring NOTIFY_SOCKET={value!r}: not a path")
            return None
        self = cls(Notifier(address), probe, watchdog_every=every)
        probe.want_every(min(STATUS_EVERY, every) if every else STATUS_EVERY)
        if every is not None:
            # Stale means several probes missed, and never less than the watchdog timeout itself.
            self.db_stale_after = max(2 * every, 3 * (probe.every or every))
        return self

    # -- wiring ------------------------------------------------------------------------------
    def install(self, arb: Arbiter) -> None:
        self._arb = arb
        arb.events.on("ready", self.on_ready)
        arb.events.on("reloading", self.on_reloading)
        arb.events.on("reload_failed", self.on_reload_failed)
        arb.events.on("stopping", self.on_stopping)
        arb.add_step(Step("notify", self.step), before="finish")
        if self.watchdog_every is not None:
            event(
                "watchdog_enabled",
                f"systemd watchdog: pinging every {self.watchdog_every:g}s while healthy",
                every=self.watchdog_every,
            )

    def on_ready(self, reload: bool = False, **_: Any) -> None:
        fields = ["READY=1", self._status_field()]
        if not reload:
            fields.insert(1, f"MAINPID={os.getpid()}")
        self.notifier.send(*fields)

    def on_reloading(self, **_: Any) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={usec}", self._status_field())

    def on_reload_failed(self, **_: Any) -> None:
        self.notifier.send("READY=1", self._status_field())

    def on_stopping(self, why: str = "", fast: bool = False, **_: Any) -> None:
        self.notifier.send("STOPPING=1", self._status_field())

    # -- the step ----------------------------------------------------------------------------
    def step(self, arb: Arbiter) -> None:
        now = arb.clock()
        if self.status_at is None or now - self.status_at >= self.status_every:
            text = self._status_text()
            if text != self.last_status:
                self.notifier.send(self._status_field(text))
            self.status_at = now
        arb.wake_at(self.status_at + self.status_every)
        if self.watchdog_every is None:
            return
        problem = self.health(arb)
        if problem != self.withheld:
            if problem is None:
                event("watchdog_resumed", "healthy again: petting the systemd watchdog")
            else:
                event(
                    "watchdog_withheld",
                    f"not petting the watchdog: {problem}",
                    level=logging.WARNING,
                )
            self.withheld = problem
        if problem is None and (
            self.last_ping is None or now - self.last_ping >= self.watchdog_every
        ):
            if self.notifier.send("WATCHDOG=1"):
                self.pings += 1
            self.last_ping = now
        arb.wake_at((self.last_ping or now) + self.watchdog_every)

    def health(self, arb: Arbiter) -> str | None:
        """None when healthy; else why. Reaching this step already proves the loop turns."""
        age = self.probe.age(arb.clock())
        if age is None:
            return "the database has not answered yet"
        if age > self.db_stale_after:
            why = f" ({self.probe.error})" if self.probe.error else ""
            return f"the database has not answered for {age:.1f}s{why}"
        return None

    def _status_text(self) -> str:
        return status_line(self._arb, self.probe) if self._arb else "starting"

    def _status_field(self, text: str | None = None) -> str:
        self.last_status = self._status_text() if text is None else text
        return "STATUS=" + self.last_status


def status_line(arb: Arbiter, probe: StatsProbe) -> str:
    """One line for ``systemctl status``: workers, then the queue from the cached probe."""
    pool = arb.pool
    active = pool.active()
    up = sum(1 for w in active if arb.is_up(w))
    reloads = arb.reloads
    current = reloads.current
    if arb.stopping:
        head = f"{arb.phase}: {len(pool.workers)} workers finishing"
    elif reloads.in_progress and current is not None and current.generation is None:
        head = f"reloading: importing the new code; {up}/{pool.target} workers up"
    elif reloads.in_progress:
        on_new = sum(1 for w in active if w.generation == pool.generation and arb.is_up(w))
        head = f"reloading: {on_new}/{pool.target} workers on generation {pool.generation}"
    else:
        head = f"{up}/{pool.target} workers up"
    if reloads.failure and not arb.stopping:
        head = f"reload failed: {reloads.failure}; {head}"
    stats = probe.stats
    if stats is None:
        return f"{head}; queue not read yet"
    runs = stats.runs
    queue = (
        f"queue: {stats.ready} ready, {stats.delayed} delayed, {stats.leased} leased, "
        f"{stats.expired} expired; runs: {runs.get('pending', 0) + runs.get('running', 0)} "
        f"open, {runs.get('succeeded', 0)} succeeded, {runs.get('failed', 0)} failed"
    )
    if probe.error:
        queue += f" (stale: {probe.error})"
    return f"{head}; {queue}"
