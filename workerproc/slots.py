"""Where handlers run, and what their ending means for the task.

A worker runs up to ``--concurrency`` executions at once (its slots):

- **inline**: with one slot, a plain ``def`` handler runs on the main thread, as it always did:
  a lost lease interrupts it (``LeaseLost``), QUIT abandons it (``Abort``).
- **thread**: with several slots, plain handlers run on a pool of threads. A thread cannot be
  stopped from outside: a lost lease sets ``ctx.lease_lost`` and its next ``ctx`` call raises
  ``LeaseLost``; its result is discarded either way.
- **async**: ``async def`` handlers run on one event loop thread; a lost lease, a timeout or
  QUIT cancels the coroutine.

Every ending becomes the commit the conductor writes under the lease (``conclude``), or None
when there is nothing to write (the lease is gone).
"""

from __future__ import annotations

import enum
import inspect
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .app import Handler, LeaseLost, TaskContext
from .backoff import backoff
from .config import WorkerConfig
from .logs import event
from .signals import Abort, main_thread_only
from .store import Commit, InvalidPayload, Lease
from .store.codec import dumps

if TYPE_CHECKING:  # asyncio (and the ssl it imports) costs a worker ~9 MB: only when used
    import asyncio

log = logging.getLogger("workerproc.worker")


class Mode(enum.StrEnum):
    INLINE = "inline"
    THREAD = "thread"
    ASYNC = "async"


class Stopped(enum.StrEnum):
    """Why an execution was told to stop before its handler returned."""

    LOST = "lost"  # the lease was taken over: discard
    TIMEOUT = "timeout"  # --task-timeout: release with TaskTimeout
    QUIT = "quit"  # QUIT: release with WorkerStopped
    ABANDONED = "abandoned"  # timed out on a thread: released already, its ending is ignored


@dataclass
class Execution:
    """One handler running for one lease."""

    lease: Lease
    handler: Handler
    mode: Mode
    ctx: TaskContext = field(init=False)
    lost: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    stopped: Stopped | None = None  # set before a cancel; the ending reads it
    commit: Commit | None = None  # the last word, once the handler ended
    seconds: float = 0.0  # time in the handler
    task: asyncio.Task[None] | None = None  # async: the coroutine's task, on the loop thread

    def __post_init__(self) -> None:
        self.ctx = TaskContext(self.lease, self.lost)


def mode_for(handler: Handler, capacity: int) -> Mode:
    if inspect.iscoroutinefunction(handler):
        return Mode.ASYNC
    return Mode.INLINE if capacity == 1 else Mode.THREAD


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    tb = "".join(traceback.format_exception(exc, limit=-5))
    return f"{type(exc).__name__}: {exc}\n{tb}"[:limit]


def failure(lease: Lease, exc: BaseException, config: WorkerConfig) -> Commit:
    """A handler raised: release with backoff, or fail the run on its last attempt."""
    error = describe_error(exc)
    event(log, "task_failed",
          f"task {lease.task_id} ({lease.task}) attempt {lease.attempt} failed: "
          f"{type(exc).__name__}: {exc}", level=logging.WARNING, task_id=lease.task_id,
          run_id=lease.run_id, task=lease.task, attempt=lease.attempt,
          error=type(exc).__name__)  # fmt: skip
    if lease.tries >= config.max_attempts:
        return Commit(lease, "fail", reason="task_attempts_exhausted", error=error)
    delay = backoff(lease.tries, config.retry_backoff, config.retry_backoff_max)
    return Commit(lease, "release", delay=delay, error=error)


