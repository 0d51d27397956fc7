"""The claim loop (R7): claim, renew at start (R4), run the handler, commit fenced (R5), and claim
again in the same transaction (drain). Idle workers sleep on a self-pipe and poll a cheap change
token, never the write lock."""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable

from . import exitcodes
from .app import App, Handler, LeaseLost, TaskContext
from .config import WorkerConfig
from .heartbeat import Heartbeat
from .status import CLAIMING, COMMITTING, HANDLER, IDLE, STOPPING, Counters, StatusSlot
from .store import (
    CasResult,
    ClaimRequest,
    Commit,
    InvalidPayload,
    Lease,
    Store,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
)
from .store.codec import dumps
from .waker import Waker

log = logging.getLogger("workerproc.worker")

# R4: a claim younger than this needs no start renewal. The claim itself granted a full ttl a
# moment ago; renewing again would only cost a write transaction per task and confirm nothing
# new. Older leases (the worker waited between claim and start) are renewed before the handler.
FRESH_CLAIM = 0.05
CHANGE_CHECK = 0.01  # idle: how often the cheap change token is read (no write lock)
INTERRUPT = signal.SIGUSR1  # heartbeat thread -> main thread: abort the handler
# A process that opened the database while it could not be written keeps a read-only view of
# it (SQLite's shared-memory index is per process) until all its connections close, the
# heartbeat's too: past this long the worker exits (STORE_ERROR) and a new process reopens it.
# At least the supervisor's crash window, so replacements never escalate its backoff.
READONLY_EXIT = 5.0


class _Abort(BaseException):
    """QUIT arrived while a handler ran: abandon it (the lease is released, nothing written)."""


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    tb = "".join(traceback.format_exception(exc, limit=-5))
    return f"{type(exc).__name__}: {exc}\n{tb}"[:limit]


