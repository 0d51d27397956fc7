"""Webhook delivery (docs/protocol.md B20): the handler of the built-in task
``DELIVERY_TASK``, which every worker serves.

Each webhook has one delivery run (a system run). Its task, claimed under a lease like any
other, reads the users' events after the webhook's position (in commit order) and POSTs each
one its webhook wants, signed (``workerproc.webhooks``), through a window (``workerproc.window``):
up to the webhook's ``in_flight`` events (``WINDOW``, 8, unless it says; 1 to 64) open at once
across runs, a run's events one at a time in table order,
each POST on a sender thread within one deadline over the whole POST and reading at most
64 KiB of the answer (``workerproc.posting``). After each round of answers the position moves
to the contiguous acknowledged event, in one small write under the lease's fence
(``move_webhook``; events passed over move with it), so a fault re-sends at most ``in_flight``
events. The execution ends with one fenced commit of the run's state (the failures in a row,
the last error, the dead letters, the events acknowledged behind a gap as ``acked``):

- all delivered and nothing more to read, even after holding on ``HOLD`` seconds for the next
  commit: the run *parks* (``wait_for(WAKE_SIGNAL)``, holding no lease and no slot) until the
  waker (``courier``) signals it, or ``PARK`` seconds pass;
- more to read (a full batch, ``BUDGET`` seconds spent, or a dead letter just kept): the next
  task is due at once;
- a delivery failed: the same event is tried again after a backoff that doubles from the
  webhook's ``backoff`` to its ``backoff_max`` (±25 % jitter), its run's later events waiting
  for it (other runs' go on while the window has room): in place while the backoff is under
  ``INLINE_RETRY`` seconds, else by a new task due then (the failure count committed);
  after ``max_failures`` failures in a row the event is a dead letter (kept in the state, the
  newest ``MAX_DEAD``, committed with a position past it in the state's ``cursor``, which the
  next execution moves the webhook's to first) and delivery goes on after it.

A delivery whose lease was taken over (a zombie) moves nothing (its move is refused: it stops
there) and its successor starts again from the last position moved: every event is delivered
at least once, each run's in event order; a receiver deduplicates by the ``id`` of
the body it verified (the signature covers the body; no unsigned header repeats the id). The
system's own runs' events are never delivered: they are read and passed over like the kinds a
webhook does not want, so its position keeps up with them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from . import __version__
from .context import LeaseLost, TaskContext
from .logs import event as told
from .store import StoreError, WorkerStore
from .store.types import Event, Lease
from .store.webhooks import (
    DELIVERY_TASK,
    MAX_DEAD,
    WAKE_SIGNAL,
    WEBHOOK_QUEUE,
    Webhook,
    standing,
)
from .webhooks import HEADER, signature_header
from .window import FAILED, Senders, Slot, Window

if TYPE_CHECKING:
    from .posting import Poster

log = logging.getLogger("workerproc.delivery")

BATCH = 100  # events read per look
# seconds one execution delivers at most before it commits its state: how long a graceful stop
# waits for it (plus one POST). What a crash or a takeover redelivers is the POST in flight.
BUDGET = 1.0
PARK = 120.0  # a parked delivery run looks again after this long, even if nobody wakes it
# (a safety net: the waker wakes it within a second or `courier.QUIET` of an event it wants)
INLINE_RETRY = 1.0  # a failed POST whose backoff is this short is tried again in place
HOLD = 0.25  # caught up, an execution waits this long for the next commit before it parks
IDLE = 1.0  # seconds a delivery waits for an answer at most before it looks again
_encode = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


# A worker's delivery lane: deliveries it runs at once, each on a thread of its own (with its
# window's senders), beside --concurrency and never counted against it (a webhook's deliveries
# never overlap: its delivery run is serial), so no receiver, however slow, holds up a user's run.
LANE = 2


def on_lane(lease: Lease) -> bool:
    """Whether ``lease`` is the delivery lane's: a task of the webhooks' queue."""
    return lease.queue == WEBHOOK_QUEUE


def serves_webhooks(queues: Sequence[str] | None) -> bool:
    """Whether a worker claiming from ``queues`` (None: all) delivers webhooks."""
    return queues is None or WEBHOOK_QUEUE in queues


def body_of(event: Event, webhook: str) -> bytes:
    """What a delivery POSTs: the event as JSON, with the webhook's name."""
    return _encode({
        "id": event.id, "at": event.at, "run_id": event.run_id, "kind": event.kind,
        "task": event.task, "attempt": event.attempt, "data": event.data, "webhook": webhook,
    }).encode()  # fmt: skip