def conclude(
    ex: Execution, value: object, raised: BaseException | None, config: WorkerConfig
) -> Commit | None:
    """What to write under ``ex``'s lease now that its handler ended."""
    lease = ex.lease
    if ex.stopped is Stopped.ABANDONED:
        return None
    if ex.stopped is Stopped.TIMEOUT:
        error = f"TaskTimeout: handler ran longer than {config.task_timeout:g} s"
        return Commit(lease, "release", delay=0.0, error=error)
    if ex.stopped is Stopped.QUIT or isinstance(raised, Abort):
        return Commit(lease, "release", error="WorkerStopped: QUIT while the task ran")
    if ex.stopped is Stopped.LOST or ex.lost.is_set() or isinstance(raised, LeaseLost):
        return None  # someone else owns the task: whatever this execution made is discarded
    if raised is not None:  # any other exception, KeyboardInterrupt and SystemExit included
        return failure(lease, raised, config)
    if ex.ctx.commit is not None:
        return ex.ctx.commit
    try:
        dumps(value, "the handler's return value")
    except InvalidPayload as exc:
        return failure(lease, exc, config)
    return Commit(lease, "finish", expected_revision=lease.revision, new_state=lease.state,
                  result=value)  # fmt: skip


Done = Callable[[Execution], None]
# A slot thread's handler ended: record it, and say what this thread runs next (None: wait)
Next = Callable[[Execution], "Execution | None"]


def _cancel(ex: Execution) -> None:  # on the loop thread
    if ex.task is not None and not ex.task.done():
        ex.task.cancel()


class ThreadSlots:
    """Plain handlers on up to ``size`` threads (started in the worker, never before fork)."""

    def __init__(self, size: int, config: WorkerConfig, done: Next) -> None:
        self._size = size
        self._config = config
        self._done = done
        self._queue: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, ex: Execution) -> None:
        if not self._threads:  # the first plain task: start the pool
            for i in range(self._size):
                t = threading.Thread(target=self._main, name=f"slot-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        self._queue.put(ex)

    def _main(self) -> None:
        main_thread_only()
        ex = self._queue.get()
        while ex is not None:
            value: object = None
            raised: BaseException | None = None
            ex.started = time.monotonic()
            try:
                value = ex.handler(ex.ctx)
            except BaseException as exc:  # a handler's error, whatever its kind
                raised = exc
            ex.seconds = time.monotonic() - ex.started
            ex.commit = conclude(ex, value, raised, self._config)
            # the next prefetched task, started by this thread (no round trip through the
            # conductor), or whatever the conductor submits
            ex = self._done(ex) or self._queue.get()

    def close(self, timeout: float = 1.0) -> None:
        """Ask idle threads to end; a thread still inside a handler is a daemon and dies with
        the process."""
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


class AsyncSlots:
    """``async def`` handlers on one event loop, on its own thread (started in the worker)."""

    def __init__(self, config: WorkerConfig, done: Done) -> None:
        self._config = config
        self._done = done
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio  # noqa: PLC0415 - the first async handler pays for it, not every worker

            loop = asyncio.new_event_loop()

            def run() -> None:
                main_thread_only()
                loop.run_forever()

            self._thread = threading.Thread(target=run, name="slots-async", daemon=True)
            self._thread.start()
            self._loop = loop
        return self._loop

    def submit(self, ex: Execution) -> None:
        loop = self._start()
        import asyncio  # noqa: PLC0415 - imported by _start, so this is a lookup

        asyncio.run_coroutine_threadsafe(self._run(ex), loop)

    async def _run(self, ex: Execution) -> None:
        import asyncio  # noqa: PLC0415 - on the loop: imported already

        value: object = None
        raised: BaseException | None = None
        ex.task = asyncio.current_task()
        ex.started = time.monotonic()
        try:
            if ex.stopped is None:  # cancelled before it began: do not begin
                value = await ex.handler(ex.ctx)
        except asyncio.CancelledError:
            if ex.stopped is None:  # the handler cancelled itself: an error like any other
                raised = RuntimeError("the handler was cancelled")
        except BaseException as exc:  # a handler's error, whatever its kind
            raised = exc
        ex.seconds = time.monotonic() - ex.started
        ex.commit = conclude(ex, value, raised, self._config)
        self._done(ex)

    def cancel(self, ex: Execution, why: Stopped) -> None:
        """Stop ``ex`` for ``why`` (from any thread): its coroutine is cancelled on the loop,
        or never starts."""
        if ex.stopped is None:
            ex.stopped = why
        if self._loop is not None:
            self._loop.call_soon_threadsafe(_cancel, ex)

    def close(self, timeout: float = 1.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
