"""Plain handlers on a pool of threads, with several slots.

A thread cannot be stopped from outside: a lost lease sets the execution's ``lost`` flag, so
its next ``ctx`` call raises ``LeaseLost``, and whatever it returns is discarded. A thread whose
handler ended posts the ending (``TaskFinished``: its slot is free once ``post`` returns), then
asks what it runs next (``follow``): the next prefetched task, started at once without a turn of
the conductor (``Starter.next_for_thread``), or None.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from ..config import WorkerConfig
from ..events import Post, TaskFinished
from ..execution import Execution, Mode, message, run_handler
from ..logs import event
from ..signals import main_thread_only
from . import Executor

log = logging.getLogger("workerproc.worker")


# A slot thread's handler ended and was posted: what this thread runs next (None: wait)
Follow = Callable[[], Execution | None]


class ThreadExecutor(Executor):
    """Plain handlers on up to ``size`` threads (started in the worker, never before fork)."""

    mode = Mode.THREAD
    thread_name = "slot"

    def __init__(
        self, size: int, config: WorkerConfig, post: Post, follow: Follow | None = None
    ) -> None:
        self._size = size
        self._config = config
        self._post = post  # each ending, as ``TaskFinished``
        self._follow = follow
        self._queue: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.died: BaseException | None = None

    def submit(self, ex: Execution) -> None:
        if not self._threads:  # the first plain task: start the pool
            for i in range(self._size):
                t = threading.Thread(target=self._main, name=f"{self.thread_name}-{i}",
                                     daemon=True)  # fmt: skip
                t.start()
                self._threads.append(t)
        self._queue.put(ex)

    def _main(self) -> None:
        main_thread_only()
        ex = self._queue.get()
        while ex is not None:
            if ex.batcher is not None:  # a batch step: its items ride with it (``batcher.py``)
                ex.batcher(ex)
            else:
                run_handler(ex, self._config)
            try:
                # the next prefetched task, started by this thread (no round trip through the
                # conductor), or whatever the conductor submits
                self._post(TaskFinished(ex))
                nxt = self._follow() if self._follow is not None else None
            except BaseException as exc:  # our own bug: the conductor sees this thread gone
                self.died = exc
                event(log, "slot_died", f"slot thread died: {message(exc)}",
                      level=logging.ERROR, task_id=ex.lease.task_id)  # fmt: skip
                return
            ex = nxt or self._queue.get()

    def dead(self) -> BaseException | None:
        """Why a slot thread ended while the pool was open (None: all of them live)."""
        return self.died

    def close(self, timeout: float = 1.0) -> None:
        """Ask idle threads to end; a thread still inside a handler is a daemon and dies with
        the process."""
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


class LaneExecutor(ThreadExecutor):
    """The delivery lane (B20): webhook deliveries on threads of their own, never on a user's
    slot, so a receiver that hangs holds up no user's run. It has no ``follow``: a lane thread
    takes only what the conductor submits to it."""

    mode = Mode.LANE
    thread_name = "delivery"
