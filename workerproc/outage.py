"""A database that stops answering, told once per incident.

Every part of a worker that talks to the store (the exchange, the heartbeat, the idle wait)
retries a failed call with backoff until the database answers again. Logging each retry would
write hundreds of lines a minute while a server restarts or its backends are killed, and hide
what happened; so the worker keeps one ``Outage`` shared by its threads. The first failure of an
incident is logged (what failed and why, in the driver's first line); later failures are only
counted; the first success of any part ends the incident with one line: how long it lasted and
how many tries failed. Giving up on a commit (its lease lapses) is still logged where it happens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .logs import event

log = logging.getLogger("workerproc.worker")


class Outage:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.since: float | None = None  # when the incident began (monotonic); None: no incident
        self.failures = 0  # failed tries in this incident
        self.incidents = 0  # incidents so far (ended or not)

    def failed(self, what: str, exc: BaseException) -> None:
        """A call to the store failed (``what``: "commit", "claim", "renewal", ...)."""
        with self._lock:
            self.failures += 1
            if self.since is not None:
                return
            self.since = self.clock()
            self.incidents += 1
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        event(
            log,
            "store_unavailable",
            f"the database did not answer ({what}: {first}); retrying with backoff until it "
            "does (logged once per incident)",
            level=logging.WARNING,
            what=what,
        )

    def answered(self) -> None:
        """A call to the store succeeded: an incident in progress is over."""
        if self.since is None:  # the hot path: no lock, no clock
            return
        with self._lock:
            if self.since is None:
                return
            lasted, failures = self.clock() - self.since, self.failures
            self.since, self.failures = None, 0
        event(
            log,
            "store_back",
            f"the database answers again after {lasted:.1f}s ({failures} failed "
            f"{'try' if failures == 1 else 'tries'})",
            seconds=round(lasted, 3),
            failures=failures,
        )