def _new_poster() -> Poster:
    from .posting import Poster  # noqa: PLC0415 (http.client, email and ssl: only to deliver)

    return Poster()


def backoff(retry_failures: int, first: float, longest: float) -> float:
    """The delay before the next try after ``retry_failures`` failures in a row."""
    base = min(longest, first * 2.0 ** max(0, retry_failures - 1))
    return float(min(longest, base * random.uniform(0.75, 1.25)))


class _Mover:
    """Moves a webhook's position (``move_webhook``) under the fence of the delivery's lease,
    after each acknowledged POST (and past the events passed over before the delivery holds on
    or ends). A refusal means the lease is lost (``LeaseLost``: stop, commit nothing)."""

    def __init__(self, store: WorkerStore, ctx: TaskContext, position: int) -> None:
        self._store = store
        self._ctx = ctx
        self._lease = lease = ctx.lease  # the fence its moves carry: this execution's
        self._ttl = lease.expires_at - lease.claimed_at
        self.position = position  # where the webhook's row stands, as far as this one knows
        self._delivered = 0  # acknowledged POSTs not counted on the row yet

    def delivered(self, position: int, acked: int) -> None:
        """Every event up to ``position`` was dealt with, ``acked`` more POSTs acknowledged
        among them: the position moves there now."""
        self._delivered += acked
        self.move(position)

    def fresh(self) -> bool:
        """Whether the lease was confirmed (claimed or renewed) within its ttl, by the local
        clock: a delivery woken from a pause longer than that sends nothing more (its commit
        says whether the lease held), rather than a POST its successor sends too."""
        latest = self._ctx.latest()
        return latest is None or time.monotonic() < latest + self._ttl

    def move(self, position: int) -> None:
        """Move to ``position`` now (if it is ahead, or POSTs are to be counted)."""
        if position <= self.position and not self._delivered:
            return
        if not self._store.move_webhook(self._lease, position, self._delivered):
            raise LeaseLost(f"webhook position {position} refused: the delivery's lease is gone")
        self.position, self._delivered = max(self.position, position), 0


