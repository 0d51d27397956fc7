"""One handler running for one lease (``Execution``), and what its ending means for the task.

A worker runs up to ``--concurrency`` executions at once (its slots), each on the executor of its
handler's ``Mode`` (``workerproc/executors``): inline on the main thread, on a slot thread, or on
the event loop; and, beside them, up to ``LANE`` webhook deliveries on threads of their own
(``Mode.LANE``: the delivery lane, which no user's slot ever waits for). Every ending becomes
the commit the conductor writes under the lease (``conclude``), or None when there is nothing
to write (the lease is gone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import logging
import math
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import tracing
from .app import Handler, LeaseLost, Task, TaskContext
from .batching import ItemContext
from .config import WorkerConfig
from .context import Flag, Settable, last_word
from .limits import RetryAfter
from .logs import attempt_of, event, running
from .once import CallBook, CallParked
from .signals import Abort
from .store import Commit, InvalidCommit, Lease
from .store.backoff import backoff
from .store.calls import parked_on
from .store.codec import WAIT_FOREVER, dumps
from .streaming import Streamer
from .versions import upgrade

if TYPE_CHECKING:  # asyncio (and the ssl it imports) costs a worker ~9 MB: only when used
    import asyncio

log = logging.getLogger("workerproc.worker")

CANCELLED_ERROR = "RunCancelled: the run was cancelled while this task ran"


class Mode(enum.StrEnum):
    """Where a handler runs: each mode has its executor (``workerproc/executors``)."""

    INLINE = "inline"
    THREAD = "thread"
    ASYNC = "async"
    LANE = "lane"  # the worker's own deliveries (B20), on threads of their own: no user's slot


class Stopped(enum.StrEnum):
    """Why an execution was told to stop before its handler returned."""

    LOST = "lost"  # the lease was taken over: discard
    TIMEOUT = "timeout"  # --task-timeout: release with TaskTimeout
    QUIT = "quit"  # QUIT: release with WorkerStopped
    ABANDONED = "abandoned"  # timed out on a thread: released already, its ending is ignored
    LATE = "late"  # its lease was not confirmed recently enough to begin: hand it back unstarted
    CANCELLED = "cancelled"  # its run was cancelled (B15): end the lease, write nothing of the run


@dataclass
class Execution:
    """One handler running for one lease."""

    lease: Lease
    handler: Handler
    mode: Mode
    ctx: TaskContext = field(init=False)
    lost: Settable = field(default_factory=Flag)
    cancelled: Settable = field(default_factory=Flag)  # the run was (B15)
    started: float = field(default_factory=time.monotonic)
    begin_by: float = math.inf  # monotonic: past this the handler must not begin (startrule)
    stopped: Stopped | None = None  # set before a cancel; the ending reads it
    began: bool = False  # the handler was called (its last check passed)
    commit: Commit | None = None  # the last word, once the handler ended
    seconds: float = 0.0  # time in the handler
    task: asyncio.Task[None] | None = None  # async: the coroutine's task, on the loop thread
    tasks: Mapping[str, Task[Any]] = field(default_factory=dict)  # the app's, for ``advance``
    calls: CallBook | None = None  # the worker's paid calls, for ``once``
    streams: Streamer | None = None  # the worker's stream writer, for ``emit``
    span: Any = None  # its span, when traced (``tracing``): ended once its commit is written
    # a batch step's item (``batcher.py``): ``ctx`` is an ``ItemContext``; ``batcher`` runs the
    # batch this execution leads (on its slot thread), ``rider`` rides in another's (no slot of
    # its own), ``batch`` the items of the batch it led, once it ran
    item: bool = False
    batcher: Callable[[Execution], None] | None = None
    rider: bool = False
    batch: int = 0

    def __post_init__(self) -> None:
        kind = ItemContext if self.item else TaskContext
        self.ctx = kind(self.lease, self.lost, self.tasks, self.cancelled, self.calls,
                        self.streams)  # fmt: skip
        self.span = tracing.begin(self.lease)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around its handler's call: the records logged inside carry its task, and its span
        is the current one (the handler's own spans are its children)."""
        with running(self.lease), tracing.current(self.span):
            yield

    def gate(self, confirmed: float, begin_by: float, latest: Callable[[], float | None]) -> None:
        """The start was judged on the lease's confirmation at ``confirmed``: after
        ``begin_by`` the handler must not begin (``startrule``). Checked on the thread about to
        call it (``may_begin``) and at its first read of its task, unless ``latest`` (the
        lease's newest confirmation) shows a renewal since."""
        self.begin_by = self.ctx.begin_by = begin_by
        self.ctx.confirmed, self.ctx.latest = confirmed, latest

    def may_begin(self) -> bool:
        """R4's last check, on the thread about to call the handler (``startrule``): False
        when the lease waited too long since its last confirmation (a pause since dispatch,
        say); the execution is then marked LATE and its lease goes back unstarted."""
        if self.stopped is None and time.monotonic() > self.begin_by:
            self.stopped = Stopped.LATE
        self.began = self.stopped is None and not self.cancelled.is_set()  # never when cancelled
        return self.began

    @property
    def late(self) -> bool:
        """It never began in earnest: refused at the last check, or at its first read."""
        return self.stopped is Stopped.LATE or self.ctx.late


