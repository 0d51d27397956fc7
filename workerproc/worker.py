"""The conductor (R7): one loop per worker process that keeps its slots busy.

Each turn it takes the events its threads posted (``events.py``) and reacts to them, starts
waiting leases on free slots, and, in ONE store transaction, writes every finished slot's last
word (each fenced on its own) and claims for the free slots. Under low load a free slot claims at
once; under high load batches form by themselves while the previous transaction runs. Short
handlers earn a prefetch: up to K leases beyond the free slots, handed back unstarted (no attempt
spent) as soon as the slots turn out slow. Idle, it sleeps on a self-pipe and polls a cheap change
token, never the write lock. One heartbeat thread renews every lease the worker holds.

The conductor owns the worker's state and only acts; its parts decide and keep, and none calls
another. ``Policy`` (``policy.py``) makes every decision from a ``View`` of what the worker holds
(``Holdings``); ``Starter`` picks the waiting leases that may start under R4's start rule; the
``Executors`` run handlers, one per mode (webhook deliveries on a lane of their own, ``LANE``
threads beside the users' slots, B20); the ``Exchange`` talks to the store through the
``Completer``, which buffers finished commits and writes them with the next claim; the
``Heartbeat`` renews leases. The heartbeat and the executors report through the ``Inbox``: the
few reactions that cannot wait for a turn run where the report is made (``_on_the_spot``: the
``Alarms`` for the heartbeat's reports, the freeing of a slot for an ending), the rest here, in
``_react``.

Events and what the conductor does with them:

- ``TaskFinished``: counted, its commit buffered for the next exchange (or its lease no longer
  renewed, when it has nothing to write); ``--max-tasks`` done drains the worker.
- ``DrainAsked``: stop claiming, exit with its code once the running tasks finished.
- ``HeartbeatDied``: exit ``HEARTBEAT_DIED`` now.
- ``SlowBehind``: the prefetch is earned again from scratch.
- ``LeaseLost``, ``RunCancelled``, ``TaskTimedOut``, ``HandlerStuck``: handled on the spot
  (interrupt, hand back, release, exit); their handlers' endings come as ``TaskFinished``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from . import exitcodes, hooks, tracing
from .alarms import Alarms
from .app import App
from .batcher import Batcher
from .completer import Completer
from .config import WorkerConfig
from .delivery import LANE, Deliverer, on_lane, serves_webhooks
from .events import (
    DrainAsked,
    Event,
    HeartbeatDied,
    Inbox,
    Reaction,
    SlowBehind,
    TaskFinished,
)
from .exchange import Exchange, Publisher
from .execution import Execution, Mode, Stopped, failure
from .executors import Executors
from .executors.aio import AsyncExecutor
from .executors.inline import InlineExecutor
from .executors.threads import LaneExecutor, ThreadExecutor
from .health import Health
from .heartbeat import Heartbeat
from .holdings import Holdings
from .idle import Look, watch_for_work
from .logs import event
from .once import CALL_SEATS, CallBook
from .outage import Outage
from .policy import SLOW_BEHIND, Policy, View
from .presence import Presence
from .services import Services
from .signals import Signals, Waker
from .starter import Starter
from .status import STOPPING, Counters, StatusSlot
from .store import WorkerStore
from .store.roles import CallStore, StreamStore
from .store.webhooks import DELIVERY_TASK
from .streaming import Streamer

log = logging.getLogger("workerproc.worker")


class Worker:
    def __init__(
        self,
        store: WorkerStore,
        app: App,
        config: WorkerConfig,
        *,
        owner: str,
        open_store: Callable[[], WorkerStore],
        call_store: Callable[[], CallStore] | None = None,
        stream_store: Callable[[], StreamStore] | None = None,
        delivery_store: Callable[[], WorkerStore] | None = None,
        waker: Waker | None = None,
        slot: StatusSlot | None = None,
        parent_pid: int | None = None,
    ) -> None:
        config.validate()
        self.store, self.app, self.config, self.owner = store, app, config, owner
        self.waker = waker or Waker()
        self.signals = Signals()
        self.pid = os.getpid()
        self.counters = Counters()  # published to the status slot for the supervisor's metrics
        self.exit_code: int | None = None  # exit now (the heartbeat died)
        self._hooks_started = False  # the start hooks ran: the stop hooks run at the end
        self._looked: Look | None = None  # the idle wait's last look found nothing claimable
        lane = LANE if serves_webhooks(config.queues) else 0  # the delivery lane's slots
        self.policy = Policy(config, self.signals, lane=lane)  # every decision
        self.holdings = Holdings(on_lane if lane else None)  # running, waiting: every thread's
        self.inbox = Inbox(self.waker, reflex=self._on_the_spot)  # every part reports here
        post = self.inbox.post
        self.outage = Outage()  # a database that stops answering, told once per incident
        # the tasks it has handlers for (the app's, and the built-in delivery): its claims ask
        # for those only, and its row in the worker list says so (B22)
        self.served = app.served_tasks()
        presence = self._presence(owner, config)  # the worker list's row, kept by the heartbeat
        self.heartbeat = Heartbeat(open_store, ttl=config.lease_ttl, interval=config.interval,
                                   post=post, task_timeout=config.task_timeout,
                                   outage=self.outage, presence=presence)  # fmt: skip
        self.completer = Completer(  # the finished slots' commits, written with the next claim
            store,
            config.lease_ttl,
            self.heartbeat,
            unwritable=lambda commit, exc: failure(commit.lease, exc, config, final=True),
            outage=self.outage,
        )
        # ``ctx.once``'s store (the heartbeat's kind, unless given): a connection per slot
        # thread with a seat, and per thread of its own for the rest (``once.py``)
        seats = min(CALL_SEATS, self.policy.capacity)
        self.calls = CallBook(call_store or (lambda: cast(CallStore, open_store())),
                              threads=seats, seats=seats)  # fmt: skip
        # ``ctx.emit``'s writer: one thread and one connection of its own, opened at the first emit
        self.streams = Streamer(stream_store or (lambda: cast(StreamStore, open_store())))
        self.completer.riders = self.streams  # due batches ride the exchanges (streaming.py)
        # the built-in task every worker serves: webhook delivery (B20), on its own connections
        deliverer = Deliverer(delivery_store or open_store, lambda: not self.policy.accepting)
        builtin = {DELIVERY_TASK: deliverer}  # (stopping: it starts no new POST)
        # batch steps (``@app.task(batch=...)``): gathered and run on their leaders' threads
        self.batcher = Batcher(app, config, owner, holdings=self.holdings, policy=self.policy,
                               heartbeat=self.heartbeat, post=post, open_store=open_store,
                               calls=self.calls, streams=self.streams)  # fmt: skip
        self.starter = Starter(app, self.holdings, self.policy, self.heartbeat, self.completer,
                               self.waker, calls=self.calls, streams=self.streams,
                               builtin=builtin, batcher=self.batcher)  # fmt: skip
        self.executors = Executors(  # where handlers run, one executor per mode
            InlineExecutor(config, self.signals, self.waker, post,
                           before=self._inline_begins, after=self.heartbeat.cancel_chore),
            ThreadExecutor(config.concurrency, config, post, self._follow),
            AsyncExecutor(config, post),
            LaneExecutor(max(1, lane), config, post),  # (takes only what it is given)
        )  # fmt: skip
        self.alarms = Alarms(config, self.holdings, self.executors, post)
        self.publisher = Publisher(slot, self.holdings, self.counters)
        self.exchange = Exchange(owner, config, self.completer, self.holdings, self.policy,
                                 self.heartbeat, self.publisher, self.served)  # fmt: skip
        self.health = Health(self.heartbeat, self.executors, config, parent_pid)
        self.services = Services(app, config, open_store, self.outage, slot)

    def _presence(self, owner: str, config: WorkerConfig) -> Presence:
        """The worker's row in the store's worker list, kept by the heartbeat thread."""
        return Presence(
            owner,
            every=config.interval,
            slots=config.concurrency,
            queues=config.queues,
            tasks=self.served,
            draining=lambda: self.signals.asked,
            outage=self.outage,
        )

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        tracing.configure()  # in this process (after fork): OTEL_* may name an exporter
        self.heartbeat.start()
        try:
            self.services.boot(self.store)  # tasks, limits, schedules: what every claim reads
            if hooks.start(self.app.worker_start, self._on_loop) is not None:
                return exitcodes.BOOT_FAILURE  # it cannot work as its app expects: no claim
            self._hooks_started = True
            while True:
                self.signals.absorb(self.waker.drain())
                self._react(self.inbox.take())
                code = self._health()
                if code is not None:
                    return code
                if self.signals.quit:
                    self.exchange.abandon("WorkerStopped: QUIT while the task ran", self.executors)
                    return exitcodes.OK
                self._start_waiting()
                turn = self.policy.turn(self._view())
                if turn.talks_to_store:
                    self.exchange.commit_and_claim(turn.hand_back, turn.want, turn.start,
                                                   turn.lane)  # fmt: skip
                    continue
                code = self._drained()
                if code is not None:
                    return code
                self._wait(turn.want)
        finally:
            self._shutdown()

    def _health(self) -> int | None:
        if self.exit_code is not None:
            return self.exit_code
        unwell = self.health.check()
        if unwell is None:
            return None
        if unwell.release is not None:
            self.exchange.abandon(unwell.release, self.executors)
        return unwell.code

    def _start_waiting(self) -> None:
        """Submit what may start now. An inline handler runs within ``submit``: its ending (and
        whatever else was reported meanwhile) is taken before the next start, so a drain it
        caused (``--max-tasks``) starts nothing more."""
        for ex in self.starter.start_waiting():
            self.publisher.phase()
            self.executors[ex.mode].submit(ex)
            if self.executors[ex.mode].on_conductor:
                self._react(self.inbox.take())

    def _view(self) -> View:
        done = self.completer
        return self.holdings.view(self.policy.capacity, len(done.pending), done.since)

    def _drained(self) -> int | None:
        """Not accepting work and nothing left to do (or the drain is overdue): the exit code."""
        if self.policy.accepting:
            return None
        busy = bool(self.completer.pending) or self.holdings.busy() or bool(self.inbox)
        code = self.policy.drained(busy)
        if code is not None and busy:
            event(
                log,
                "drain_timeout",
                "slots still busy after --graceful-timeout: exiting without them",
                level=logging.ERROR,
                busy=len(self.holdings.running),
            )
        return code

    def drain(self, code: int, why: str) -> None:
        """Stop claiming; exit with ``code`` once the running tasks finished (bounded)."""
        if self.policy.drain(code):
            event(
                log,
                "worker_draining",
                f"worker {self.pid}: {why}; finishing its running tasks, then exiting",
                why=why,
                code=code,
            )

    # -- events -----------------------------------------------------------------------------------
    def _on_the_spot(self, report: Event) -> Reaction | None:
        """The reflex (``events.py``), on the thread that reports, before the conductor hears
        of it. An ending frees its slot at once (a slot thread may start the next task itself)
        and the heartbeat hears of it now: a lost lease's handler that returned is no stuck
        one, however long the conductor takes to collect it (a slow exchange after a pause).
        The heartbeat's reports are the alarms' (they interrupt, release, hand back, exit)."""
        if isinstance(report, TaskFinished):
            ex = report.execution
            self.heartbeat.finished(ex.lease)
            self.holdings.end(ex)
            return None
        return self.alarms.react(report)

    def _react(self, events: Iterable[Event]) -> None:
        """The conductor's reactions to what its threads reported, in order."""
        for report in events:
            match report:
                case TaskFinished(ex):
                    self._collect(ex)
                case DrainAsked(code, why):
                    self.drain(code, why)
                case HeartbeatDied():
                    self.exit_code = exitcodes.HEARTBEAT_DIED
                case SlowBehind():
                    self.policy.slow_after_all()
        if self.policy.recycle_due:
            self.drain(exitcodes.RECYCLE, f"recycling after {self.policy.tasks_done} tasks")

    def _collect(self, ex: Execution) -> None:
        if ex.batch:  # a batch's leader: the batch's size, for metrics
            self.counters.batch_done(ex.batch)
        self.counters.claims += ex.rider  # (a rider was claimed by its batch, not the exchange)
        if not ex.late:  # a handler that never began did no task
            self.counters.task_done(ex.seconds)
            if ex.mode is not Mode.LANE:  # (a delivery: not the users' pace, nor --max-tasks)
                self.policy.task_done(ex.seconds)
        if ex.stopped is Stopped.ABANDONED:
            return  # timed out on a thread: its lease was released already
        if ex.commit is not None:
            self.completer.add(ex.commit)
        else:
            self.heartbeat.untrack([ex.lease])

    def _follow(self) -> Execution | None:
        """What a slot thread whose handler ended runs next (``Starter.next_for_thread``)."""
        return self.starter.next_for_thread()

    def _inline_begins(self) -> None:
        """An inline handler takes the main thread over: the leases prefetched behind it go
        back if it turns out slow (the heartbeat thread does it: this thread is busy)."""
        if self.holdings.waiting:
            chore = self.alarms.hand_back_behind
            self.heartbeat.schedule_chore(time.monotonic() + SLOW_BEHIND, chore)

    # -- waiting ----------------------------------------------------------------------------------
    def _wait(self, want: int) -> None:
        """Sleep until a part reports (a handler ended, say), a signal comes, or work may be
        claimable: a change by another connection, the next delayed task or expiring lease, or
        the poll interval (R7). A claim just answered "nothing", so a due time already past
        never cuts the wait short: that would spin on the write lock."""
        if self.inbox:
            return
        deadline = self.policy.wake_at(self._view(), want)
        if not want:
            self.signals.absorb(self.waker.wait(max(0.0, deadline - time.monotonic())))
            return
        looked, self._looked = self._looked, None
        self._looked = watch_for_work(
            self.store,
            self.waker,
            self.signals,
            deadline=deadline,
            queues=self.config.queues,
            interrupted=self.inbox.__bool__,
            outage=self.outage,
            looked=looked,
        )
        if self._looked is None:
            self.policy.watched()
        else:  # the poll interval's look found nothing claimable: no claim, R7 looks again
            self.policy.nothing_due()

    # -- the end ----------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Whatever waits unstarted goes back (a claim fused into the last exchange, say)."""
        if self.exit_code is None:
            self.exchange.hand_back_waiting()
        self.publisher.phase(STOPPING)
        if self._hooks_started:  # after the last task, while the handlers' loop still runs
            hooks.stop(self.app.worker_stop, self._on_loop)
        self.executors.close()
        self.batcher.close()
        self.services.close()
        self.calls.close()  # after the handlers: a keep handed over is written first
        self.streams.close()  # ... and what they emitted
        self.heartbeat.close()
        tracing.shutdown()  # its spans flushed before the process ends

    def _on_loop(self, awaitable: Awaitable[Any]) -> Any:
        """An ``async def`` hook runs on the loop of the async handlers (``hooks``)."""
        executor = self.executors[Mode.ASYNC]
        assert isinstance(executor, AsyncExecutor)
        return executor.run(awaitable)
