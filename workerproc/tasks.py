"""Task objects: what ``@app.task`` returns. A task is still its function (call it, test it), and
it knows its name and its declared options, so code starts runs of it by the object itself
(``summarise.start(payload, store=store)``): a misspelt task is a ``NameError`` at import, not a
run that fails ``unknown_task`` at run time.

Declared options (``@app.task(max_attempts=5, retry_backoff=2, timeout=120, queue="llm",
priority=10)``) are checked here, at import, with the ranges of the pool options they stand in
for (``WorkerConfig``'s declarations: one range, written once); the database keeps them by task
name (B11), so every worker on every host applies the same ones.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from . import options as declared_options
from .config import WorkerConfig
from .limits import check_task_limits
from .store import InvalidPayload, TaskOptions
from .store.codec import check_name, check_run_options
from .store.types import DEFAULT_QUEUE, JSON

if TYPE_CHECKING:
    from .context import TaskContext
    from .store import AsyncStore, Producer

R = TypeVar("R")

MAX_STREAM_TTL = 10 * 365 * 86400.0  # a stream_ttl of ten years at most
MAX_BATCH = 1000  # items of one batch call at most
MAX_BATCH_WAIT = 60.0  # seconds a batch waits for more items at most
DEFAULT_BATCH_WAIT = 0.5


def check_batch(task: str, batch: object, batch_wait: object, fn: object) -> tuple[int, float]:
    """``@app.task(batch=..., batch_wait=...)``, checked: (items per call, seconds to wait for
    them); ``ValueError`` names the bad one. A batch handler is a plain function."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"@app.task({task!r}): batch must be a whole number from 1 to "
                         f"{MAX_BATCH} (got {batch!r})")  # fmt: skip
    wait = DEFAULT_BATCH_WAIT if batch_wait is None else batch_wait
    if (isinstance(wait, bool) or not isinstance(wait, (int, float))
            or not 0 <= wait <= MAX_BATCH_WAIT):  # fmt: skip
        raise ValueError(f"@app.task({task!r}): batch_wait must be a number of seconds from 0 "
                         f"to {MAX_BATCH_WAIT:g} (got {batch_wait!r})")  # fmt: skip
    if inspect.iscoroutinefunction(fn):
        raise ValueError(f"@app.task({task!r}): a batch handler is a plain def (it runs on a "
                         "slot thread), not an async def")  # fmt: skip
    return batch, float(wait)


# Each per-task option and the pool option whose range it keeps (``WorkerConfig``).
POOL_OPTION = {"max_attempts": "max_attempts", "retry_backoff": "retry_backoff",
               "timeout": "task_timeout"}  # fmt: skip


def declare(
    task: str,
    *,
    max_attempts: int | None = None,
    retry_backoff: float | None = None,
    timeout: float | None = None,
    queue: str | None = None,
    priority: int | None = None,
    limits: Iterable[str] | None = None,
    tokens: int | None = None,
    stream_ttl: float | None = None,
) -> TaskOptions:
    """The options ``@app.task(task, ...)`` declares, checked; ``ValueError`` names the bad one."""
    names, reservation = check_task_limits(task, limits, tokens)
    ranges = {d.field: d for d in declared_options.declared(WorkerConfig)}
    given = {"max_attempts": max_attempts, "retry_backoff": retry_backoff, "timeout": timeout}
    for name, value in given.items():
        if value is None:
            continue
        d = ranges[POOL_OPTION[name]]
        whole = d.kind is int
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            kind = "a whole number" if whole else "a number of seconds"
            raise ValueError(f"@app.task({task!r}): {name} must be {kind} (got {value!r})")
        if declared_options.check(d, value) is not None:
            raise ValueError(
                f"@app.task({task!r}): {name} must be {d.opt.bounds()} (got {value!r}), like "
                f"{d.opt.long}"
            )
    try:
        if queue is not None:
            check_run_options(queue, 0, None)
        if priority is not None:
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise InvalidPayload(f"priority must be a whole number (got {priority!r})")
            check_run_options(DEFAULT_QUEUE, priority, None)
    except InvalidPayload as exc:
        raise ValueError(f"@app.task({task!r}): {exc}") from None
    if stream_ttl is not None and (
        isinstance(stream_ttl, bool) or not isinstance(stream_ttl, (int, float))
        or not 0 <= stream_ttl <= MAX_STREAM_TTL
    ):  # fmt: skip
        raise ValueError(f"@app.task({task!r}): stream_ttl must be a number of seconds from 0 "
                         f"to {MAX_STREAM_TTL:g} (got {stream_ttl!r})")  # fmt: skip
    return TaskOptions(
        max_attempts=max_attempts,
        retry_backoff=None if retry_backoff is None else float(retry_backoff),
        timeout=None if timeout is None else float(timeout),
        queue=queue,
        priority=priority,
        limits=names,
        tokens=reservation,
        stream_ttl=None if stream_ttl is None else float(stream_ttl),
    )


