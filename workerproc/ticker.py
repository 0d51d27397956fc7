"""The schedules' firer (B16): a small thread in every worker, with its own store.

It fires every due schedule (``Store.fire_schedules``: one transaction per schedule, a
compare-and-set on its next tick, so exactly one firer on any host starts each tick's run), then
sleeps until the earliest next tick, or ``REFRESH`` seconds when that is further (a schedule
another host declares meanwhile is seen then). Nothing due costs one cheap read per wake-up,
never the write lock; every wait is bounded. A failing database is told once per incident
(``Outage``) and tried again after ``RETRY`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .background import StoreThread
from .logs import event
from .outage import Outage
from .store import StoreError, WorkerStore

log = logging.getLogger("workerproc.worker")

REFRESH = 30.0  # the longest sleep: a schedule declared elsewhere is fired at most this late
# (by this firer: the host that declared it fires it on time with its own)
RETRY = 1.0  # after a failed look
MIN_WAIT = 0.05  # a tick still due after a look (another firer is at it): look again this soon


class Ticker(StoreThread):
    name = "ticker"
    what = "the schedules' thread"

    def __init__(self, open_store: Callable[[], WorkerStore], outage: Outage) -> None:
        super().__init__(open_store, outage)
        self.fired = 0  # runs this worker's ticker started
        self._broken = False  # the last look failed other than by the database (told once)

    def turn(self, store: WorkerStore) -> None:
        self.sleep(self.step(store))

    def step(self, store: WorkerStore) -> float:
        """Fire what is due; the seconds to sleep before the next look."""
        try:
            for fired in store.fire_schedules():
                if not fired.run_ids:
                    continue  # its missed ticks were skipped
                self.fired += len(fired.run_ids)
                event(log, "schedule_fired", f"schedule {fired.name!r} started runs "
                      f"{fired.run_ids}", level=logging.DEBUG, schedule=fired.name,
                      runs=len(fired.run_ids))  # fmt: skip
            due = store.next_schedule_at()
            now = store.now()
        except StoreError as exc:
            self._outage.failed("schedules", exc)
            return RETRY
        except Exception as exc:  # a row no cron library reads (a hand edit): told once
            if not self._broken:
                event(log, "schedules_failed", f"cannot fire the schedules: {exc!r}; looking "
                      f"again every {REFRESH:g}s", level=logging.ERROR)  # fmt: skip
            self._broken = True
            return REFRESH
        self._broken = False
        self._outage.answered()
        if due is None:
            return REFRESH
        return min(REFRESH, max(MIN_WAIT, due - now))
