"""The conductor (R7): one loop per worker process that keeps its slots busy.

Each turn it collects the handlers that finished, starts waiting leases on free slots, and, in
ONE store transaction, writes every finished slot's last word (each fenced on its own) and
claims for the free slots. Under low load a free slot claims at once; under high load batches
form by themselves while the previous transaction runs. Short handlers earn a prefetch: up to
K leases beyond the free slots, handed back unstarted (no attempt spent) as soon as the slots
turn out slow. Idle, it sleeps on a self-pipe and polls a cheap change token, never the write
lock. One heartbeat thread renews every lease the worker holds.

The conductor only acts; its parts decide and keep. ``Policy`` (``policy.py``) makes every
decision from a ``View`` of what the worker holds (``Holdings``); ``Starter`` starts waiting
leases under R4's start rule; the ``Executors`` run handlers, one per mode (webhook deliveries on
a lane of their own, ``LANE`` threads beside the users' slots, B20); the ``Completer``
buffers finished commits and writes them with the next claim; the ``Heartbeat`` renews leases
and reports to the ``Alarms``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from . import exitcodes, hooks, tracing
from .alarms import Alarms
from .app import App
from .completer import Completer
from .config import WorkerConfig
from .courier import Courier
from .delivery import LANE, Deliverer, on_lane, serves_webhooks
from .execution import Execution, Mode, Stopped, failure, max_attempts, message
from .executors import Executors
from .executors.aio import AsyncExecutor
from .executors.inline import InlineExecutor
from .executors.threads import LaneExecutor, ThreadExecutor
from .heartbeat import Heartbeat
from .holdings import Holdings
from .idle import watch_for_work
from .logs import attempt_of, event
from .once import CALL_SEATS, CallBook
from .outage import Outage
from .policy import SLOW_BEHIND, Policy, View
from .presence import Presence
from .signals import Signals, Waker
from .starter import Starter
from .status import CLAIMING, COMMITTING, HANDLER, IDLE, STOPPING, Counters, StatusSlot
from .store import ClaimRequest, Commit, StoreError, WorkerStore
from .store.limits import TOO_LARGE
from .store.roles import CallStore
from .store.webhooks import DELIVERY_TASK, WEBHOOK_QUEUE
from .ticker import Ticker

log = logging.getLogger("workerproc.worker")

FIRERS = 2  # the workers of a pool (its first indexes) that fire the schedules, wake webhooks


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
        delivery_store: Callable[[], WorkerStore] | None = None,
        waker: Waker | None = None,
        slot: StatusSlot | None = None,
        parent_pid: int | None = None,
    ) -> None:
        config.validate()
        self.store, self.app, self.config, self.owner = store, app, config, owner
        self.waker = waker or Waker()
        self.signals = Signals()
        self.slot = slot
        self.parent_pid = parent_pid
        self.pid = os.getpid()
        self.counters = Counters()  # published to the status slot for the supervisor's metrics
        self._blocking: Execution | None = None  # the handler last reported blocking the loop
        self._hooks_started = False  # the start hooks ran: the stop hooks run at the end
        # the users' slots claim every queue they serve but the webhooks'; the lane claims that
        lane = LANE if serves_webhooks(config.queues) else 0
        self._claim_request = ClaimRequest(owner, config.lease_ttl, config.max_attempts, 1,
                                           config.queues, skip=(WEBHOOK_QUEUE,))  # fmt: skip
        self._lane_request = ClaimRequest(owner, config.lease_ttl, config.max_attempts, 1,
                                          (WEBHOOK_QUEUE,))  # fmt: skip
        # every decision; this class acts on them
        self.policy = Policy(config, self.signals, lane=lane)
        # running, waiting, ended: shared with the other threads
        self.holdings = Holdings(on_lane if lane else None)
        self.executors = Executors(  # where handlers run, one executor per mode
            InlineExecutor(config, self.signals, self.waker, self._ended_inline,
                           before=self._inline_begins, after=self._inline_ended),
            ThreadExecutor(config.concurrency, config, self._ended_on_thread),
            AsyncExecutor(config, self._ended),
            LaneExecutor(max(1, lane), config, self._ended),  # (takes only what it is given)
        )  # fmt: skip
        self.outage = Outage()  # a database that stops answering, told once per incident
        self._open_store = open_store
        self.ticker: Ticker | None = None  # the schedules' firer, when the app declares any
        self.courier: Courier | None = None  # the webhooks' waker (B20)
        # The heartbeat reports to the alarms, which tell it what to stop renewing: each needs
        # the other, so its reports reach the alarms through self (its thread starts in run()).
        self.heartbeat = Heartbeat(
            open_store,
            ttl=config.lease_ttl,
            interval=config.interval,
            on_lost=lambda lease, why: self.alarms.lease_lost(lease, why),  # noqa: PLW0108
            on_timeout=lambda lease, store: self.alarms.timed_out(lease, store),  # noqa: PLW0108
            on_death=lambda exc: self.alarms.heartbeat_died(exc),  # noqa: PLW0108
            on_stuck=lambda lease: self.alarms.handler_stuck(lease),  # noqa: PLW0108
            on_cancelled=lambda lease, store: self.alarms.run_cancelled(lease, store),  # noqa: PLW0108
            task_timeout=config.task_timeout,
            outage=self.outage,
            presence=self._presence(owner, config),
        )
        self.alarms = Alarms(config, self.holdings, self.executors, self.policy, self.heartbeat,
                             self.waker, drain=self.drain)  # fmt: skip
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
        # the built-in task every worker serves: webhook delivery (B20), on its own connections
        deliverer = Deliverer(delivery_store or open_store, lambda: not self.policy.accepting)
        builtin = {DELIVERY_TASK: deliverer}  # (stopping: it starts no new POST)
        self.starter = Starter(app, self.holdings, self.policy, self.heartbeat, self.executors,
                               self.completer, self.waker, starting=self._publish,
                               calls=self.calls, builtin=builtin)  # fmt: skip

    def _presence(self, owner: str, config: WorkerConfig) -> Presence:
        """The worker's row in the store's worker list, kept by the heartbeat thread."""
        return Presence(
            owner,
            every=config.interval,
            slots=config.concurrency,
            queues=config.queues,
            draining=lambda: self.signals.asked,
            outage=self.outage,
        )

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        tracing.configure()  # in this process (after fork): OTEL_* may name an exporter
        self.heartbeat.start()
        try:
            # B11: the app's per-task options, where every worker's claims read them; its
            # limits, whose numbers every claim obeys
            self.store.register_tasks(self.app.task_options())
            for told in self.store.declare_limits(self.app.limits, by=socket.gethostname()):
                kind = TOO_LARGE if told.startswith("task ") else "limit_redeclared"
                event(log, kind, told, level=logging.WARNING)
            self._start_schedules()
            self._start_courier()
            if hooks.start(self.app.worker_start, self._on_loop) is not None:
                return exitcodes.BOOT_FAILURE  # it cannot work as its app expects: no claim
            self._hooks_started = True
            while True:
                self.signals.absorb(self.waker.drain())
                code = self._health()
                if code is not None:
                    return code
                if self.signals.quit:
                    self._abandon("WorkerStopped: QUIT while the task ran")
                    return exitcodes.OK
                self._collect()
                self.starter.start_waiting()
                turn = self.policy.turn(self._view())
                if turn.talks_to_store:
                    self._commit_and_claim(turn.hand_back, turn.want, turn.start, turn.lane)
                    continue
                code = self._drained()
                if code is not None:
                    return code
                self._wait(turn.want)
        finally:
            self._shutdown()

    def _start_schedules(self) -> None:
        """The app's schedules, written where every worker sees them, and fired by
        a small thread (``ticker``) of the first ``FIRERS`` workers of each pool (two: one
        may be dying or restarting; more would only contend for the same ticks); an app
        without schedules fires none."""
        specs = self.app.schedule_specs()
        if not specs:
            return
        for told in self.store.declare_schedules(specs, by=socket.gethostname()):
            event(log, "schedule_redeclared", told, level=logging.WARNING)
        if self.slot is not None and self.slot.index >= FIRERS:
            return
        self.ticker = Ticker(self._open_store, self.outage)
        self.ticker.start()

    def _start_courier(self) -> None:
        """B20: the webhooks' waker, in the first ``FIRERS`` workers of a pool that serves
        the webhooks' queue (it signals parked deliveries; the delivering is any worker's)."""
        if not serves_webhooks(self.config.queues):
            return
        if self.slot is not None and self.slot.index >= FIRERS:
            return
        self.courier = Courier(self._open_store, self.outage)
        self.courier.start()

    def _health(self) -> int | None:
        if self.alarms.exit_code is not None:
            return self.alarms.exit_code
        if not self.heartbeat.is_alive():
            return exitcodes.HEARTBEAT_DIED
        died = self.executors.dead()
        if died is not None:  # its executions are gone: give their leases back, be replaced
            event(log, "slots_died", f"worker {self.pid}: {message(died)}; exiting",
                  level=logging.ERROR, error=type(died).__name__)  # fmt: skip
            self._abandon(f"WorkerCrashed: the worker's slots died ({message(died)})")
            return exitcodes.SLOT_DIED
        self._report_blocked()
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            event(
                log,
                "parent_gone",
                f"parent {self.parent_pid} is gone: exiting",
                level=logging.ERROR,
                parent=self.parent_pid,
            )
            return exitcodes.PARENT_DIED
        return None

    def _report_blocked(self) -> None:
        """Say once per incident that an async handler blocks the event loop (and so every
        async slot): the loop has not ticked for ``executors.BLOCKED_AFTER``."""
        blocked = self.executors.blocked()
        if blocked is None:
            self._blocking = None
            return
        lag, ex = blocked
        if ex is self._blocking and ex is not None:
            return
        self._blocking = ex
        who = (f"task {ex.lease.task_id} ({ex.lease.task}) "
               f"{attempt_of(ex.lease, max_attempts(ex.lease, self.config))}"
               if ex is not None else "a task that is no handler's own")  # fmt: skip
        event(log, "loop_blocked",
              f"{who} has blocked the event loop for {lag:.1f}s: an async handler calls "
              "blocking code, and every async slot of this worker waits",
              level=logging.WARNING, task_id=ex.lease.task_id if ex else None,
              run_id=ex.lease.run_id if ex else None, seconds=round(lag, 1))  # fmt: skip

    def _view(self) -> View:
        done = self.completer
        return self.holdings.view(self.policy.capacity, len(done.pending), done.since)

    def _drained(self) -> int | None:
        """Not accepting work and nothing left to do (or the drain is overdue): the exit code."""
        if self.policy.accepting:
            return None
        busy = bool(self.completer.pending) or self.holdings.busy()
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
        self.waker.wake()

    # -- endings ----------------------------------------------------------------------------------
    def _ended(self, ex: Execution) -> None:
        """A handler ended (any thread): its slot is free; the conductor collects it on its
        next turn (woken by the first of a batch: it collects them all). The heartbeat hears of
        it now: a lost lease's handler that returned is no stuck one, however long the
        conductor takes to collect it (a slow exchange after a pause)."""
        self.heartbeat.finished(ex.lease)
        if self.holdings.end(ex):
            self.waker.wake()

    def _ended_on_thread(self, ex: Execution) -> Execution | None:
        """A slot thread's handler ended: what the thread runs next (``Starter``)."""
        self._ended(ex)
        return self.starter.next_for_thread()

    def _ended_inline(self, ex: Execution) -> None:
        """The inline handler returned, on this very thread: collect it now (nothing to wake),
        so the next one starts in this turn."""
        self.heartbeat.finished(ex.lease)
        self.holdings.end(ex)
        self._collect()

    def _inline_begins(self) -> None:
        """An inline handler takes the main thread over: the leases prefetched behind it go
        back if it turns out slow (the heartbeat thread does it: this thread is busy)."""
        if self.holdings.waiting:
            chore = self.alarms.hand_back_behind
            self.heartbeat.schedule_chore(time.monotonic() + SLOW_BEHIND, chore)

    def _inline_ended(self) -> None:
        self.heartbeat.cancel_chore()

    def _collect(self) -> None:
        for ex in self.holdings.collect():
            if not ex.late:  # a handler that never began did no task
                self.counters.task_done(ex.seconds)
                if ex.mode is not Mode.LANE:  # (a delivery: not the users' pace, nor --max-tasks)
                    self.policy.task_done(ex.seconds)
            if ex.stopped is Stopped.ABANDONED:
                continue  # timed out on a thread: its lease was released already
            if ex.commit is not None:
                self.completer.add(ex.commit)
            else:
                self.heartbeat.untrack([ex.lease])
        if self.policy.recycle_due:
            self.drain(exitcodes.RECYCLE, f"recycling after {self.policy.tasks_done} tasks")

    # -- the store conversation -------------------------------------------------------------------
    def _commit_and_claim(
        self, hand_back: bool, want: int, start: int | None = None, lane: int = 0
    ) -> None:
        handbacks: list[Commit] = []
        if hand_back:  # behind slow slots, or the worker stopped taking work
            handbacks = [Commit(lease, "handback") for lease in self.holdings.take_waiting()]
        claim = (dataclasses.replace(self._claim_request, limit=want, start=start)
                 if want else None)  # fmt: skip
        if lane:  # the delivery lane's claim, in the same transaction (after the users')
            deliveries = dataclasses.replace(self._lane_request, limit=lane)
            claim = deliveries if claim is None else dataclasses.replace(claim, also=deliveries)
        self._publish(COMMITTING if self.completer.pending or handbacks else CLAIMING)
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
        self._publish()
        self._publish_counters()

    def _abandon(self, error: str) -> None:
        """QUIT (or dead slots): give every lease back at once, the running ones released with
        ``error``; handlers on threads die with the process."""
        running, waiting = self.holdings.clear()
        for ex in running:
            self.executors[ex.mode].interrupt(ex, Stopped.QUIT)
        commits = self.completer.take()
        commits += [Commit(ex.lease, "release", error=error) for ex in running]
        commits += [Commit(lease, "handback") for lease in waiting]
        if commits:
            self.heartbeat.untrack([c.lease for c in commits])
            self.completer.write(commits, None)

    # -- waiting ----------------------------------------------------------------------------------
    def _wait(self, want: int) -> None:
        """Sleep until a handler ends, a signal comes, or work may be claimable: a change by
        another connection, the next delayed task or expiring lease, or the poll interval
        (R7). A claim just answered "nothing", so a due time already past never cuts the
        wait short: that would spin on the write lock."""
        deadline = self.policy.wake_at(self._view(), want)
        if not want:
            self.signals.absorb(self.waker.wait(max(0.0, deadline - time.monotonic())))
            return
        holdings, alarms = self.holdings, self.alarms
        watch_for_work(
            self.store,
            self.waker,
            self.signals,
            deadline=deadline,
            queues=self.config.queues,
            interrupted=lambda: bool(holdings.ended) or alarms.exit_code is not None,
            outage=self.outage,
        )
        self.policy.watched()

    # -- status and the end -----------------------------------------------------------------------
    def _publish(self, phase: int | None = None) -> None:
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

    def _publish_counters(self) -> None:
        if self.slot is not None:
            self.slot.publish_counters(self.pid, self.counters)

    def _shutdown(self) -> None:
        """Whatever waits unstarted goes back (a claim fused into the last exchange, say)."""
        waiting = self.holdings.take_waiting()
        if waiting and self.alarms.exit_code is None:
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
        self._publish(STOPPING)
        if self._hooks_started:  # after the last task, while the handlers' loop still runs
            hooks.stop(self.app.worker_stop, self._on_loop)
        self.executors.close()
        if self.ticker is not None:
            self.ticker.close()
        if self.courier is not None:
            self.courier.close()
        self.calls.close()  # after the handlers: a keep handed over is written first
        self.heartbeat.close()
        tracing.shutdown()  # its spans flushed before the process ends

    def _on_loop(self, awaitable: Awaitable[Any]) -> Any:
        """An ``async def`` hook runs on the loop of the async handlers (``hooks``)."""
        executor = self.executors[Mode.ASYNC]
        assert isinstance(executor, AsyncExecutor)
        return executor.run(awaitable)