class Deliverer:
    """The delivery task's handler: ``Deliverer(open_store)``. Each thread that delivers opens
    a store of its own (no connection crosses a thread) and keeps it for its next deliveries;
    one that failed is closed and opened again next time."""

    def __init__(
        self, open_store: Callable[[], WorkerStore], stopping: Callable[[], bool] = lambda: False
    ) -> None:
        self._open_store = open_store
        self._stopping = stopping  # the worker stops: no new POST (the one in flight ends)
        self._stores = threading.local()

    def __call__(self, ctx: TaskContext) -> None:
        store: WorkerStore | None = getattr(self._stores, "store", None)
        if store is None:
            store = self._stores.store = self._open_store()
        try:
            self.deliver(ctx, store)
        except StoreError:
            self._stores.store = None
            with contextlib.suppress(StoreError):
                store.close()
            raise

    def _senders(self, size: int) -> Senders:
        """This lane thread's senders (kept, with their posters: each keeps a connection open
        to each receiver it POSTs to), up to ``size`` of them (the webhook's window): each POSTs
        one event at a time, with its webhook's deadline."""
        senders: Senders | None = getattr(self._stores, "senders", None)
        if senders is None:
            senders = self._stores.senders = Senders(_new_poster, size)
        senders.size = size
        return senders

    def deliver(self, ctx: TaskContext, store: WorkerStore) -> None:
        payload = ctx.payload
        name = payload.get("webhook") if isinstance(payload, dict) else None
        state: dict[str, Any] = dict(ctx.state) if isinstance(ctx.state, dict) else {}
        hook = store.webhook(name) if isinstance(name, str) else None
        if hook is None or hook.run_id != ctx.run_id:  # removed (its run is cancelled too)
            ctx.finish({**state, "removed": True})
            return
        for moved in ("delivered", "last_delivery_at"):  # (kept on the webhook's row now)
            state.pop(moved, None)
        # where the last commit left it (past a dead letter, say), and the failures of the
        # event after it: none if the position has moved past it since (a lost commit's)
        start, carry = standing(hook.position, state)
        # events after it the last commit's window had acknowledged already: not sent again
        acked = state.pop("acked", None)
        done = frozenset(i for i in acked if isinstance(i, int) and i > start) if isinstance(
            acked, list) else frozenset()  # fmt: skip
        mover = _Mover(store, ctx, hook.position)
        mover.move(start)  # (a commit's position the webhook's row has not had yet)
        window = Window(start, hook.retry.in_flight)  # (the webhook's: what a fault re-sends)
        run = _Run(self, ctx, store, hook, mover, window, state, carry, done)
        parked = run.loop()
        cursor = window.cursor()  # (past a dead letter: committed first, moved by the next)
        state["cursor"] = cursor
        if window.acked_after(cursor):
            state["acked"] = window.acked_after(cursor)
        failures = window.failures_after(cursor)
        state["failures"] = carry if failures is None and cursor == start else failures or 0
        if parked:
            ctx.wait_for(WAKE_SIGNAL, DELIVERY_TASK, timeout=PARK, state=state, payload=payload)
        else:
            ctx.advance(state, DELIVERY_TASK, payload, run.retry_in or 0, queue=WEBHOOK_QUEUE)

    @staticmethod
    def _hold(store: WorkerStore, token: int, deadline: float) -> bool:
        """Caught up: hold on for ``HOLD`` seconds (within the budget) for the next commit,
        which is cheaper than parking and being woken; whether one came."""
        left = min(HOLD, deadline - time.monotonic())
        return left > 0 and store.wait_change(token, left) != token

    @staticmethod
    def _post(poster: Poster, hook: Webhook, event: Event) -> str | None:
        """POST one event; None when the receiver took it (a complete 2xx answer within the
        webhook's timeout, of at most ``MAX_ANSWER`` bytes), else what went wrong."""
        body = body_of(event, hook.name)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"leasekeeper/{__version__}",
            HEADER: signature_header(hook.secret, body),
            "Leasekeeper-Webhook": hook.name,
        }
        return poster.post(hook.url, body, headers, hook.retry.timeout)

    @staticmethod
    def _dead(state: dict[str, Any], hook: Webhook, event: Event, error: str) -> None:
        dead = list(state.get("dead", ()))[-(MAX_DEAD - 1) :]
        dead.append({"event": event.id, "run_id": event.run_id, "kind": event.kind,
                     "error": error, "at": time.time()})  # fmt: skip
        state["dead"] = dead
        state["dead_total"] = int(state.get("dead_total", 0)) + 1
        told(log, "webhook_dead_letter", f"webhook {hook.name!r} gave up on event {event.id} "
             f"({event.kind}) after {hook.retry.max_failures} failures: {error}",
             level=logging.WARNING, webhook=hook.name, event_id=event.id)  # fmt: skip