def mode_for(handler: Handler, capacity: int) -> Mode:
    if inspect.iscoroutinefunction(handler):
        return Mode.ASYNC
    return Mode.INLINE if capacity == 1 else Mode.THREAD


def message(exc: BaseException) -> str:
    """``TypeName: message`` of an exception, even one whose ``__str__`` raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__}: <its message cannot be shown>"


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    try:
        tb = "".join(traceback.format_exception(exc, limit=-5))
    except Exception:  # a traceback that cannot even be formatted: the message is enough
        tb = ""
    return f"{message(exc)}\n{tb}"[:limit]


def max_attempts(lease: Lease, config: WorkerConfig) -> int:
    """The task's own bound when it declares one (B11), else the pool's."""
    return lease.options.max_attempts or config.max_attempts


def task_timeout(lease: Lease, config: WorkerConfig) -> float | None:
    """The task's own hard limit when it declares one (B11), else the pool's."""
    return lease.options.timeout or config.task_timeout


def failure(
    lease: Lease, exc: BaseException, config: WorkerConfig, *, final: bool = False
) -> Commit:
    """A handler raised: release with backoff, or fail the run on its last attempt (the
    task's declared ``max_attempts`` and ``retry_backoff`` where it has them). A value of the
    handler's own commit that cannot be stored (``InvalidCommit``: not JSON, over the limits;
    or ``final``: the store refused to write the commit) fails the run at once: every retry
    would write the same value. Any other ``InvalidPayload`` (a paid answer too long to keep,
    say) is retried like any error. The log says the try within the task's budget (``tries``:
    since the run's last retry, hand-backs not counted), not the fencing token."""
    error = describe_error(exc)
    limit = max_attempts(lease, config)
    final = final or isinstance(exc, InvalidCommit)
    event(log, "task_failed",
          f"task {lease.task_id} ({lease.task}) {attempt_of(lease, limit)} failed: "
          f"{message(exc)}{': no retry can fix it' if final else ''}",
          level=logging.WARNING, task_id=lease.task_id, run_id=lease.run_id, task=lease.task,
          attempt=lease.attempt, tries=lease.tries, error=type(exc).__name__)  # fmt: skip
    if final:
        return Commit(lease, "fail", reason="invalid_payload", error=error)
    if lease.tries >= limit:
        return Commit(lease, "fail", reason="task_attempts_exhausted", error=error)
    first = lease.options.retry_backoff
    if first is None:
        first = config.retry_backoff
    delay = backoff(lease.tries, first, max(first, config.retry_backoff_max))
    return Commit(lease, "release", delay=delay, error=error)


def conclude(
    ex: Execution, value: object, raised: BaseException | None, config: WorkerConfig
) -> Commit | None:
    """What to write under ``ex``'s lease now that its handler ended. Never raises: whatever
    the handler left behind (a value that cannot be encoded, an object whose methods raise)
    fails its own task, and only its own."""
    try:
        commit = _conclude(ex, value, raised, config)
    except BaseException as exc:  # a handler's leftovers, whatever their kind
        commit = failure(ex.lease, exc, config)
    if commit is not None and ex.ctx.reported is not None:  # kept with it, for ``spend``
        commit = dataclasses.replace(commit, usage=ex.ctx.reported)
    if ex.stopped is not Stopped.ABANDONED:  # an abandoned one's span ended with its release
        tracing.concluded(ex.lease, ex.span, raised, commit)
    return commit


