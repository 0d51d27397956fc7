"""The heartbeat thread (R4): renews the lease of the task the main thread is running.

- Own connection: the thread opens its own store (never shares the main thread's).
- Single-flight by construction: one thread renews, one renewal at a time, every ``interval``.
- A renewal answered False means the lease is lost: ``on_lost`` fires once.
- A renewal that *errors* (database busy or locked) is retried and is not a loss, until the local
  lease deadline passes. The deadline is measured on the monotonic clock from the start of the
  last successful renewal (or claim) plus the ttl: conservative, since the store computed the
  expiry from a "now" read after that start.
- ``task_timeout``: past it the heartbeat stops renewing and calls ``on_timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .store import Lease, Store, StoreError

log = logging.getLogger("workerproc.heartbeat")

RETRY_INTERVAL = 0.2  # after a failed (busy) renewal


@dataclass
class _Tracked:
    lease: Lease
    deadline: float  # monotonic: the lease may be gone after this
    next_due: float
    started: float
    lost: bool = False
    lost_at: float = 0.0
    timed_out: bool = False


class Heartbeat:
    def __init__(
        self,
        open_store: Callable[[], Store],
        *,
        ttl: float,
        interval: float,
        on_lost: Callable[[Lease, str], None],
        on_timeout: Callable[[Lease], None],
        on_death: Callable[[BaseException], None],
        on_stuck: Callable[[Lease], None] | None = None,
        task_timeout: float | None = None,
    ) -> None:
        self._open_store = open_store
        self.ttl = ttl
        self.interval = interval
        self.task_timeout = task_timeout
        self._on_lost = on_lost
        self._on_timeout = on_timeout
        self._on_death = on_death
        self._on_stuck = on_stuck
        self._cond = threading.Condition()
        self._tracked: _Tracked | None = None
        self._renewing = False
        self._closed = False
        self.renewals = 0
        self.idle_wait = min(1.0, interval / 2)
        self._thread = threading.Thread(target=self._main, name="heartbeat", daemon=True)

    # -- called from the main thread -----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def track(self, lease: Lease, lease_start: float) -> None:
        """Keep ``lease`` alive; ``lease_start`` is the monotonic time the claim (or start
        renewal) began, so ``lease_start + ttl`` is a safe local deadline."""
        now = time.monotonic()
        with self._cond:  # no notify: an idle heartbeat looks again within interval / 2
            self._tracked = _Tracked(lease, lease_start + self.ttl, now + self.interval, now)

    def untrack(self, timeout: float = 30.0) -> bool:
        """Stop renewing; waits for an in-flight renewal (single-flight) so that no renewal
        races the commit that follows. Returns whether the lease was seen lost."""
        with self._cond:
            # Clear first: no new renewal can start for it, so the wait cannot starve behind a
            # stream of slow renewals (the lock is not fair).
            tracked, self._tracked = self._tracked, None
            self._cond.wait_for(lambda: not self._renewing, timeout=timeout)
        return bool(tracked and tracked.lost)

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        store: Store | None = None
        try:
            store = self._open_store()
            while self._step(store):
                pass
        except BaseException as exc:  # a dead heartbeat must stop the worker
            log.error("heartbeat thread died: %r", exc)
            self._on_death(exc)
        finally:
            if store is not None:
                store.close()

    def _step(self, store: Store) -> bool:
        with self._cond:
            while not self._closed:
                t = self._tracked
                if t is not None and t.lost and self._on_stuck is not None:
                    # The handler was told (LeaseLost) but has not returned: give it one ttl
                    # to finish what is in flight, then the process goes (its work is void).
                    wait = t.lost_at + self.ttl - time.monotonic()
                    if wait <= 0:
                        on_stuck, self._on_stuck = self._on_stuck, None
                        self._renewing = True  # untrack() must wait: the process is going
                        self._cond.release()
                        try:
                            on_stuck(t.lease)
                        finally:
                            self._cond.acquire()
                        continue
                    # track()/untrack() send no wake-up (they are on every task's path), so
                    # no wait here outlasts idle_wait: the next lease is looked at soon
                    self._cond.wait(min(wait, self.idle_wait))
                elif t is not None and not t.lost and not t.timed_out:
                    wait = t.next_due - time.monotonic()
                    if self.task_timeout is not None:
                        wait = min(wait, t.started + self.task_timeout - time.monotonic())
                    if wait <= 0:
                        break
                    self._cond.wait(min(wait, self.idle_wait))
                else:
                    self._cond.wait(self.idle_wait)
            if self._closed:
                return False
            assert t is not None
            now = time.monotonic()
            if self.task_timeout is not None and now >= t.started + self.task_timeout:
                t.timed_out = True  # stop renewing: the lease will lapse
                timed_out = True
                # on_timeout ends the process: untrack() must not return meanwhile, or the
                # main thread would commit, claim the next task and be killed inside it
                self._renewing = True
            else:
                timed_out = False
                self._renewing = True
        if timed_out:
            try:
                self._on_timeout(t.lease)  # in the worker it ends the process
            finally:
                with self._cond:
                    self._renewing = False
                    self._cond.notify_all()
            return True
        try:
            self._renew(store, t)
        finally:
            with self._cond:
                self._renewing = False
                self._cond.notify_all()
        return True

    def _renew(self, store: Store, t: _Tracked) -> None:
        # Past the local deadline (a pause, say) we still ask the database: it decides (R5), and
        # a refusal is recorded there as evidence that a zombie tried and was turned away.
        started = time.monotonic()
        try:
            expires = store.renew_until(t.lease, self.ttl)
        except StoreError as exc:  # busy or locked: not a lost lease, retry soon
            log.warning("lease renewal failed, retrying: %s", exc)
            t.next_due = time.monotonic() + min(RETRY_INTERVAL, self.interval)
            if time.monotonic() >= t.deadline:
                self._lose(t, "the local lease deadline passed while the database was busy")
            return
        if expires is None:
            self._lose(t, "the store refused the renewal")
            return
        self.renewals += 1
        t.deadline = started + self.ttl
        t.next_due = started + self.interval

    def _lose(self, t: _Tracked, why: str) -> None:
        t.lost = True
        t.lost_at = time.monotonic()
        self._on_lost(t.lease, why)
