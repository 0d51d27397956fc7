"""What a worker declares when it boots, and the small threads it runs beside its slots.

At boot, on the conductor's connection: the app's per-task options, where every worker's claims
read them (B11); its limits, whose numbers every claim obeys (B12); its schedules (B16). Then,
in the first ``FIRERS`` workers of a pool only (two: one may be dying or restarting; more would
only contend for the same ticks), the schedules' firer (``ticker``) when the app declares any,
and the webhooks' waker (``courier``, B20) when the worker serves the webhooks' queue. Each
thread opens its own store (``background.py``) and is closed with the worker.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from .app import App
from .config import WorkerConfig
from .courier import Courier
from .delivery import serves_webhooks
from .logs import event
from .outage import Outage
from .status import StatusSlot
from .store import WorkerStore
from .store.limits import TOO_LARGE
from .ticker import Ticker

log = logging.getLogger("workerproc.worker")

FIRERS = 2  # the workers of a pool (its first indexes) that fire the schedules, wake webhooks


class Services:
    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        open_store: Callable[[], WorkerStore],
        outage: Outage,
        slot: StatusSlot | None,
    ) -> None:
        self.app = app
        self.config = config
        self._open_store = open_store
        self.outage = outage
        self.firer = slot is None or slot.index < FIRERS  # fires schedules, wakes webhooks
        self.ticker: Ticker | None = None  # the schedules' firer, when the app declares any
        self.courier: Courier | None = None  # the webhooks' waker (B20)

    def boot(self, store: WorkerStore) -> None:
        """Declare the app's tasks, limits and schedules; start the threads this worker runs."""
        store.register_tasks(self.app.task_options())
        for told in store.declare_limits(self.app.limits, by=socket.gethostname()):
            kind = TOO_LARGE if told.startswith("task ") else "limit_redeclared"
            event(log, kind, told, level=logging.WARNING)
        self._start_schedules(store)
        self._start_courier()

    def _start_schedules(self, store: WorkerStore) -> None:
        """The app's schedules, written where every worker sees them, and fired by a small
        thread (``ticker``) of a firer; an app without schedules fires none."""
        specs = self.app.schedule_specs()
        if not specs:
            return
        for told in store.declare_schedules(specs, by=socket.gethostname()):
            event(log, "schedule_redeclared", told, level=logging.WARNING)
        if not self.firer:
            return
        self.ticker = Ticker(self._open_store, self.outage)
        self.ticker.start()

    def _start_courier(self) -> None:
        """B20: the webhooks' waker, in a firer that serves the webhooks' queue (it signals
        parked deliveries; the delivering is any worker's)."""
        if not serves_webhooks(self.config.queues) or not self.firer:
            return
        self.courier = Courier(self._open_store, self.outage)
        self.courier.start()

    def close(self) -> None:
        if self.ticker is not None:
            self.ticker.close()
        if self.courier is not None:
            self.courier.close()