def _conclude(
    ex: Execution, value: object, raised: BaseException | None, config: WorkerConfig
) -> Commit | None:
    lease = ex.lease
    if ex.stopped is Stopped.ABANDONED:
        return None
    if ex.cancelled.is_set() or ex.stopped is Stopped.CANCELLED:  # B15: the cancel ended the run
        if ex.stopped is Stopped.LOST or ex.lost.is_set():
            return None  # someone else holds the task: not ours to end
        if not ex.began or ex.late:  # never began: back unstarted, no attempt spent
            return Commit(lease, "handback")
        # The lease ends and the attempt's end is kept; the run, over, is not written, and its
        # task stays pending for a ``retry_run`` (as a run cancelled between its steps).
        return Commit(lease, "release", error=CANCELLED_ERROR, used_tokens=ex.ctx.used_tokens)
    if ex.late:  # never began: no attempt spent, no error to keep
        event(log, "start_refused",
              f"task {lease.task_id} {attempt_of(lease, max_attempts(lease, config))}: its "
              "lease was not confirmed "
              "recently enough to start (the worker paused?): handing it back",
              level=logging.WARNING, task_id=lease.task_id, attempt=lease.attempt)  # fmt: skip
        return Commit(lease, "handback")
    if ex.stopped is Stopped.TIMEOUT:
        error = f"TaskTimeout: handler ran longer than {task_timeout(lease, config) or 0:g} s"
        return Commit(lease, "release", delay=0.0, error=error)
    if ex.stopped is Stopped.QUIT or isinstance(raised, Abort):
        return Commit(lease, "release", error="WorkerStopped: QUIT while the task ran")
    if ex.stopped is Stopped.LOST or ex.lost.is_set() or isinstance(raised, LeaseLost):
        return None  # someone else owns the task: whatever this execution made is discarded
    used = ex.ctx.used_tokens
    if isinstance(raised, RetryAfter):  # a limit said "not now": back, no attempt spent
        event(log, "retry_after",
              f"task {lease.task_id} ({lease.task}) "
              f"{attempt_of(lease, max_attempts(lease, config))}: {raised}"
              f"{'' if raised.limit else ' (its limits go on)'}", task_id=lease.task_id,
              run_id=lease.run_id, attempt=lease.attempt, seconds=raised.seconds)  # fmt: skip
        return Commit(lease, "retry_after", delay=raised.seconds, pause=raised.limit,
                      error=f"RetryAfter: {raised}", used_tokens=used)  # fmt: skip
    if isinstance(raised, CallParked):  # B13: a paid call's outcome is unknown: wait
        event(log, "call_parked",
              f"task {lease.task_id} ({lease.task}) {attempt_of(lease)}: {raised}: the run "
              f"waits for 'supervisor resolve {lease.run_id} {raised.name}'",
              level=logging.WARNING, task_id=lease.task_id, run_id=lease.run_id,
              attempt=lease.attempt, call=raised.name)  # fmt: skip
        return Commit(lease, "park", delay=WAIT_FOREVER, wait_for=parked_on(raised.name),
                      error=f"OutcomeUnknown: {raised}", used_tokens=used)  # fmt: skip
    if raised is not None:  # any other exception, KeyboardInterrupt and SystemExit included
        return dataclasses.replace(failure(lease, raised, config), used_tokens=used)
    if ex.ctx.commit is not None:
        return dataclasses.replace(ex.ctx.commit, used_tokens=used)
    with last_word():  # InvalidCommit: the run fails at once
        dumps(value, "the handler's return value")
    return Commit(lease, "finish", expected_revision=lease.revision, new_state=lease.state,
                  result=value, used_tokens=used)  # fmt: skip


def run_handler(ex: Execution, config: WorkerConfig) -> None:
    """Run ``ex``'s plain handler on this thread, if it may still begin, and record its
    ending (``ex.commit``, ``ex.seconds``). Never raises."""
    value: object = None
    raised: BaseException | None = None
    ex.started = time.monotonic()
    try:
        if ex.may_begin():
            with ex.running():  # its own log records carry its task, its span is current
                upgrade(ex)  # B25: an older run's state migrated first, under the fence
                value = ex.handler(ex.ctx)
                ex.ctx._stream_done()  # what it emitted is written before its commit
    except BaseException as exc:  # a handler's error, whatever its kind
        raised = exc
    ex.seconds = time.monotonic() - ex.started
    ex.commit = conclude(ex, value, raised, config)
    ex.ctx._stream_closed()
