"""``async def`` handlers on one event loop, on its own thread (started in the worker, never before
fork, and only when the first async task arrives: asyncio and the ssl it imports cost a worker
~9 MB).

One loop serves every async slot, so one handler can hurt the others in two ways; both are
contained here:

- **Something escapes the loop.** ``SystemExit`` or ``KeyboardInterrupt`` raised in a task the
  handler spawned (a child of ``asyncio.gather``, say) propagates out of ``run_forever``, which
  would end the loop thread silently and wedge every slot. The loop is run again at once (its
  callbacks are intact); the handler that awaited the child gets the exception and fails its
  own task like any other error. Only if the thread itself ends does ``dead`` say so, and the
  worker exits ``SLOT_DIED`` to be replaced.
- **A handler blocks the loop** (``time.sleep``, CPU-bound work, a blocking SDK). A tick every
  ``TICK`` seconds shows the loop's lag; ``blocked`` names the execution the loop is stuck in,
  so the worker can report it and judge it alone (``alarms``): its neighbours' timeouts do not
  run while they cannot, and if the blocker outlives ``--task-timeout`` it is released and its
  innocent neighbours are handed back without spending an attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ..config import WorkerConfig
from ..events import Post, TaskFinished
from ..execution import Execution, Mode, Stopped, conclude, message
from ..logs import event
from ..signals import main_thread_only
from ..versions import upgrade_async
from . import BLOCKED_AFTER, Executor

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("workerproc.worker")

TICK = 0.05  # the loop marks that it runs this often; one that did not for BLOCKED_AFTER is
# blocked by a handler


def _cancel(ex: Execution) -> None:  # on the loop thread
    if ex.task is not None and not ex.task.done():
        ex.task.cancel()


class AsyncExecutor(Executor):
    """``async def`` handlers on one event loop, on its own thread."""

    mode = Mode.ASYNC

    def __init__(self, config: WorkerConfig, post: Post) -> None:
        self._config = config
        self._post = post  # each ending, as ``TaskFinished``
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._ticked = 0.0  # monotonic: the loop's last tick
        self._by_task: dict[object, Execution] = {}  # a running handler's task -> execution
        self.died: BaseException | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio  # noqa: PLC0415 - the first async handler pays for it, not every worker

            loop = asyncio.new_event_loop()
            self._ticked = time.monotonic()
            loop.call_soon(self._tick, loop)
            self._thread = threading.Thread(target=self._main, args=(loop,),
                                            name="slots-async", daemon=True)  # fmt: skip
            self._thread.start()
            self._loop = loop
        return self._loop

    def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        main_thread_only()
        try:
            while not self._closing:
                try:
                    loop.run_forever()
                except BaseException as exc:  # escaped a task of a handler: run the loop on
                    event(log, "loop_escape",
                          f"{message(exc)} escaped a task on the event loop; the loop goes on",
                          level=logging.ERROR, error=type(exc).__name__)  # fmt: skip
                    continue
                break  # stopped: close() asked for it
        except BaseException as exc:  # pragma: no cover - logging itself failed
            self.died = exc

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._ticked = time.monotonic()
        loop.call_later(TICK, self._tick, loop)

    def dead(self) -> BaseException | None:
        """Why the loop thread ended while the slots were open (None: it runs, or never
        started)."""
        if self._thread is None or self._closing or self._thread.is_alive():
            return None
        return self.died or RuntimeError("the event loop thread ended")

    def blocked(self, after: float = BLOCKED_AFTER) -> tuple[float, Execution | None] | None:
        """(seconds, the execution it is stuck in) when the loop has not ticked for ``after``
        seconds; None when it runs freely (or has not started)."""
        loop = self._loop
        if loop is None:
            return None
        lag = time.monotonic() - self._ticked
        if lag < after:
            return None
        import asyncio  # noqa: PLC0415 - the loop exists: imported already

        current = asyncio.current_task(loop)  # a dict lookup; safe from another thread
        return lag, self._by_task.get(current)

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the loop (started if it was not) from another thread, and wait
        for its result: a worker lifecycle hook of ``async def`` (``hooks``)."""
        loop = self._start()
        import asyncio  # noqa: PLC0415 - imported by _start, so this is a lookup

        async def wrapped() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), loop).result()

    def submit(self, ex: Execution) -> None:
        loop = self._start()
        import asyncio  # noqa: PLC0415 - imported by _start, so this is a lookup

        asyncio.run_coroutine_threadsafe(self._run(ex), loop)

    async def _run(self, ex: Execution) -> None:
        import asyncio  # noqa: PLC0415 - on the loop: imported already

        value: object = None
        raised: BaseException | None = None
        ex.task = task = asyncio.current_task()
        self._by_task[task] = ex
        ex.started = time.monotonic()
        try:
            if ex.may_begin():  # not cancelled before it began, and its lease still fresh
                with ex.running():  # its log records carry its task, its span is current
                    await upgrade_async(ex)  # B25: an older run's state migrated first
                    value = await ex.handler(ex.ctx)
                    await ex.ctx.flush_async()  # what it emitted is written before its commit
        except asyncio.CancelledError:
            if ex.stopped is None:  # the handler cancelled itself: an error like any other
                raised = RuntimeError("the handler was cancelled")
        except BaseException as exc:  # a handler's error, whatever its kind
            raised = exc
        finally:
            self._by_task.pop(task, None)
        ex.seconds = time.monotonic() - ex.started
        ex.commit = conclude(ex, value, raised, self._config)
        ex.ctx._stream_closed()
        self._post(TaskFinished(ex))

    def interrupt(self, ex: Execution, why: Stopped) -> bool:
        """Stop ``ex`` for ``why`` (from any thread): its coroutine is cancelled on the loop,
        or never starts (unless it holds the loop: see ``blocked``)."""
        if ex.stopped is None:
            ex.stopped = why
        if self._loop is not None:
            self._loop.call_soon_threadsafe(_cancel, ex)
        return True

    def close(self, timeout: float = 1.0) -> None:
        loop, thread = self._loop, self._thread
        self._closing = True
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
