"""What a handler gets: the ``TaskContext`` of the task it runs, ``LeaseLost`` and
``RunCancelled``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn, Protocol

from .emitting import Streaming
from .once import CallBook, OnceCall
from .paying import PaidCalls
from .store import Commit, InvalidCommit, InvalidPayload, Lease
from .store.codec import (
    MAX_DELAY,
    MAX_PAYLOAD,
    RESERVED,
    WAIT_FOREVER,
    check_name,
    check_run_options,
    dumps,
    shown,
)
from .store.newrun import START_FIELDS, NewRun
from .store.types import JSON, MAX_CHILDREN, Child, Signal, Usage
from .streaming import Streamer
from .tasks import Task


class LeaseLost(BaseException):
    """This execution lost its lease: another worker owns the task now. Derives from
    BaseException so a handler's ``except Exception`` cannot swallow it; the worker discards
    whatever the execution would have written."""


class RunCancelled(BaseException):
    """This execution's run was cancelled while it ran (``supervisor cancel``,
    ``store.cancel_run``; B15): the worker heard it at its next renewal. Derives from
    BaseException so a handler's ``except Exception`` cannot swallow it; nothing the execution
    would have written lands: the run stays cancelled and the worker releases the task's lease
    (the task stays pending, for a ``retry_run``)."""


class Settable(Protocol):
    """A one-way flag one thread sets and another reads (a ``threading.Event`` is one)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