class Task(Generic[R]):
    """One task of an ``App``: its ``name``, its function ``fn`` and its declared ``options``.
    Calling it calls the function; ``start`` and ``start_many`` start runs whose first task it
    is, in its declared queue and with its declared priority unless told otherwise.
    ``batch``: the items a batch handler takes per call (None: not a batch step), waiting
    ``batch_wait`` seconds at most for them. ``version``: the version of the state its handler
    reads (B25); ``migrations``: its upgrades of older runs' states, by ``from_version``."""

    def __init__(
        self, name: str, fn: Callable[[TaskContext], R], options: TaskOptions,
        batch: int | None = None, batch_wait: float = DEFAULT_BATCH_WAIT, version: int = 1,
    ) -> None:  # fmt: skip
        self.name = check_name(name)
        self.fn = fn
        self.options = options
        self.batch = batch
        self.batch_wait = batch_wait
        self.version = version  # B25: what runs it starts record; older ones are migrated
        self.migrations: dict[int, Callable[[JSON], JSON]] = {}  # from_version -> upgrade
        functools.update_wrapper(self, fn)  # its name, docstring and module, for tools

    def __call__(self, ctx: TaskContext) -> R:
        return self.fn(ctx)

    def __repr__(self) -> str:
        shown = {
            **self.options.declared,
            **({"batch": self.batch} if self.batch else {}),
            **({"version": self.version} if self.version != 1 else {}),
        }
        declared = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"<Task {self.name!r}{' ' + declared if declared else ''}>"

    def _where(self, queue: str | None, priority: int | None) -> tuple[str, int]:
        options = self.options
        chosen = queue if queue is not None else options.queue or DEFAULT_QUEUE
        return chosen, priority if priority is not None else options.priority or 0

    @overload
    def start(
        self, payload: JSON = None, *, state: JSON = None, key: str | None = None,
        queue: str | None = None, priority: int | None = None, delay: float = 0,
        store: AsyncStore, tx: None = None, traceparent: str | None = None,
        debounce: float | None = None,
    ) -> Awaitable[int]: ...  # fmt: skip
    @overload
    def start(
        self, payload: JSON = None, *, state: JSON = None, key: str | None = None,
        queue: str | None = None, priority: int | None = None, delay: float = 0,
        store: Producer, tx: Any = None, traceparent: str | None = None,
        debounce: float | None = None,
    ) -> int: ...  # fmt: skip

    def start(
        self,
        payload: JSON = None,
        *,
        state: JSON = None,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float = 0,
        store: Producer | AsyncStore,
        tx: Any = None,
        traceparent: str | None = None,
        debounce: float | None = None,
    ) -> int | Awaitable[int]:
        """Start a run whose first task is this one; returns its id (``store.start_run``, with
        the task's declared queue and priority unless ``queue``/``priority`` say otherwise, and
        the task's version, B25).
        With an async store (``open_async_store``) it returns an awaitable of the id. ``tx``:
        the caller's own transaction (transactional enqueue; the sync store only).
        ``traceparent``: the W3C trace context its steps continue (None: the current span's,
        when OpenTelemetry records one; "": none). ``debounce`` (seconds, with ``key``): a
        burst of starts with one key is one run (``store.start_run``)."""
        where, level = self._where(queue, priority)
        extra = {} if tx is None else {"tx": tx}
        return store.start_run(self.name, payload, state, delay, key=key, queue=where,
                               priority=level, traceparent=traceparent, debounce=debounce,
                               version=self.version, **extra)  # fmt: skip

    @overload
    def start_many(
        self, payloads: Iterable[JSON], *, state: JSON = None,
        keys: Iterable[str | None] | None = None, queue: str | None = None,
        priority: int | None = None, delay: float = 0, store: AsyncStore, tx: None = None,
        traceparent: str | None = None,
    ) -> Awaitable[list[int]]: ...  # fmt: skip
    @overload
    def start_many(
        self, payloads: Iterable[JSON], *, state: JSON = None,
        keys: Iterable[str | None] | None = None, queue: str | None = None,
        priority: int | None = None, delay: float = 0, store: Producer, tx: Any = None,
        traceparent: str | None = None,
    ) -> list[int]: ...  # fmt: skip

    def start_many(
        self,
        payloads: Iterable[JSON],
        *,
        state: JSON = None,
        keys: Iterable[str | None] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float = 0,
        store: Producer | AsyncStore,
        tx: Any = None,
        traceparent: str | None = None,
    ) -> list[int] | Awaitable[list[int]]:
        """Start one run of this task per payload, in one transaction (``store.start_runs``);
        ``keys``, if given, holds one idempotency key (or None) per payload. Returns the run
        ids in order (an awaitable of them with an async store). ``traceparent``: as
        ``start``'s, for every run."""
        where, level = self._where(queue, priority)
        payloads = list(payloads)
        chosen = [None] * len(payloads) if keys is None else list(keys)
        if len(chosen) != len(payloads):
            raise ValueError(f"start_many: {len(payloads)} payloads but {len(chosen)} keys")
        items = [
            {"task": self.name, "payload": p, "state": state, "key": k, "queue": where,
             "priority": level, "delay": delay, "traceparent": traceparent,
             "version": self.version}
            for p, k in zip(payloads, chosen, strict=True)
        ]  # fmt: skip
        extra = {} if tx is None else {"tx": tx}
        return store.start_runs(items, **extra)
