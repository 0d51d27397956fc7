"""An idle worker tells a database outage like any other part (workerproc/outage.py).

On PostgreSQL an idle worker sleeps on its LISTEN connection; a stopped server drops it, the
token moves and the idle wait reads ``ready_in``, which fails once its reconnect gives up
(``busy_timeout``). That failure used to be swallowed: the claim that followed could come late
enough in the outage for its own reconnect to ride out the rest, and the worker then logged
nothing for a whole incident (the restart soak, 8 s down, showed it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import pytest

from workerproc.idle import watch_for_work
from workerproc.outage import Outage
from workerproc.signals import Signals, Waker
from workerproc.store import StoreUnavailable


class Flaky:
    """A store whose token moves on every read (a dropped LISTEN connection bumps it) and whose
    ``ready_in`` fails while ``down`` (nothing claimable otherwise)."""

    def __init__(self) -> None:
        self.down = False
        self.token = 0
        self.reads = 0

    def change_watch(self) -> None:
        return None  # polled

    def change_token(self) -> int:
        self.token += 1
        return self.token

    def ready_in(self, queues: Sequence[str] | None) -> float | None:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("cannot connect: connection refused")
        return None


def _wait(store: Flaky, outage: Outage, seconds: float) -> None:
    waker = Waker()
    try:
        watch_for_work(store, waker, Signals(), deadline=time.monotonic() + seconds,  # type: ignore[arg-type]
                       queues=None, interrupted=lambda: False, outage=outage)  # fmt: skip
    finally:
        waker.close()


def test_an_idle_wait_tells_a_failed_check_once_and_its_return_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, outage = Flaky(), Outage()
    _wait(store, outage, 0.05)  # answering: no incident
    assert outage.incidents == 0
    store.down = True
    with caplog.at_level(logging.INFO, logger="workerproc.worker"):
        _wait(store, outage, 0.2)  # down: many reads fail, one line
        failures = outage.failures
        store.down = False
        _wait(store, outage, 0.05)  # back: the first read that answers ends the incident
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("store_unavailable") == 1
    assert events.count("store_back") == 1
    assert events.index("store_unavailable") < events.index("store_back")
    assert outage.incidents == 1 and outage.since is None
    assert failures > 1  # every failed read counted, one logged


class Still(Flaky):
    """The token never moves (so the wait's loop reads nothing); the first ``ready_in``
    answers, every later one fails."""

    def change_token(self) -> int:
        return 0

    def ready_in(self, queues: Sequence[str] | None) -> float | None:
        self.down = self.reads > 0
        return super().ready_in(queues)


def test_the_look_at_the_poll_interval_tells_its_failure() -> None:
    """The reads at the deadline (``_look``) fail: the incident begins there too."""
    store, outage = Still(), Outage()
    _wait(store, outage, 0.05)
    assert store.reads == 2  # the wait's first read, then the look's
    assert outage.incidents == 1 and outage.since is not None
