"""The conductor (R7): one loop per worker process that keeps its slots busy.

Each turn it collects the handlers that finished, starts waiting leases on free slots, and, in
ONE store transaction, writes every finished slot's last word (each fenced on its own) and
claims for the free slots. Under low load a free slot claims at once; under high load batches
form by themselves while the previous transaction runs. Short handlers earn a prefetch: up to
K leases beyond the free slots, handed back unstarted (no attempt spent) as soon as the slots
turn out slow. Idle, it sleeps on a self-pipe and polls a cheap change token, never the write
lock. One heartbeat thread renews every lease the worker holds.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable

from . import exitcodes
from .app import App
from .completer import Completer
from .config import WorkerConfig
from .custody import Custody
from .execution import Execution, Mode, Stopped, failure, message, mode_for
from .executors import Executors
from .executors.aio import AsyncExecutor
from .executors.inline import InlineExecutor
from .executors.threads import ThreadExecutor
from .heartbeat import Heartbeat
from .idle import watch_for_work
from .logs import event
from .policy import CONFIRM_WAIT, SLOW_BEHIND, Policy, Start, View
from .signals import Signals, Waker
from .status import CLAIMING, COMMITTING, HANDLER, IDLE, STOPPING, Counters, StatusSlot
from .store import ClaimRequest, Commit, Lease, Store, StoreError

log = logging.getLogger("workerproc.worker")


class Worker(Custody):
    def __init__(
        self,
        store: Store,
        app: App,
        config: WorkerConfig,
        *,
        owner: str,
        open_store: Callable[[], Store],
        waker: Waker | None = None,
        slot: StatusSlot | None = None,
        parent_pid: int | None = None,
    ) -> None:
        config.validate()
        super().__init__()
        self.store, self.app, self.config, self.owner = store, app, config, owner
        self.waker = waker or Waker()
        self.signals = Signals()
        self.slot = slot
        self.parent_pid = parent_pid
        self.pid = os.getpid()
        self.capacity = config.concurrency
        self.policy = Policy(config, self.signals)  # every decision; this class acts on them
        self.counters = Counters()  # published to the status slot for the supervisor's metrics
        self._blocking: Execution | None = None  # the handler last reported blocking the loop
        self._request = ClaimRequest(owner, config.lease_ttl, config.max_attempts, 1,
                                     config.queues)  # fmt: skip
        self.executors = Executors(  # where handlers run, one executor per mode
            InlineExecutor(config, self.signals, self.waker, self._ended_inline,
                           before=self._inline_begins, after=self._inline_ended),
            ThreadExecutor(self.capacity, config, self._ended_on_thread),
            AsyncExecutor(config, self._ended),
        )  # fmt: skip
        self.heartbeat = Heartbeat(
            open_store,
            ttl=config.lease_ttl,
            interval=config.interval,
            on_lost=self._on_lost,
            on_timeout=self._on_timeout,
            on_death=self._on_heartbeat_death,
            on_stuck=self._on_stuck,
            task_timeout=config.task_timeout,
        )
        self.completer = Completer(  # the finished slots' commits, written with the next claim
            store,
            config.lease_ttl,
            self.heartbeat,
            unwritable=lambda commit, exc: failure(commit.lease, exc, config),
        )

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        self.heartbeat.start()
        try:
            while True:
                self.signals.absorb(self.waker.drain())
                code = self._health()
                if code is not None:
                    return code
                if self.signals.quit:
                    self._abandon("WorkerStopped: QUIT while the task ran")
                    return exitcodes.OK
                self._collect()
                self._start_waiting()
                turn = self.policy.turn(self._view())
                if turn.exchange:
                    self._exchange(turn.hand_back, turn.want)
                    continue
                code = self._drained()
                if code is not None:
                    return code
                self._wait(turn.want)
        finally:
            self._shutdown()

    def _health(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        if not self.heartbeat.is_alive():
            return exitcodes.HEARTBEAT_DIED
        died = self.executors.dead()
        if died is not None:  # its executions are gone: give their leases back, be replaced
            event(log, "slots_died", f"worker {self.pid}: {message(died)}; exiting",
                  level=logging.ERROR, error=type(died).__name__)  # fmt: skip
            self._abandon(f"WorkerCrashed: the worker's slots died ({message(died)})")
            return exitcodes.SLOT_DIED
        self._watch_loop()
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

    def _watch_loop(self) -> None:
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
        who = (f"task {ex.lease.task_id} ({ex.lease.task}) attempt {ex.lease.attempt}"
               if ex is not None else "a task that is no handler's own")  # fmt: skip
        event(log, "loop_blocked",
              f"{who} has blocked the event loop for {lag:.1f}s: an async handler calls "
              "blocking code, and every async slot of this worker waits",
              level=logging.WARNING, task_id=ex.lease.task_id if ex else None,
              run_id=ex.lease.run_id if ex else None, seconds=round(lag, 1))  # fmt: skip

    def _accepting(self) -> bool:
        return self.policy.accepting

    def _view(self) -> View:
        """What the worker holds now, for the policy (one look under the lock)."""
        with self._lock:
            running = len(self.running)
            youngest = (max(ex.started for ex in self.running.values())
                        if running and running >= self.capacity else -math.inf)  # fmt: skip
            waiting = len(self.prefetched)
        done = self.completer
        return View(running, youngest, waiting, len(done.pending), done.since)

    def _drained(self) -> int | None:
        """Not accepting work and nothing left to do (or the drain is overdue): the exit code."""
        if self.policy.accepting:
            return None
        busy = bool(self._completed or self.prefetched or self.completer.pending) or any(
            ex.stopped is not Stopped.ABANDONED for ex in self._executions()
        )
        code = self.policy.drained(busy)
        if code is not None and busy:
            event(
                log,
                "drain_timeout",
                "slots still busy after --graceful-timeout: exiting without them",
                level=logging.ERROR,
                busy=len(self.running),
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

    # -- slots ------------------------------------------------------------------------------------
    def _ended(self, ex: Execution) -> None:
        """A handler ended (any thread): its slot is free; the conductor collects it on its
        next turn (woken by the first of a batch: it collects them all)."""
        with self._lock:
            self.running.pop(ex.lease.task_id, None)
            first = not self._completed
            self._completed.append(ex)
        if first:
            self.waker.wake()

    def _ended_on_thread(self, ex: Execution) -> Execution | None:
        """A slot thread's handler ended: the thread starts the next prefetched task itself
        when it has a plain handler and a fresh lease (R4's start rule), so short tasks never
        wait for a conductor turn. Anything else (an async or unknown task, a lease to renew
        first, nothing prefetched, draining) is the conductor's."""
        self._ended(ex)
        with self._lock:
            policy = self.policy
            if not (self.prefetched and policy.slot_free(len(self.running)) and policy.accepting):
                return None
            lease = self.prefetched[0]
            handler = self.app.handlers.get(lease.task)
            if handler is None or mode_for(handler, self.capacity) is not Mode.THREAD:
                return None
            confirmed = self.heartbeat.confirmed_at(lease)
            if confirmed is None or not policy.chains(confirmed):
                self.waker.wake()
                return None
            self.prefetched.popleft()
            nxt = self.running[lease.task_id] = Execution(lease, handler, Mode.THREAD)
            self._gate(nxt, confirmed)
        self.heartbeat.started(lease)
        return nxt

    def _collect(self) -> None:
        with self._lock:
            ended = list(self._completed)
            self._completed.clear()
        for ex in ended:
            self.heartbeat.finished(ex.lease)
            if not ex.late:  # a handler that never began did no task
                self.counters.task_done(ex.seconds)
                self.policy.task_done(ex.seconds)
            if ex.stopped is Stopped.ABANDONED:
                continue  # timed out on a thread: its lease was released already
            if ex.commit is not None:
                self.completer.add(ex.commit)
            else:
                self.heartbeat.untrack([ex.lease])
        if self.policy.recycle_due:
            self.drain(exitcodes.RECYCLE, f"recycling after {self.policy.tasks_done} tasks")

    def _start_waiting(self) -> None:
        """Start prefetched leases on the free slots, each only on a lease confirmed a moment
        ago (R4's start rule, ``startrule``): one that waited longer is renewed first, every
        such lease of this turn in one statement. Slot threads start some themselves: the check
        and the move into ``running`` are one step under the lock."""
        vouched: dict[int, float] | None = None  # renewed at this turn's request: may start
        policy = self.policy
        while policy.accepting:
            with self._lock:
                if not self.prefetched or not policy.slot_free(len(self.running)):
                    return
                lease = self.prefetched[0]
            confirmed = self.heartbeat.confirmed_at(lease)
            asked = vouched.get(lease.task_id) if vouched is not None else None
            start = policy.start(confirmed, asked, vouched is not None)
            if start is Start.DROP:  # lost while it waited: never start it
                self._drop_waiting(lease)
                continue
            if start is Start.LATER:
                return  # renewed once this turn and not answered: the next turn tries again
            if start is Start.RENEW:
                vouched = self._confirm_waiting()
                continue
            assert confirmed is not None
            with self._lock:
                if not self.prefetched or self.prefetched[0] is not lease:
                    continue  # lost (or handed back) meanwhile
                self.prefetched.popleft()
                handler = self.app.handlers.get(lease.task)
                ex = None
                if handler is not None:
                    ex = Execution(lease, handler, mode_for(handler, self.capacity))
                    self._gate(ex, confirmed)
                    self.running[lease.task_id] = ex
            if ex is None:
                error = f"UnknownTask: no handler named {lease.task!r} in this app"
                self.completer.add(Commit(lease, "fail", reason="unknown_task", error=error))
                continue
            self._start(ex)

    def _gate(self, ex: Execution, confirmed: float) -> None:
        lease = ex.lease
        ex.gate(
            confirmed, self.policy.begin_by(confirmed), lambda: self.heartbeat.confirmed_at(lease)
        )

    def _confirm_waiting(self) -> dict[int, float]:
        """Renew, in one round of the heartbeat, every lease that waits for one of the free
        slots and is no longer fresh, and wait for it. Returns when each lease the database
        confirmed was sent its renewal: they may start this turn however long the round trip
        took (their window counts from that moment). A refused one is dropped as lost."""
        with self._lock:
            free = self.capacity - len(self.running)
            waiting = list(itertools.islice(self.prefetched, max(0, free)))
        renew = self.policy.stale(self.heartbeat.confirmed_at(w) for w in waiting)
        stale = [w for w, old in zip(waiting, renew, strict=True) if old]
        if not stale:
            return {}
        confirmed = self.heartbeat.confirm(stale, timeout=CONFIRM_WAIT)
        for lease in stale:
            if lease.task_id not in confirmed and self.heartbeat.confirmed_at(lease) is None:
                self._drop_waiting(lease)  # refused: taken over while it waited
        return confirmed

    def _drop_waiting(self, lease: Lease) -> None:
        """A prefetched lease that was lost before it started: forget it, write nothing."""
        with self._lock:
            if lease in self.prefetched:
                self.prefetched.remove(lease)
        self.heartbeat.forget([lease])

    def _start(self, ex: Execution) -> None:
        self.heartbeat.started(ex.lease)
        self._publish()
        self.executors[ex.mode].submit(ex)

    def _inline_begins(self) -> None:
        """An inline handler takes the main thread over: the leases prefetched behind it go
        back if it turns out slow (the heartbeat thread does it: this thread is busy)."""
        if self.prefetched:
            self.heartbeat.after(time.monotonic() + SLOW_BEHIND, self._hand_back_behind)

    def _inline_ended(self) -> None:
        self.heartbeat.cancel_chore()

    def _ended_inline(self, ex: Execution) -> None:
        """The inline handler returned: collect it now, so the next one starts in this turn."""
        self._ended(ex)
        self._collect()

    # -- the store conversation -------------------------------------------------------------------
    def _exchange(self, hand_back: bool, want: int) -> None:
        handbacks: list[Commit] = []
        if hand_back:  # behind slow slots, or the worker stopped taking work
            with self._lock:
                waiting, self.prefetched = list(self.prefetched), deque()
            handbacks = [Commit(lease, "handback") for lease in waiting]
        claim = dataclasses.replace(self._request, limit=want) if want else None
        self._publish(COMMITTING if self.completer.pending or handbacks else CLAIMING)
        leases = self.completer.commit_and_claim(handbacks, claim)
        for lease in leases:
            self.counters.claims += 1
            self.counters.takeovers += lease.takeover
        with self._lock:
            self.prefetched.extend(leases)
        if want:
            self.policy.claimed(want, len(leases))
        self._publish()
        self._publish_counters()

    def _abandon(self, error: str) -> None:
        """QUIT (or dead slots): give every lease back at once, the running ones released with
        ``error``; handlers on threads die with the process."""
        with self._lock:
            running, waiting = list(self.running.values()), list(self.prefetched)
            self.running.clear()
            self.prefetched.clear()
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
        watch_for_work(
            self.store,
            self.waker,
            self.signals,
            deadline=deadline,
            queues=self.config.queues,
            interrupted=lambda: bool(self._completed) or self._exit_code is not None,
        )
        self.policy.watched()

    # -- status and the end -----------------------------------------------------------------------
    def _publish(self, phase: int | None = None) -> None:
        if self.slot is None:
            return
        with self._lock:
            busy = len(self.running)
            first = next(iter(self.running.values()), None)
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
        with self._lock:
            waiting = list(self.prefetched)
            self.prefetched.clear()
        if waiting and self._exit_code is None:
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
        self.executors.close()
        self.heartbeat.close()
