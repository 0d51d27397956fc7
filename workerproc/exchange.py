"""The conductor's conversation with the store, and what it tells the supervisor.

``Exchange`` turns one ``Turn`` of the policy into one transaction (``Completer``): the finished
slots' commits, the hand-backs of what waits (behind slow slots, or the worker stopped taking
work), the users' claim and the delivery lane's (B20), each fenced on its own. It also gives
everything back at once when the worker must go (QUIT, dead slots: ``abandon``), and hands back
what waits unstarted when it stops (``hand_back_waiting``). ``Publisher`` writes the worker's
phase and counters to its status slot (the supervisor's metrics and ``status``).

Both run on the conductor's thread only.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from .completer import Completer
from .config import WorkerConfig
from .delivery import on_lane
from .execution import Stopped
from .executors import Executors
from .heartbeat import Heartbeat
from .holdings import Holdings
from .logs import event
from .policy import Policy
from .status import CLAIMING, COMMITTING, HANDLER, IDLE, Counters, StatusSlot
from .store import ClaimRequest, Commit, StoreError
from .store.webhooks import WEBHOOK_QUEUE

log = logging.getLogger("workerproc.worker")


class Publisher:
    """The worker's status slot: its phase, the task it runs, its counters (None: no slot)."""

    def __init__(self, slot: StatusSlot | None, holdings: Holdings, counters: Counters) -> None:
        self.slot = slot
        self.pid = os.getpid()
        self.holdings = holdings
        self.counters = counters

    def phase(self, phase: int | None = None) -> None:
        """Publish ``phase`` (None: a handler runs, or the worker is idle)."""
        if self.slot is None:
            return
        h = self.holdings
        with h.lock:
            busy = h.users()  # (the users' slots: a delivery on the lane takes none)
            first = next(iter(h.running.values()), None)
        if phase is None:
            phase = HANDLER if busy else IDLE
        lease = first.lease if first is not None else None
        self.slot.publish(self.pid, phase, lease.task_id if lease else 0,
                          lease.attempt if lease else 0, busy)  # fmt: skip

    def publish_counters(self) -> None:
        if self.slot is not None:
            self.slot.publish_counters(self.pid, self.counters)


class Exchange:
    def __init__(
        self,
        owner: str,
        config: WorkerConfig,
        completer: Completer,
        holdings: Holdings,
        policy: Policy,
        heartbeat: Heartbeat,
        publisher: Publisher,
        served: tuple[str, ...] | None = None,
    ) -> None:
        self.completer = completer
        self.holdings = holdings
        self.policy = policy
        self.heartbeat = heartbeat
        self.publisher = publisher
        self.counters = publisher.counters
        # the users' slots claim every queue they serve but the webhooks', and only the tasks
        # the worker has handlers for (``served``, B22: a rolling deploy's old workers leave a
        # new version's tasks to the new ones); the lane claims the webhooks' queue
        self._claim = ClaimRequest(owner, config.lease_ttl, config.max_attempts, 1, config.queues,
                                   skip=(WEBHOOK_QUEUE,), tasks=served)  # fmt: skip
        self._lane = ClaimRequest(owner, config.lease_ttl, config.max_attempts, 1, (WEBHOOK_QUEUE,))

    def commit_and_claim(
        self, hand_back: bool, want: int, start: int | None = None, lane: int = 0
    ) -> None:
        """One transaction: the finished commits, the hand-backs (``hand_back``: every waiting
        lease), then claims for ``want`` users' slots (``start`` of them begin at once, B3) and
        ``lane`` deliveries; the leases claimed wait in the holdings for a slot."""
        handbacks: list[Commit] = []
        if hand_back:  # behind slow slots, or the worker stopped taking work
            handbacks = [Commit(lease, "handback") for lease in self.holdings.take_waiting()]
        claim = dataclasses.replace(self._claim, limit=want, start=start) if want else None
        if lane:  # the delivery lane's claim, in the same transaction (after the users')
            deliveries = dataclasses.replace(self._lane, limit=lane)
            claim = deliveries if claim is None else dataclasses.replace(claim, also=deliveries)
        self.publisher.phase(COMMITTING if self.completer.pending or handbacks else CLAIMING)
        leases = self.completer.commit_and_claim(handbacks, claim)
        delivering = 0
        for lease in leases:
            self.counters.claims += 1
            self.counters.takeovers += lease.takeover
            delivering += on_lane(lease)
        self.holdings.add_waiting(leases)
        if want:
            self.policy.claimed(want, len(leases) - delivering)
        if lane:
            self.policy.lane_claimed(lane, delivering)
        self.publisher.phase()
        self.publisher.publish_counters()

    def abandon(self, error: str, executors: Executors) -> None:
        """QUIT (or dead slots): give every lease back at once, the running ones released with
        ``error``; handlers on threads die with the process."""
        running, waiting = self.holdings.clear()
        for ex in running:
            executors[ex.mode].interrupt(ex, Stopped.QUIT)
        commits = self.completer.take()
        commits += [Commit(ex.lease, "release", error=error) for ex in running]
        commits += [Commit(lease, "handback") for lease in waiting]
        if commits:
            self.heartbeat.untrack([c.lease for c in commits])
            self.completer.write(commits, None)

    def hand_back_waiting(self) -> None:
        """Whatever waits unstarted goes back (a claim fused into the last exchange, say)."""
        waiting = self.holdings.take_waiting()
        if not waiting:
            return
        self.heartbeat.untrack(waiting)
        try:
            self.completer.write([Commit(lease, "handback") for lease in waiting], None)
        except StoreError as exc:
            event(
                log,
                "handback_failed",
                f"could not hand back {len(waiting)} tasks: {exc}",
                level=logging.WARNING,
                count=len(waiting),
            )
