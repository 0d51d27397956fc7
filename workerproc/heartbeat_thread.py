"""The heartbeat's own thread (``heartbeat.py``'s docstring says what it does): each round it
waits for what is due, renews every lease held in one statement, reports what it found (a lost
lease, a cancelled run, a timeout, a stuck handler) and carries out the reactions it is
answered, on its own connection. ``Heartbeat`` adds what the conductor calls."""

from __future__ import annotations

import abc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from .events import (
    HandlerStuck,
    HeartbeatDied,
    LeaseLost,
    Post,
    Reaction,
    RunCancelled,
    TaskTimedOut,
)
from .held import Held, look
from .logs import event
from .outage import Outage
from .overdue import IDLE_WAIT, overdue
from .presence import Presence
from .signals import main_thread_only
from .store import Lease, StoreError, WorkerStore

log = logging.getLogger("workerproc.heartbeat")

RETRY_INTERVAL = 0.2  # after a failed (busy) renewal
POSTPONE = 0.1  # a timeout its reaction put off is looked at again this much later


class Beats(abc.ABC):
    """The thread's side of the heartbeat: its state is ``Heartbeat.__init__``'s."""

    _open_store: Callable[[], WorkerStore]
    presence: Presence | None
    _beat_at: float
    outage: Outage
    ttl: float
    interval: float
    _post: Post
    _cond: threading.Condition
    _held: dict[int, Held]
    _replaced: dict[tuple[int, int], Held]
    _busy: bool
    _busy_since: float
    _closed: bool
    _urgent: bool
    _starting: dict[int, int]
    _chore: tuple[float, Callable[[], Reaction | None]] | None
    renewals: int
    _rounds_begun: int
    _rounds_ended: int
    idle_wait: float
    _idle: bool

    @abc.abstractmethod
    def untrack(self, leases: Iterable[Lease], *, wait: bool = True, timeout: float = 30.0) -> None:
        """Stop renewing ``leases`` (``Heartbeat.untrack``)."""

    def _overdue(self, now: float, after: float) -> tuple[float, list[Held]]:
        after = max(after, self._busy_since)
        return overdue(self._held.values(), now, self.ttl, busy=self._busy, after=after)

    def _lose_overdue(self, held: Held) -> None:
        self._lose(held, "the local lease deadline passed while a call to the database hung")

    # -- the thread ------------------------------------------------------------------------------
    def _main(self) -> None:
        main_thread_only()
        store: WorkerStore | None = None
        try:
            store = self._open_store()
            while self._step(store):
                pass
            if self.presence is not None:
                self.presence.leave(store)
        except BaseException as exc:  # a dead heartbeat must stop the worker
            event(log, "heartbeat_died", f"heartbeat thread died: {exc!r}", level=logging.ERROR)
            self._post(HeartbeatDied(exc))
        finally:
            if store is not None:
                store.close()

    def _next(self, now: float) -> tuple[float, list[Held], list[Held], list[Held]]:
        """When to act next, and what is due now: renewals, timeouts, stuck handlers. With
        nothing held, only the presence beat and a chore are due (``track`` wakes it)."""
        idle = not self._held and not self._replaced
        wake = now + (IDLE_WAIT if idle else self.idle_wait)
        if self._chore is not None:
            wake = min(wake, self._chore[0])
        wake = min(wake, self._beat_at) if self.presence is not None else wake
        held = (*self._held.values(), *self._replaced.values())  # (look: ``held.py``)
        at, due, timeouts, stuck = look(held, now, self.ttl, urgent=self._urgent)
        return min(wake, at), due, timeouts, stuck

    def _step(self, store: WorkerStore) -> bool:
        with self._cond:
            while True:
                if self._closed:
                    return False
                now = time.monotonic()
                wake, due, timeouts, stuck = self._next(now)
                chore = self._chore if self._chore is not None and self._chore[0] <= now else None
                beat = self.presence is not None and self._beat_at <= now
                if due or timeouts or stuck or chore or beat:
                    break
                if self._urgent:  # a round was asked for and nothing is held: it is over
                    self._rounds_begun += 1
                    self._rounds_ended += 1
                    self._cond.notify_all()
                self._urgent = False  # nothing to renew now
                self._idle = not self._held and not self._replaced
                self._cond.wait(max(0.0, wake - now))
                self._idle = False
            if due:
                self._urgent = False
            for held in timeouts:
                held.timed_out = True  # stop renewing: the lease will lapse or be released
            for held in stuck:
                held.finished = True  # report once
            if chore is not None:
                self._chore = None
            if due:
                self._rounds_begun += 1
            if beat:
                self._beat_at = now + self.presence.every if self.presence else 0.0
            self._busy = True  # untrack() waits: no renewal (nor reaction) races a commit
            self._busy_since = time.monotonic()
        try:
            if beat and self.presence is not None:
                self.presence.beat(store)
            if chore is not None:
                self._apply(chore[1](), store)
            for held in timeouts:
                if self._report(TaskTimedOut(held.lease), store):  # not yet: renew on
                    with self._cond:
                        held.timed_out = False
                        held.timeout_at = time.monotonic() + POSTPONE
            for held in stuck:
                self._report(HandlerStuck(held.lease), store)
            if due:
                self._renew(store)
        finally:
            with self._cond:
                self._busy = False
                if due:
                    self._rounds_ended += 1
                self._cond.notify_all()
        return True

    def _renew(self, store: WorkerStore) -> None:
        # Renew every live lease still held, not only the due ones: one statement per tick.
        # Past a local deadline we still ask the database: it decides (R5), and a refusal is
        # recorded there as evidence that a zombie tried and was turned away.
        with self._cond:
            batch = [h for h in self._held.values() if h.lost_at is None and not h.timed_out]
            starting = [h for h in batch if not h.recorded
                        and self._starting.get(h.lease.task_id) == h.lease.attempt]  # fmt: skip
        started = time.monotonic()
        try:
            renewals = store.renew_each(
                [h.lease for h in batch], self.ttl, starting=[h.lease for h in starting]
            )
        except StoreError as exc:  # busy or locked: not a lost lease, retry soon
            self.outage.failed("renewal", exc)
            now = time.monotonic()
            for held in batch:
                held.due = now + min(RETRY_INTERVAL, self.interval)
                if now >= held.deadline(self.ttl):
                    self._lose(held, "the local lease deadline passed while the database was busy")
            return
        self.outage.answered()
        self.renewals += 1
        cancelled: list[Lease] = []
        for held, renewal in zip(batch, renewals, strict=True):
            if renewal.expires_at is None:
                self._lose(held, "the store refused the renewal")
                continue
            with self._cond:  # ``age`` and ``confirm`` read these on other threads
                held.confirmed = max(held.confirmed, started)
                held.due = held.confirmed + self.interval
                if any(held is h for h in starting):
                    held.recorded = True
                    self._starting.pop(held.lease.task_id, None)
                if renewal.cancelled and not held.cancelled:
                    held.cancelled = True
                    cancelled.append(held.lease)
        for lease in cancelled:
            self._report(RunCancelled(lease), store)

    def _lose(self, held: Held, why: str) -> None:
        with self._cond:
            if held.lost_at is not None:
                return
            held.lost_at = time.monotonic()
        self._report(LeaseLost(held.lease, why), None)

    def _report(self, report: LeaseLost | RunCancelled | TaskTimedOut | HandlerStuck,
                store: WorkerStore | None) -> bool:  # fmt: skip
        """Post ``report`` and apply its reaction; True when it says to postpone."""
        return self._apply(self._post(report), store)

    def _apply(self, reaction: Reaction | None, store: WorkerStore | None) -> bool:
        """Do what the worker's reflex answered, on this thread (only its own reports write:
        ``store`` is None on the conductor's). True: postpone (a timeout not its fault yet)."""
        if reaction is None:
            return False
        if reaction.write:
            assert store is not None, "a write reacts to the heartbeat thread's own reports"
            try:
                store.commit_many(list(reaction.write))
            except StoreError as exc:  # the leases lapse after the ttl: no harm but a delay
                event(log, reaction.failed, f"could not record {reaction.what}: {exc}",
                      level=reaction.level, task_id=reaction.write[0].lease.task_id,
                      count=len(reaction.write))  # fmt: skip
        if reaction.forget:
            self.untrack(reaction.forget, wait=False)
        if reaction.exit is not None:
            os._exit(reaction.exit)
        if reaction.then is not None:
            self._post(reaction.then)
        return reaction.postpone