class Flag:
    """An execution's ``lost`` or ``cancelled``: set by the conductor, read by the handler's
    thread, never waited on, so a bool does (the GIL orders its write and read); a
    ``threading.Event`` builds a ``Condition`` and a lock (about 4 us, two per execution)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class TaskContext(PaidCalls, Streaming):
    """What a handler sees of the task it runs. ``advance`` and ``finish`` record the handler's
    last word; the worker writes it under the lease when the handler returns, in one transaction
    with the claims of the next tasks. Returning without either finishes the run with its state
    unchanged and the return value (JSON) as its result.

    Once the lease is lost, reading the run's data (``payload``, ``state``, ``revision``) and
    every call (``advance``, ``finish``, ``usage``, ``raise_if_lost``) raise ``LeaseLost``: a
    handler on a slot thread cannot be interrupted from outside, so this is where it learns it
    (an inline handler is also interrupted; an async one is cancelled). Once the run is
    cancelled under it (B15), the same reads and calls raise ``RunCancelled``. Which step this
    is (``run_id``, ``task_id``, ``task``, ``attempt``) stays readable, for logs."""

    def __init__(
        self,
        lease: Lease,
        lost: Settable,
        tasks: Mapping[str, Task[Any]] | None = None,
        cancelled: Settable | None = None,
        calls: CallBook | None = None,
        streams: Streamer | None = None,
    ) -> None:
        self._lease = lease
        self._lost = lost
        self._cancelled = cancelled or Flag()  # set when the run is cancelled
        self._tasks = tasks or {}  # the app's tasks: where ``advance`` finds a task's queue
        self._calls = calls  # the worker's paid calls (``once``)
        self._streams = streams  # the worker's stream writer (``emit``)
        self._emitter = None
        self._mine = []
        self._before = None
        self.reused = 0  # how many ``once`` calls of this execution reused a kept answer
        self.last_once: OnceCall | None = None  # what the last ``once`` did
        self.commit: Commit | None = None
        # R4's start rule, once more at the handler's first read of its task (its payload or
        # state: what a paid call is made of), so no wait between the worker's last check and
        # that read (another thread holding the GIL while the process was stopped, say) lets a
        # stale lease begin. A renewal since the start confirms the lease anew: then the read
        # is fine however late it comes.
        self.begin_by: float | None = None  # monotonic; None once checked
        self.confirmed = 0.0  # the confirmation the start was judged on
        self.latest: Callable[[], float | None] = lambda: None  # the lease's newest one
        self.late = False  # that check failed: the handler never began in earnest
        self.used_tokens: int | None = None  # tokens used (usage, once): settled at the commit
        self.reported: Usage | None = None  # what ``usage`` reported, kept with the commit

    @property
    def run_id(self) -> int:
        """The run this task is a step of (readable after the lease is lost, for logs)."""
        return self._lease.run_id

    @property
    def task_id(self) -> int:
        """This task's id (readable after the lease is lost)."""
        return self._lease.task_id

    @property
    def task(self) -> str:
        """This task's name: the handler's (readable after the lease is lost)."""
        return self._lease.task

    @property
    def attempt(self) -> int:
        """How many times this task has been claimed, this claim included: the fencing token
        (readable after the lease is lost)."""
        return self._lease.attempt

    @property
    def tries(self) -> int:
        """This try's number within the task's budget (``max_attempts``): the attempts since
        the run was last retried, not counting claims that spent nothing (a hand-back, a lease
        that lapsed before its handler began, a ``RetryAfter``). 1 on the first try, the bound
        on the last (readable after the lease is lost)."""
        return self._lease.tries

    @property
    def lease(self) -> Lease:
        """The lease this execution holds, as claimed, for a fenced write of the task's own (the
        webhooks' delivery moves its position under it, B20): its fence (task, owner, attempt),
        its run and its times, readable after the lease is lost (the store then refuses the
        write). The run's data is not in it: ``payload`` and ``state`` read that, checking the
        lease first."""
        return dataclasses.replace(self._lease, payload=None, state=None)

    @property
    def payload(self) -> JSON:
        """The task's JSON payload; ``LeaseLost`` once the lease is lost."""
        self._readable()
        return self._lease.payload

    @property
    def state(self) -> JSON:
        """The run's JSON state when this task was claimed; ``LeaseLost`` once the lease is
        lost."""
        self._readable()
        return self._lease.state

    @property
    def revision(self) -> int:
        """The run's revision when this task was claimed (its commit is compared with it);
        ``LeaseLost`` once the lease is lost."""
        self._readable()
        return self._lease.revision

    def _readable(self) -> None:
        self.raise_if_lost()
        if self.begin_by is not None:
            latest = self.latest()
            renewed = latest is not None and latest > self.confirmed
            if not renewed and time.monotonic() > self.begin_by:
                self.late = True
                raise LeaseLost()
            self.begin_by = None

    @property
    def lease_lost(self) -> bool:
        """An early hint only (R5): the database decides at commit time."""
        return self._lost.is_set()

    @property
    def cancelled(self) -> bool:
        """The run was cancelled while this execution ran (B15): its next ``ctx`` call raises
        ``RunCancelled``."""
        return self._cancelled.is_set()

    def _lost_now(self, over: bool) -> NoReturn:
        """The database said this attempt no longer holds a live lease (``over``: it does,
        but its run is over): stop here."""
        if over:
            self._cancelled.set()
            raise RunCancelled()
        raise LeaseLost()

    def raise_if_lost(self) -> None:
        """Raise ``LeaseLost`` if the lease is gone, ``RunCancelled`` if the run was
        cancelled: a checkpoint for long loops."""
        if self._lost.is_set():
            raise LeaseLost()
        if self._cancelled.is_set():
            raise RunCancelled()

    def _record(self, commit: Commit) -> None:
        self.raise_if_lost()
        if self.commit is not None:
            raise RuntimeError("advance/finish/wait_for/spawn may be called once per execution")
        self.commit = commit

    def advance(
        self,
        new_state: JSON,
        next: str | Task[Any],
        payload: JSON = None,
        delay: float = 0,
        *,
        queue: str | None = None,
    ) -> None:
        """Move the run to ``new_state`` and enqueue task ``next`` (a task object, or its name)
        after ``delay`` seconds: in ``queue`` if given, else in the queue ``next`` declares
        (``@app.task(queue=...)``), else in the run's own queue (the run moves with it). Every
        value is checked here, with the limits every backend stores: a bad one raises
        ``InvalidPayload`` (a ``ValueError``) at this call."""
        self.raise_if_lost()
        with last_word():  # reject a bad value here, at the call that made it
            dumps(new_state, "state")
            dumps(payload, "payload", MAX_PAYLOAD)
            # a Task object stands for its name
            name = check_name(next.name if isinstance(next, Task) else next,
                              "advance's next task")  # fmt: skip
            if queue is None and (declared := self._tasks.get(name)) is not None:
                queue = declared.options.queue
            if queue is not None:  # (only a system run stays on a reserved queue)
                check_run_options(queue, 0, None, system=self._lease.queue.startswith(RESERVED))
            seconds = _seconds(delay, "delay")
        self._record(
            Commit(
                self._lease,
                "advance",
                expected_revision=self._lease.revision,
                new_state=new_state,
                next_task=name,
                next_payload=payload,
                next_queue=queue,
                delay=seconds,
                version=self._version_of(name),
            )
        )

    def _version_of(self, task: str) -> int | None:
        """The version of ``task`` in this worker's app (B25): what a next task records
        (None: not this app's task: unversioned)."""
        declared = self._tasks.get(task)
        return None if declared is None else declared.version

    @property
    def signal(self) -> Signal | None:
        """The signal that resumed this task's wait (``name``, ``payload``, ``sent_at``), or
        None: the wait timed out, or this task did not wait; ``LeaseLost`` once the lease is
        lost."""
        self._readable()
        return self._lease.signal

    def wait_for(
        self,
        name: str,
        next: str | Task[Any],
        timeout: float | None = None,
        state: JSON = None,
        payload: JSON = None,
    ) -> None:
        """Wait for signal ``name`` without a lease, a slot or a poll, then run task ``next``:
        at once when the signal comes (``store.signal(run_id, name, payload)``; one sent
        before this wait is delivered now), with it as ``ctx.signal``, or after ``timeout``
        seconds (None: no timeout) with ``ctx.signal`` None. ``state``: the run's new state
        (None: unchanged). Written with the commit, fenced like every commit."""
        self.raise_if_lost()
        new_state = self._lease.state if state is None else state
        with last_word():
            signal = check_name(name, "signal name")
            dumps(new_state, "state")
            dumps(payload, "payload", MAX_PAYLOAD)
            task = check_name(next.name if isinstance(next, Task) else next,
                              "wait_for's next task")  # fmt: skip
            seconds = WAIT_FOREVER if timeout is None else _seconds(timeout, "timeout")
        queue = declared.options.queue if (declared := self._tasks.get(task)) else None
        self._record(
            Commit(
                self._lease,
                "wait",
                expected_revision=self._lease.revision,
                new_state=new_state,
                next_task=task,
                next_payload=payload,
                next_queue=queue,
                delay=seconds,
                wait_for=f"signal:{signal}",
                version=self._version_of(task),
            )
        )

    @property
    def children(self) -> list[Child]:
        """The children this join task waited for (``spawn``), in spawn order: each one's
        ``run_id``, ``status``, ``result`` and ``error``; empty for a task that joins none;
        ``LeaseLost`` once the lease is lost."""
        self._readable()
        return list(self._lease.children or ())

    def spawn(
        self,
        items: list[dict[str, Any]],
        then: str | Task[Any],
        state: JSON = None,
        payload: JSON = None,
    ) -> None:
        """Start a child run per item (``task``, ``payload``, and optionally ``state``,
        ``delay``, ``queue``, ``priority``) and wait, without a lease, until every one has
        ended; then task ``then`` runs once, with them as ``ctx.children``. The children are
        started by this execution's commit, in its fenced transaction: a refused commit starts
        none. A child runs in ``queue``, else the queue its task declares, else this run's.
        ``state``: the run's new state (None: unchanged)."""
        self.raise_if_lost()
        new_state = self._lease.state if state is None else state
        with last_word():
            if not isinstance(items, (list, tuple)) or len(items) > MAX_CHILDREN:
                raise InvalidPayload(f"spawn takes a list of at most {MAX_CHILDREN} children")
            children = tuple(self._child(item) for item in items)
            dumps(new_state, "state")
            dumps(payload, "payload", MAX_PAYLOAD)
            task = check_name(then.name if isinstance(then, Task) else then, "spawn's then task")
        queue = declared.options.queue if (declared := self._tasks.get(task)) else None
        self._record(
            Commit(
                self._lease,
                "spawn",
                expected_revision=self._lease.revision,
                new_state=new_state,
                next_task=task,
                next_payload=payload,
                next_queue=queue,
                delay=WAIT_FOREVER,
                children=children,
                version=self._version_of(task),
            )
        )

    def _child(self, item: Any) -> NewRun:
        if not isinstance(item, dict) or "task" not in item or set(item) - START_FIELDS:
            raise InvalidPayload(
                "a spawn item is a dict with 'task' and any of payload, state, delay, queue, "
                f"priority (got {shown(item)})"
            )
        if "key" in item:
            raise InvalidPayload("a child run takes no key (its parent's commit starts it once)")
        name = check_name(item["task"], "a child's task")
        options = declared.options if (declared := self._tasks.get(name)) else None
        queue = item.get("queue") or (options and options.queue) or self._lease.queue
        priority = item.get("priority", options.priority if options else None) or 0
        return NewRun.make(name, item.get("payload"), item.get("state"), item.get("delay", 0),
                           None, queue, priority, version=self._version_of(name))  # fmt: skip

    def finish(self, new_state: JSON, result: JSON = None) -> None:
        """Move the run to ``new_state`` and mark it succeeded with ``result``."""
        self.raise_if_lost()
        with last_word():
            dumps(new_state, "state")
            dumps(result, "result")
        self._record(
            Commit(
                self._lease,
                "finish",
                expected_revision=self._lease.revision,
                new_state=new_state,
                result=result,
            )
        )


@contextlib.contextmanager
def last_word() -> Iterator[None]:
    """Checks of a value of the handler's own commit: one that cannot be stored raises
    ``InvalidCommit`` (no retry of the step can fix it), not a plain ``InvalidPayload``."""
    try:
        yield
    except InvalidCommit:
        raise
    except InvalidPayload as exc:
        raise InvalidCommit(str(exc)) from None


def _seconds(value: object, what: str) -> float:
    """A handler's ``delay`` or ``timeout``, from 0 to ``MAX_DELAY`` seconds (nan and inf
    refused), or ``InvalidPayload`` at the call."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except Exception:
        seconds = math.nan
    if not 0 <= seconds <= MAX_DELAY:
        raise InvalidPayload(f"{what} must be from 0 to {MAX_DELAY:g} seconds (got {shown(value)})")
    return seconds