class _Run:
    """One delivery execution's loop: read the events after the position, send what the window
    lets go (``Window``: each run's events one at a time, in table order, at most the webhook's
    ``in_flight`` open), settle the answers as they come (a failure tried again after its
    backoff, in place while short, else the execution ends; a dead letter ends it too) and move
    the position after each settled round. Whether it ended parked (caught up, nothing came
    while it held)."""

    def __init__(
        self, owner: Deliverer, ctx: TaskContext, store: WorkerStore, hook: Webhook,
        mover: _Mover, window: Window, state: dict[str, Any], carry: int, done: frozenset[int],
    ) -> None:  # fmt: skip
        self.owner, self.ctx, self.store, self.hook = owner, ctx, store, hook
        self.mover, self.window, self.state, self.carry = mover, window, state, carry
        self.done = done
        self.answers: queue.SimpleQueue[tuple[Slot, Any]] = queue.SimpleQueue()
        self.senders = owner._senders(window.size)
        self._post = owner._post
        self.deadline = time.monotonic() + BUDGET
        self.retry_in: float | None = None  # a failure to try again after this long (a new task)
        self.stop = False  # a long backoff, a dead letter, a lease gone stale, a stop: commit

    def loop(self) -> bool:
        store, window = self.store, self.window
        token = store.change_token()
        ended = False  # the last read reached the end of the table (as the token stood then)
        while True:
            now = time.monotonic()
            closing = self.stop or now >= self.deadline
            # past the budget, a failed event already open is still tried again in place for up
            # to one more budget (nothing new is sent): its run waits for it, and a commit
            # cut between two short tries would count it as failing (what --drain stops on)
            grace = not self.stop and now < self.deadline + BUDGET
            if closing and grace:
                self._send(retries=True)
            if not closing:
                if (
                    len(window) < BATCH
                    and not window.full
                    and (not ended or store.change_token() != token)
                ):
                    token = store.change_token()
                    # (the system's events too: read past, so the position keeps up with them
                    # while the users are idle, and no read scans them again)
                    batch = store.events(after=window.read_to, limit=BATCH, system=True)
                    ended = len(batch) < BATCH
                    window.add(batch, self.hook.takes, self.carry, self.done)
                self._send()
            if window.in_flight:
                self._settle()
                continue
            self._move()
            due = window.next_due()
            if self.stop or (closing and (due is None or not grace)):
                return False
            if due is not None:  # a failure tried again in place, soon
                until = self.deadline + (BUDGET if closing else 0.0)
                time.sleep(max(0.0, min(due, until) - time.monotonic()))
                continue
            if window.waiting() or not ended:
                continue
            # caught up: the webhook's row says so while it holds on (done by _move)
            if not self.owner._hold(store, token, self.deadline):
                return True  # caught up, and nothing came while it held on: park

    def _send(self, retries: bool = False) -> None:
        """Send every event the window lets go now (with ``retries``, only failed ones tried
        again; none once the lease went stale by the local clock, or the worker stops: the
        commit decides)."""
        window, hook = self.window, self.hook
        for slot in window.sendable(time.monotonic()):
            if retries and slot.status != FAILED:
                continue
            if not self.mover.fresh() or self.owner._stopping():
                self.stop = True
                return
            self.ctx.raise_if_lost()  # lost or cancelled: stop here, commit nothing
            window.sent(slot)
            post = partial(self._post, hook=hook, event=slot.event)  # (on a sender, its poster)
            self.senders.submit(post, self.answers, slot)

    def _settle(self) -> None:
        """Wait for the next answer (until a failure's retry is due, at most ``IDLE`` s: every
        POST answers by its deadline), take every answer that came, move the position."""
        due = self.window.next_due()
        wait = IDLE if due is None else max(0.0, min(IDLE, due - time.monotonic()))
        try:
            got = [self.answers.get(timeout=wait)]
        except queue.Empty:
            return
        with contextlib.suppress(queue.Empty):
            while True:
                got.append(self.answers.get_nowait())
        for slot, error in got:
            if error is None:
                self.window.acked(slot)
            else:
                self._failed(slot, str(error))
        self._move()

    def _failed(self, slot: Slot, error: str) -> None:
        hook, event, retry = self.hook, slot.event, self.hook.retry
        slot.failures += 1
        self.state["last_error"] = f"event {event.id}: {error}"
        if slot.failures >= retry.max_failures:
            Deliverer._dead(self.state, hook, event, error)
            self.window.dead(slot)  # (its run's later events wait for the next execution)
            self.stop = True
            return
        delay = backoff(slot.failures, retry.backoff, retry.backoff_max)
        now = time.monotonic()
        self.window.failed(slot, now + delay)
        limit = self.deadline + BUDGET  # (past the budget, a try again in place has a grace)
        if delay > INLINE_RETRY or now + delay >= limit or self.owner._stopping():
            self.retry_in = delay if self.retry_in is None else min(self.retry_in, delay)
            self.stop = True  # tried again after that long, by a new task

    def _move(self) -> None:
        position, acked = self.window.advance()
        if acked or position > self.mover.position:
            self.mover.delivered(position, acked)
