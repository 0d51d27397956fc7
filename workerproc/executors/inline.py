"""One slot, a plain handler: on the main thread, the conductor's, as a worker always ran them.

It is the one executor that can interrupt a plain handler: a lost lease raises ``LeaseLost`` in
it, a cancelled run ``RunCancelled`` (the heartbeat thread sends ``INTERRUPT`` to the main
thread, whose handler raises only while a handler runs, never in the worker's own bookkeeping),
and QUIT raises ``Abort`` in it (the signal handler does). While the handler runs, the
conductor cannot act: ``before`` and ``after`` let the worker hand what needs doing meanwhile to
its heartbeat thread.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from ..app import LeaseLost, RunCancelled
from ..config import WorkerConfig
from ..events import Post, TaskFinished
from ..execution import Execution, Mode, Stopped, conclude
from ..signals import INTERRUPT, Signals, Waker
from ..versions import upgrade
from . import Executor


class InlineExecutor(Executor):
    mode = Mode.INLINE
    on_conductor = True

    def __init__(
        self,
        config: WorkerConfig,
        signals: Signals,
        waker: Waker,
        post: Post,
        *,
        before: Callable[[], None],
        after: Callable[[], None],
    ) -> None:
        self._config = config
        self._signals = signals
        self._waker = waker
        self._post = post  # each ending, as ``TaskFinished``
        self._before = before  # the handler takes over the conductor's thread ...
        self._after = after  # ... and gave it back

    def submit(self, ex: Execution) -> None:
        self._before()
        signals = self._signals
        value: object = None
        raised: BaseException | None = None
        signals.interrupt = None
        try:
            signals.in_handler = True
            if ex.may_begin():
                with ex.running():  # its log records carry its task, its span is current
                    upgrade(ex)  # B25: an older run's state migrated first, under the fence
                    value = ex.handler(ex.ctx)
                    ex.ctx._stream_done()  # what it emitted is written before its commit
        except BaseException as exc:  # a handler's error, whatever its kind
            signals.in_handler = False
            raised = exc
        finally:
            signals.in_handler = False
        self._after()
        ex.seconds = time.monotonic() - ex.started
        ex.commit = conclude(ex, value, raised, self._config)
        ex.ctx._stream_closed()
        self._post(TaskFinished(ex))

    def interrupt(self, ex: Execution, why: Stopped) -> bool:
        """A lost lease raises ``LeaseLost`` in the handler, a cancelled run ``RunCancelled``
        (B15). Nothing else stops a running Python call safely (QUIT's ``Abort`` comes from its
        own signal)."""
        if why is Stopped.LOST:
            self._interrupt_main(LeaseLost)
        elif why is Stopped.CANCELLED:
            self._interrupt_main(RunCancelled)
        else:
            return False
        return True

    def _interrupt_main(self, exc: type[BaseException]) -> None:
        signals = self._signals
        signals.interrupt = exc
        self._waker.wake()
        main = threading.main_thread().ident
        # Only when our handler is installed (run_worker does it): SIGUSR1's default action
        # would kill a process that embeds a Worker without it.
        if (
            main is not None
            and threading.current_thread() is not threading.main_thread()
            and signal.getsignal(INTERRUPT) == signals.on_interrupt
        ):
            signal.pthread_kill(main, INTERRUPT)
