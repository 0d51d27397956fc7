"""A worker's row in the store's list of worker processes (``store.workers()``),
written by its heartbeat thread: at start, then every heartbeat period, and deleted when the
worker stops cleanly. A failure to write it is told like any other outage (``Outage``) and
never stops the worker: the row is for people and producers, the leases are what count."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Sequence

from . import __version__
from .identity import parse_owner
from .outage import Outage
from .store import StoreError, WorkerInfo, WorkerStore


class Presence:
    def __init__(
        self,
        owner: str,
        *,
        every: float,
        slots: int,
        queues: Sequence[str] | None,
        tasks: Sequence[str] | None = None,
        draining: Callable[[], bool],
        outage: Outage,
    ) -> None:
        parsed = parse_owner(owner)
        started = float(parsed.start_time) if parsed is not None else 0.0
        self.info = WorkerInfo(owner, socket.gethostname(), os.getpid(), started, every, slots,
                               None if queues is None else tuple(queues), __version__,
                               tasks=None if tasks is None else tuple(tasks))  # fmt: skip
        self.every = every
        self.draining = draining
        self.outage = outage
        self.listed = False  # its row was written once at least

    def beat(self, store: WorkerStore) -> None:
        """The worker is alive now (its first beat also clears rows long silent)."""
        state = "draining" if self.draining() else "running"
        try:
            store.worker_seen(dataclasses.replace(self.info, state=state),
                              starting=not self.listed)  # fmt: skip
        except StoreError as exc:
            self.outage.failed("worker list", exc)
            return
        self.listed = True

    def leave(self, store: WorkerStore) -> None:
        """The worker stops cleanly: its row goes."""
        if not self.listed:
            return
        try:
            store.worker_gone(self.info.owner)
        except StoreError as exc:
            self.outage.failed("worker list", exc)
