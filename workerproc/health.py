"""The conductor's look at its own process, once a turn: whether the worker can go on.

It ends (with its exit code) when the heartbeat thread is gone (``HEARTBEAT_DIED``), when an
executor's threads died (``SLOT_DIED``: its executions are gone, their leases are released at
once with a ``WorkerCrashed`` error so that no task waits a ttl), or when the parent is gone
(``PARENT_DIED``). An async handler that blocks the event loop, and so every async slot, is said
once per incident (``loop_blocked``). The heartbeat's death as it reports it (``HeartbeatDied``)
reaches the conductor as an event; this look is the belt to those braces.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from . import exitcodes
from .config import WorkerConfig
from .execution import Execution, max_attempts, message
from .executors import Executors
from .heartbeat import Heartbeat
from .logs import attempt_of, event

log = logging.getLogger("workerproc.worker")


@dataclass(frozen=True, slots=True)
class Unwell:
    """The worker must exit with ``code``; ``release``: the error its running tasks are
    released with first (None: they are not)."""

    code: int
    release: str | None = None


class Health:
    def __init__(
        self,
        heartbeat: Heartbeat,
        executors: Executors,
        config: WorkerConfig,
        parent_pid: int | None,
    ) -> None:
        self.heartbeat = heartbeat
        self.executors = executors
        self.config = config
        self.parent_pid = parent_pid
        self.pid = os.getpid()
        self._blocking: Execution | None = None  # the handler last reported blocking the loop

    def check(self) -> Unwell | None:
        if not self.heartbeat.is_alive():
            return Unwell(exitcodes.HEARTBEAT_DIED)
        died = self.executors.dead()
        if died is not None:  # its executions are gone: give their leases back, be replaced
            event(log, "slots_died", f"worker {self.pid}: {message(died)}; exiting",
                  level=logging.ERROR, error=type(died).__name__)  # fmt: skip
            why = f"WorkerCrashed: the worker's slots died ({message(died)})"
            return Unwell(exitcodes.SLOT_DIED, release=why)
        self._report_blocked()
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            event(
                log,
                "parent_gone",
                f"parent {self.parent_pid} is gone: exiting",
                level=logging.ERROR,
                parent=self.parent_pid,
            )
            return Unwell(exitcodes.PARENT_DIED)
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