class Worker:
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
        self.store, self.app, self.config, self.owner = store, app, config, owner
        self.waker = waker or Waker()
        self.slot = slot
        self.parent_pid = parent_pid
        self.pid = os.getpid()
        self.tasks_done = 0
        self.counters = Counters()  # published to the status slot for the supervisor's metrics
        self.stop_signal: int | None = None  # TERM/INT: finish the current task, then stop
        self.quit = False  # QUIT: abandon the current task now
        self._exit_code: int | None = None  # set by the heartbeat side for the main loop
        self._lost = threading.Event()
        self._running: Lease | None = None  # the lease whose handler runs now
        self._in_handler = False
        self._interrupt: type[BaseException] | None = None
        self._lease_start = 0.0
        self._readonly_since: float | None = None  # claims failing on a read-only database
        self._max_tasks = config.max_tasks
        self._open_store = open_store  # for the heartbeat thread (and its timeout release)
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
        self._claim_request = ClaimRequest(owner, config.lease_ttl, config.max_attempts)

    # -- signals (handlers only record; the C-level wakeup fd wakes the loop) -------------------
    def on_stop_signal(self, signum: int, _frame: object = None) -> None:
        self.stop_signal = signum

    def on_quit_signal(self, _signum: int, _frame: object = None) -> None:
        self.quit = True
        if self._in_handler:
            raise _Abort()

    def on_interrupt_signal(self, _signum: int, _frame: object = None) -> None:
        # Raise only inside the handler, never in the worker's own bookkeeping.
        if self._in_handler and self._interrupt is not None:
            exc, self._interrupt = self._interrupt, None
            raise exc()

    def _absorb(self, signals: set[int]) -> None:
        """Signals seen on the wakeup fd: a belt to the Python handlers' braces, since a handler
        that raises (the interrupt) can delay another signal's Python-level handler."""
        if signal.SIGTERM in signals or signal.SIGINT in signals:
            self.stop_signal = self.stop_signal or signal.SIGTERM
        if signal.SIGQUIT in signals:
            self.quit = True

    # -- heartbeat callbacks (heartbeat thread) -------------------------------------------------
    def _on_lost(self, lease: Lease, why: str) -> None:
        log.warning("task %s attempt %s: lease lost (%s)", lease.task_id, lease.attempt, why)
        if lease is not self._running:
            return  # a late word about a task already behind us: never interrupt the next
        self._lost.set()
        self._interrupt_main(LeaseLost)

    def _on_timeout(self, lease: Lease) -> None:
        log.error(
            "task %s attempt %s outlived task_timeout (%gs): releasing it and exiting",
            lease.task_id, lease.attempt, self.config.task_timeout,
        )  # fmt: skip
        error = f"TaskTimeout: handler ran longer than {self.config.task_timeout:g} s"
        try:  # fenced: a no-op if the main thread committed first
            store = self._open_store()  # this thread's own connection, never the main one
            try:
                store.release(lease, self._backoff(lease.tries), error=error)
            finally:
                store.close()
        except StoreError as exc:
            log.error("could not record the timeout: %s", exc)
        finally:
            # A hung Python call cannot be cancelled safely: the process goes, its parent
            # replaces it. Nothing half-written survives: every write is one transaction.
            os._exit(exitcodes.TASK_TIMEOUT)

    def _on_stuck(self, lease: Lease) -> None:
        log.error(
            "task %s attempt %s: the handler ignored LeaseLost for a whole ttl; exiting",
            lease.task_id, lease.attempt,
        )  # fmt: skip
        os._exit(exitcodes.LEASE_STUCK)

    def _on_heartbeat_death(self, exc: BaseException) -> None:
        self._exit_code = exitcodes.HEARTBEAT_DIED
        self._lost.set()
        self._interrupt_main(LeaseLost)

    def _interrupt_main(self, exc: type[BaseException]) -> None:
        self._interrupt = exc
        self.waker.wake()
        main = threading.main_thread().ident
        # Only when our handler is installed (run_worker does it): SIGUSR1's default action
        # would kill a process that embeds a Worker without it.
        if (
            main is not None
            and threading.current_thread() is not threading.main_thread()
            and signal.getsignal(INTERRUPT) == self.on_interrupt_signal
        ):
            signal.pthread_kill(main, INTERRUPT)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        self.heartbeat.start()
        lease: Lease | None = None
        try:
            while True:
                self._absorb(self.waker.drain())
                code = self._health()
                if code is not None:
                    return code
                if self.stop_signal is not None or self.quit:
                    return exitcodes.OK
                if lease is None:
                    lease = self._claim()
                    if lease is None:
                        self._idle()
                        continue
                current, lease = lease, None  # from here on its commit owns it, not `finally`
                commit = self._execute(current)
                self.tasks_done += 1
                if self.quit:
                    self._safe_commit(commit, None)
                    return exitcodes.OK
                recycle = self._max_tasks is not None and self.tasks_done >= self._max_tasks
                want_next = self.stop_signal is None and not recycle and self._exit_code is None
                lease = self._commit(current, commit, want_next)
                if recycle:
                    return exitcodes.RECYCLE
        finally:
            if lease is not None:  # claimed in a fused commit, never started: hand it back
                self._safe_commit(Commit(lease, "release"), None)
            self._publish(STOPPING)
            self.heartbeat.close()

    def _health(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        if not self.heartbeat.is_alive():
            return exitcodes.HEARTBEAT_DIED
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            log.error("parent %s is gone: exiting", self.parent_pid)
            return exitcodes.PARENT_DIED
        return None

    def _count(self, lease: Lease | None) -> None:
        if lease is not None:
            self.counters.claims += 1
            self.counters.takeovers += lease.takeover

    def _publish_counters(self) -> None:
        if self.slot is not None:
            self.slot.publish_counters(self.pid, self.counters)

    def _publish(self, phase: int, lease: Lease | None = None) -> None:
        if self.slot is not None:
            self.slot.publish(self.pid, phase, lease.task_id if lease else 0,
                              lease.attempt if lease else 0)  # fmt: skip

    def _claim(self) -> Lease | None:
        self._publish(CLAIMING)
        started = time.monotonic()
        try:
            lease = self.store.claim(
                self.owner, self.config.lease_ttl, max_attempts=self.config.max_attempts
            )
        except StoreCorrupt:
            raise
        except StoreReadOnly as exc:
            since = self._readonly_since = self._readonly_since or started
            if started - since >= READONLY_EXIT:
                log.error("the database stayed read-only for %.0fs: exiting so that a new "
                          "process reopens it", started - since)  # fmt: skip
                raise
            log.warning("claim failed, will retry: %s", exc)
            lease = None
        except StoreError as exc:
            log.warning("claim failed, will retry: %s", exc)
            lease = None
        else:
            self._readonly_since = None
        self._lease_start = started
        self._publish(IDLE)
        self._count(lease)
        return lease

    def _idle(self) -> None:
        """Sleep until work may be claimable: a change by another connection, the next delayed
        task or expiring lease, or the poll interval (R7) — whichever comes first.

        A claim just answered "nothing", so a due time already past (a claim that failed, or a
        race with another worker) never cuts the wait short: that would spin on the write lock.
        """
        interval = self.config.poll_interval * random.uniform(0.9, 1.1)  # jitter: no herd
        deadline = time.monotonic() + interval
        try:
            token = self.store.change_token()
            due = self.store.next_ready_at()
            if due is not None and (wait := due - self.store.now()) > 0:
                deadline = min(deadline, time.monotonic() + wait)
        except StoreCorrupt:
            raise
        except StoreError as exc:
            log.warning("idle check failed: %s", exc)
            token = -1
        while self.stop_signal is None and not self.quit and self._exit_code is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._absorb(self.waker.wait(min(CHANGE_CHECK, remaining)))
            try:
                current = self.store.change_token()
                if current != token:
                    token = current
                    due = self.store.next_ready_at()
                    if due is not None and due <= self.store.now():
                        return
            except StoreCorrupt:
                raise  # never waited out: the worker exits STORE_CORRUPT
            except StoreError:
                continue  # the database is busy or gone: wait out the interval, then claim

    def _execute(self, lease: Lease) -> Commit | None:
        """Run one task; return what to write under its lease, or None to discard."""
        handler = self.app.handlers.get(lease.task)
        if handler is None:
            error = f"UnknownTask: no handler named {lease.task!r} in this app"
            return Commit(lease, "fail", reason="unknown_task", error=error)
        self._lost.clear()
        if time.monotonic() - self._lease_start > FRESH_CLAIM:  # R4: the start renewal
            started = time.monotonic()
            try:
                if self.store.renew_until(lease, self.config.lease_ttl) is None:
                    return None  # lost while it waited: someone else has it now
                self._lease_start = started
            except StoreError as exc:  # busy: the heartbeat keeps trying; the commit decides
                log.warning("start renewal failed: %s", exc)
        ctx = TaskContext(lease, self._lost)
        self.heartbeat.track(lease, self._lease_start)
        self._publish(HANDLER, lease)
        started = time.monotonic()
        self._running = lease
        try:
            value = self._call(handler, ctx)
        except LeaseLost:
            return None
        except _Abort:
            return Commit(lease, "release", error="WorkerStopped: QUIT while the task ran")
        except (Exception, SystemExit) as exc:
            return self._failure(lease, exc)
        finally:
            self.heartbeat.untrack()
            self._running = None
            self.counters.task_done(time.monotonic() - started)
            self._publish(COMMITTING, lease)
        if ctx.commit is not None:
            return ctx.commit
        try:
            dumps(value, "the handler's return value")
        except InvalidPayload as exc:
            return self._failure(lease, exc)
        return Commit(lease, "finish", expected_revision=lease.revision, new_state=lease.state,
                      result=value)  # fmt: skip

    def _call(self, handler: Handler, ctx: TaskContext) -> object:
        self._interrupt = None
        self._in_handler = True
        try:
            return handler(ctx)
        finally:
            self._in_handler = False

    def _backoff(self, tries: int) -> float:
        base: float = self.config.retry_backoff * 2.0 ** max(0, tries - 1)
        return min(self.config.retry_backoff_max, base) * random.uniform(0.75, 1.25)

    def _failure(self, lease: Lease, exc: BaseException) -> Commit:
        error = describe_error(exc)
        log.warning("task %s (%s) attempt %s failed: %s: %s",
                    lease.task_id, lease.task, lease.attempt, type(exc).__name__, exc)  # fmt: skip
        if lease.tries >= self.config.max_attempts:
            return Commit(lease, "fail", reason="task_attempts_exhausted", error=error)
        return Commit(lease, "release", delay=self._backoff(lease.tries), error=error)

    def _commit(self, lease: Lease, commit: Commit | None, want_next: bool) -> Lease | None:
        request = self._claim_request if want_next else None
        started = time.monotonic()
        outcome = self._safe_commit(commit, request)
        self._lease_start = started
        if outcome is None or outcome[1] is None:
            self._publish(IDLE)
        if outcome is None:
            self._publish_counters()
            return None
        result, next_lease = outcome
        self._count(next_lease)
        self._publish_counters()
        if result is CasResult.LEASE_LOST:
            log.warning("task %s attempt %s: commit refused, lease lost; result discarded",
                        lease.task_id, lease.attempt)  # fmt: skip
        elif result is CasResult.CONFLICT and commit is not None:
            self._resolve_conflict(commit)
        return next_lease

    def _safe_commit(
        self, commit: Commit | None, request: ClaimRequest | None
    ) -> tuple[CasResult, Lease | None] | None:
        """Write ``commit`` (and claim next), retrying while the database is busy. A commit that
        never lands is safe: the lease lapses and another worker takes the task over."""
        deadline = time.monotonic() + self.config.lease_ttl
        while True:
            try:
                if commit is None:
                    if request is None:
                        return None
                    nxt = self.store.claim(request.owner, request.ttl,
                                           max_attempts=request.max_attempts)  # fmt: skip
                    return CasResult.OK, nxt
                out = self.store.commit(commit, claim=request)
                return out.result, out.next_lease
            except StoreCorrupt:
                raise
            except StoreError as exc:
                if time.monotonic() >= deadline:
                    log.error("giving up on a commit: %s", exc)
                    return None
                log.warning("commit failed, retrying: %s", exc)
                time.sleep(0.1)

    def _resolve_conflict(self, commit: Commit) -> None:
        """Someone else moved the run (an operator cancelled it, say): drop the task if the run
        is over, else give it back for another attempt."""
        try:
            run = self.store.get_run(commit.lease.run_id)
        except StoreError as exc:  # the lease lapses and the task is retried: no harm
            log.warning("cannot read run %s to settle a conflict: %s", commit.lease.run_id, exc)
            return
        terminal = run is None or run.terminal
        log.info("run %s moved under task %s: %s", commit.lease.run_id, commit.lease.task_id,
                 "dropping it" if terminal else "releasing it")  # fmt: skip
        self._safe_commit(Commit(commit.lease, "drop" if terminal else "release"), None)
