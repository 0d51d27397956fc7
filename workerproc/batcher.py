"""A batch step's call (``@app.task(batch=64, batch_wait=0.5)``), on the slot thread of the
execution that leads it (``Batcher``; docs/protocol.md, B23).

1. **Gather.** The leader (a lease of the task, claimed by the worker's plain claim and started
   on a slot like any task) takes in the leases of the same task waiting in this worker, then
   claims more in one exchange of its own (``ClaimRequest.task``: up to the batch's room, each
   run its own lease, attempt and fence), and again until the batch is full or ``batch_wait``
   has passed, whichever comes first. Each lease is held by the heartbeat from its claim, and
   the batch's leases are renewed together, in the heartbeat's one statement.
2. **Confirm.** Right before the call, every item must be confirmed a moment ago (R4's start
   rule, as the starter applies it): the stale ones are renewed together, in one round; a
   refused item is dropped, one that could not be confirmed goes back to the waiting line (the
   conductor decides), the others ride with the leader, holding no slot of their own.
3. **Call.** The handler gets a ``Batch`` of their contexts, once.
4. **Conclude.** Each item's last word becomes its own commit, fenced on its own (its lease,
   its attempt, its run's revision), written by the conductor's next exchange; an item the
   handler left unconcluded, or that the handler's error reached, is released alone with the
   error (and retried within its own ``max_attempts``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from .app import App
from .batching import Batch, ItemContext
from .config import WorkerConfig
from .events import Post, TaskFinished
from .execution import Execution, Mode, Stopped, conclude, message
from .heartbeat import Heartbeat
from .holdings import Holdings
from .logs import event
from .once import CallBook
from .policy import CONFIRM_WAIT, Policy
from .store import ClaimRequest, Lease, StoreError, WorkerStore
from .store.webhooks import WEBHOOK_QUEUE
from .streaming import Streamer

log = logging.getLogger("workerproc.worker")

FILL_LOOK = 0.05  # a batch not full yet looks for more of its items this often, within its wait


class Batcher:
    """Runs the batch steps of one worker: called on the slot thread of each batch's leader."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        owner: str,
        *,
        holdings: Holdings,
        policy: Policy,
        heartbeat: Heartbeat,
        post: Post,
        open_store: Callable[[], WorkerStore],
        calls: CallBook | None = None,
        streams: Streamer | None = None,
    ) -> None:
        self.app, self.config = app, config
        self.holdings, self.policy, self.heartbeat, self.post = holdings, policy, heartbeat, post
        self.calls, self.streams = calls, streams
        self._open = open_store
        self._store: WorkerStore | None = None  # its connections are each thread's own
        self._lock = threading.Lock()
        # only the versions of the task this worker serves (B25): an older release's batch never
        # gathers an item a newer one started
        self._claim = ClaimRequest(owner, config.lease_ttl, config.max_attempts, 1,
                                   config.queues, skip=(WEBHOOK_QUEUE,),
                                   tasks=app.served_tasks())  # fmt: skip

    def __call__(self, leader: Execution) -> None:
        """Gather, confirm, call and conclude the batch ``leader`` leads. Never raises."""
        leader.started = time.monotonic()
        if not leader.may_begin():  # R4's last check, as for any task (late: back unstarted)
            leader.commit = conclude(leader, None, None, self.config)
            return
        task = self.app.tasks[leader.lease.task]
        try:
            leases = self._gather(leader.lease, task.batch or 1, task.batch_wait)
            riders = self._board(leader, leases)
        except BaseException as exc:  # our own bug: the leader fails alone, nothing rode
            leader.commit = conclude(leader, None, exc, self.config)
            return
        items = [leader, *riders]
        batch = Batch([_item(ex) for ex in items], self.calls,
                      f"{leader.lease.task_id}.{leader.lease.attempt}")  # fmt: skip
        self._record(items, batch.id)
        raised: BaseException | None = None
        began = time.monotonic()
        try:
            with leader.running():
                leader.handler(batch)  # type: ignore[arg-type]  # (a batch handler's argument)
                for ex in items:
                    ex.ctx._stream_done()  # what each emitted is written before its commit
        except BaseException as exc:  # the handler's error reaches the items not concluded
            raised = exc
        seconds = time.monotonic() - began
        leader.batch = len(items)
        for ex in items:
            ex.seconds = seconds
            ex.commit = conclude(ex, None, _item(ex).ended_by(raised), self.config)
            ex.ctx._stream_closed()
        for ex in riders:  # (the leader's ending is posted by its slot thread)
            self.post(TaskFinished(ex))

    # -- gathering -----------------------------------------------------------------------------
    def _gather(self, first: Lease, size: int, wait: float) -> list[Lease]:
        """The batch's leases: ``first``, then up to ``size`` in all, from this worker's waiting
        line and the database, for at most ``wait`` seconds."""
        leases = [first]
        deadline = time.monotonic() + wait
        while len(leases) < size:
            with self.holdings.lock:
                leases += self.holdings.take_task(first.task, size - len(leases))
            if len(leases) < size and self.policy.accepting:
                leases += self._more(first.task, size - len(leases))
            left = deadline - time.monotonic()
            if len(leases) >= size or left <= 0 or not self.policy.accepting:
                break
            time.sleep(min(FILL_LOOK, left))
        return leases

    def _more(self, task: str, room: int) -> list[Lease]:
        """Up to ``room`` more leases of ``task``, in one claim; held by the heartbeat from the
        moment the claim was sent (R4). A failed claim gives none (the batch goes on)."""
        claim = dataclasses.replace(self._claim, limit=room, task=task)
        sent = time.monotonic()
        try:
            out = self._connection().commit_many((), claim=claim)
        except StoreError as exc:
            event(log, "batch_claim_failed", f"a batch's claim for task {task!r} failed: "
                  f"{message(exc)}", level=logging.WARNING, task=task)  # fmt: skip
            return []
        for lease in out.leases:
            self.heartbeat.track(lease, sent)
        return list(out.leases)

    def _record(self, items: list[Execution], batch: str) -> None:
        """The outbox's record of which batch each item went in (``show RUN``); a failure to
        write it costs the record only (the batch goes on)."""
        try:
            self._connection().batch_started([ex.lease for ex in items], batch)
        except StoreError as exc:
            event(log, "batch_record_failed", f"batch {batch}: its record was not written: "
                  f"{message(exc)}", level=logging.WARNING, items=len(items))  # fmt: skip

    def _connection(self) -> WorkerStore:
        with self._lock:
            if self._store is None:
                self._store = self._open()
            return self._store

    # -- boarding -----------------------------------------------------------------------------
    def _board(self, leader: Execution, leases: list[Lease]) -> list[Execution]:
        """Every item confirmed a moment ago (R4; the stale ones renewed in one round); the
        riders confirmed, running. An item
        refused is dropped; one not confirmed in time (a busy database), or whose task still
        runs an older attempt here, waits for the conductor instead."""
        hb, h = self.heartbeat, self.holdings
        # as the starter does: a lease confirmed a moment ago (its claim, say) and recorded as
        # begun starts as it is; the others are renewed first, together, in one round
        stale = self.policy.needs_renewal((hb.confirmed_at(x), hb.recorded(x)) for x in leases)
        confirmed = {x.task_id: c for x, old in zip(leases, stale, strict=True)
                     if not old and (c := hb.confirmed_at(x)) is not None}  # fmt: skip
        if any(stale):
            renewing = [x for x, old in zip(leases, stale, strict=True) if old]
            confirmed |= hb.confirm(renewing, timeout=CONFIRM_WAIT)
        if leader.lease.task_id not in confirmed:  # the leader cannot begin: it goes unstarted
            leader.stopped = leader.stopped or Stopped.LATE
            if hb.confirmed_at(leader.lease) is None:
                leader.lost.set()
        riders: list[Execution] = []
        lost: list[Lease] = []
        back: list[Lease] = []
        with h.lock:
            for lease in leases[1:]:
                if lease.task_id not in confirmed:
                    (lost if hb.confirmed_at(lease) is None else back).append(lease)
                elif leader.stopped is not None or lease.task_id in h.running:
                    back.append(lease)
                else:
                    ex = Execution(lease, leader.handler, Mode.THREAD, tasks=leader.tasks,
                                   calls=self.calls, streams=self.streams, item=True,
                                   rider=True)  # fmt: skip
                    ex.began = True
                    h.begin(ex)
                    riders.append(ex)
        if back:
            h.add_waiting(back)
        if lost:
            hb.untrack(lost, wait=False)
        for ex in riders:
            hb.started(ex.lease)
        if leader.stopped is not None:
            raise _Unstarted()
        return riders

    def close(self) -> None:
        """Close the batch claims' store (after the handlers)."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(StoreError):
                store.close()


class _Unstarted(Exception):
    """The leader was not confirmed: it goes back unstarted (its items went to the line)."""


def _item(ex: Execution) -> ItemContext:
    ctx = ex.ctx
    assert isinstance(ctx, ItemContext)
    return ctx
