"""The test mode: run a task, or a whole run through all its steps, in this process, against a
temporary store, so users unit-test their handlers without a pool.

``app.run_inline(task, payload)`` starts a run of ``task`` in a fresh SQLite database of its own
(a temporary directory, removed afterwards), then claims and runs its tasks one at a time, the
way a worker does: the same claim, the same ``TaskContext``, the same commit under the lease,
the same retries, backoff and per-task options. Plain handlers run on the calling thread,
``async def`` ones on an event loop thread of their own (as in a worker, so a test that is itself
``async`` may call it too). The store's clock is the test's: a delay or a retry backoff passes
at once, so a run that waits an hour between steps finishes in milliseconds.

- ``raise_errors`` (default): the first exception a handler raises is raised from
  ``run_inline`` (after the store recorded it as a worker would): the test fails with the
  handler's own traceback. Without it, handler errors are retried with backoff up to the
  task's ``max_attempts``, and the run ends failed, as in production.
- ``steps``: stop after that many steps of the run (``steps=1``: run one handler).
- ``hooks`` (default): the app's ``on_worker_start`` hooks run first and its ``on_worker_stop``
  hooks last, as in a worker.
- ``store``: a store of your own (``temporary_store()``, or the ``leasekeeper_store`` fixture of
  ``workerproc.pytest_plugin``) to look at afterwards; ``run_inline`` then runs whatever that
  store has ready, one task at a time, until this run ends.
- ``clock``: ``"virtual"`` (the default on a temporary store): delays, retry backoffs,
  ``RetryAfter`` and ``wait_for`` timeouts pass at once, on the store's test clock (a store of
  your own needs one: ``temporary_store()``); ``"real"`` (the default on a store of yours): the
  test sleeps through them.
- ``signals``: ``{name: payload}``, each sent to the run as it starts (``store.signal``): the
  run's ``wait_for(name)`` resumes with it, as in a pool, however late the wait comes. A run
  that waits for a signal the test did not send times out if its wait has a timeout, and
  otherwise ends the call with ``RuntimeError`` naming the signal (it would wait for ever).
- As in a pool: ``RetryAfter`` gives the task back for its delay (no attempt spent, never an
  error); the app's limits are declared and gate the run's tasks; ``ctx.once`` keeps its answers.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from . import hooks as lifecycle
from . import tracing
from .batching import Batch, ItemContext
from .config import WorkerConfig
from .execution import Execution, Mode, conclude, mode_for
from .limits import RetryAfter
from .once import CallBook
from .store import CasResult, Commit, Lease, Run, Store, open_store
from .store.codec import WAIT_FOREVER
from .store.types import JSON
from .streaming import Streamer
from .tasks import Task
from .versions import upgrade, upgrade_async

if TYPE_CHECKING:
    import asyncio

    from .app import App

OWNER = "inline:0:0:test"  # the owner of every lease the test mode takes
TTL = 24 * 3600.0  # a lease never expires while a test's handler runs
MAX_STEPS = 10_000  # a run that never ends (a handler that always advances) stops here
HOST = "inline"  # who declares the app's limits (``supervisor limits`` shows it)
Clock = Literal["virtual", "real"]


class TestClock:
    """The temporary store's clock: the wall clock's reading when the test began, moved
    forward only by ``run_inline`` when the run waits (a delay, a retry backoff)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance_to(self, moment: float) -> None:
        self.now = max(self.now, moment)


# The test clock of each temporary store: run_inline moves it when a run waits.
_clocks: weakref.WeakKeyDictionary[Store, TestClock] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def temporary_store(
    db: str | None = None, *, clock: Callable[[], float] | None = None
) -> Iterator[Store]:
    """A store on a fresh SQLite database in a temporary directory, removed afterwards; or,
    with ``db``, on that database (a PostgreSQL URL whose ``?schema=`` is the test's own, say:
    the test mode on the backend a pool uses), left as it is and closed afterwards. Its clock
    is a ``TestClock`` unless ``clock`` is given: ``run_inline`` on it lets delays, retry
    backoffs and wait timeouts pass at once (``clock="virtual"``)."""
    own = TestClock() if clock is None else None
    with contextlib.ExitStack() as stack:
        if db is None:
            where = stack.enter_context(tempfile.TemporaryDirectory(prefix="leasekeeper-test-"))
            db = os.path.join(where, "test.db")
        store = open_store(db, clock=own or clock)
        stack.callback(store.close)
        if own is not None:
            _clocks[store] = own
        yield store


class _Loop:
    """An event loop on a thread of its own, started at the first ``async def`` handler or
    hook: where the test mode runs them, as a worker does."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, awaitable: Awaitable[Any]) -> Any:
        import asyncio  # noqa: PLC0415 - only a test with async handlers pays for it

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever,
                                            name="inline-async", daemon=True)  # fmt: skip
            self._thread.start()

        async def wrapped() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result()

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not thread.is_alive():
            loop.close()


def _execute(ex: Execution, loop: _Loop, config: WorkerConfig) -> tuple[Commit | None, Any]:
    """Run one handler as a worker's slot would; its commit, and what it raised."""
    value: object = None
    raised: BaseException | None = None

    async def on_the_loop() -> Any:
        with ex.running():  # in the loop's task: its own log records carry its task
            await upgrade_async(ex)  # B25: an older run's state migrated first
            value = await ex.handler(ex.ctx)
            await ex.ctx.flush_async()  # what it emitted is written before its commit
            return value

    try:
        if ex.mode is Mode.ASYNC:
            value = loop.run(on_the_loop())
        else:
            with ex.running():
                upgrade(ex)  # B25: an older run's state migrated first, under the fence
                given: Any = _batch_of_one(ex) if ex.item else ex.ctx  # (a batch step: a Batch)
                value = ex.handler(given)
                ex.ctx._stream_done()
    except BaseException as exc:  # a handler's error, whatever its kind
        raised = exc
    if isinstance(ex.ctx, ItemContext):  # a batch step's item: its own last word, or the error
        raised = ex.ctx.ended_by(raised)
    commit = conclude(ex, value, raised, config)
    ex.ctx._stream_closed()
    return commit, raised


def _batch_of_one(ex: Execution) -> Batch:
    """A batch step runs inline as a batch of one: its own task."""
    assert isinstance(ex.ctx, ItemContext)
    return Batch([ex.ctx], ex.calls, f"{ex.lease.task_id}.{ex.lease.attempt}")


def _write(store: Store, commit: Commit) -> None:
    """Write ``commit``; a conflict (the run was moved under it) is settled as a worker does."""
    result = store.commit_many([commit]).results[0]
    tracing.ended(commit, result)  # its step's span, if traced, ends with the outcome
    if result is not CasResult.CONFLICT:
        return
    run = store.get_run(commit.lease.run_id)
    if run is None or run.terminal:
        store.commit_many([Commit(commit.lease, "drop")])
    else:
        store.commit_many([Commit(commit.lease, "release")])


def run_inline(
    app: App,
    task: str | Task[Any],
    payload: JSON = None,
    *,
    state: JSON = None,
    steps: int | None = None,
    store: Store | None = None,
    raise_errors: bool = True,
    hooks: bool = True,
    max_attempts: int = 3,
    signals: Mapping[str, JSON] | None = None,
    clock: Clock | None = None,
) -> Run:
    """Run ``task`` of ``app`` through its run in this process (see the module's docstring);
    the run as it ended (or after ``steps`` steps)."""
    name = task if isinstance(task, str) else task.name
    if name not in app.tasks:
        raise ValueError(f"the app has no task {name!r} (its tasks: {', '.join(app.tasks)})")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps})")
    if clock not in (None, "virtual", "real"):
        raise ValueError(f"clock must be 'virtual' or 'real' (got {clock!r})")
    with contextlib.ExitStack() as stack:
        if store is None:
            store = stack.enter_context(temporary_store())
        virtual = _clocks.get(store)
        if clock == "virtual" and virtual is None:
            raise ValueError("clock='virtual' needs a store with a test clock: temporary_store()")
        test_clock = None if clock == "real" else virtual
        store.register_tasks(app.task_options())
        store.declare_limits(app.limits, by=HOST)
        run_id = app.tasks[name].start(payload, state=state, store=store)
        for signal, sent in (signals or {}).items():
            store.signal(run_id, signal, sent)
        loop = _Loop()
        stack.callback(loop.close)
        if hooks:
            failed = lifecycle.start(app.worker_start, loop.run)
            if failed is not None:
                raise failed
            stack.callback(lifecycle.stop, app.worker_stop, loop.run)
        config = WorkerConfig(db=store.url, app="inline:app", max_attempts=max_attempts)
        calls = CallBook(partial(open_store, store.url))  # ``ctx.once``'s, as a worker's
        stack.callback(calls.close)
        streams = Streamer(partial(open_store, store.url))  # ``ctx.emit``'s, as a worker's
        stack.callback(streams.close)
        done = 0
        for _ in range(MAX_STEPS):
            run = _get(store, run_id)
            if run.terminal or (steps is not None and done >= steps):
                return run
            lease = store.claim(OWNER, TTL, max_attempts=max_attempts)
            if lease is None:
                run = _get(store, run_id)  # the claim may have failed it (R6)
                if not run.terminal:
                    _wait(store, test_clock, run)
                continue
            if not lease.started and not store.renew(lease, TTL, start=True):
                continue  # its own lapsed lease, taken over: it begins now, recorded (B3)
            raised = _step(app, store, lease, loop, config, calls, streams)
            done += lease.run_id == run_id
            if raised is not None and raise_errors:
                raise raised
        raise RuntimeError(f"run {run_id} did not end within {MAX_STEPS} steps")
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _get(store: Store, run_id: int) -> Run:
    run = store.get_run(run_id)
    if run is None:
        raise RuntimeError(f"run {run_id} is gone from the store")
    return run


def _wait(store: Store, clock: TestClock | None, run: Run) -> None:
    """Nothing is ready: move the test's clock to the next task's moment (a delay, a backoff),
    or, on a store of the caller's own, sleep until then."""
    due = store.next_ready_at()
    if due is None:
        raise RuntimeError(f"run {run.id} is {run.status} but no task of it can run")
    if run.waiting_for is not None and due - store.now() >= WAIT_FOREVER / 2:
        what = run.waiting_for.removeprefix("signal:")
        raise RuntimeError(
            f"run {run.id} waits for {what!r} with no timeout, which the test did not send: "
            f"pass signals={{{what!r}: ...}} to run_inline"
        )
    if clock is not None:
        clock.advance_to(due)
    else:
        time.sleep(min(1.0, max(0.001, due - store.now())))


def _step(
    app: App,
    store: Store,
    lease: Lease,
    loop: _Loop,
    config: WorkerConfig,
    calls: CallBook,
    streams: Streamer,
) -> Any:
    """Run the leased task and write its commit; what its handler raised (None: nothing)."""
    handler = app.handlers.get(lease.task)
    if handler is None:
        error = f"UnknownTask: no handler named {lease.task!r} in this app"
        store.commit_many([Commit(lease, "fail", reason="unknown_task", error=error)])
        return LookupError(f"task {lease.task!r} of run {lease.run_id}: no handler has that name")
    declared = app.tasks.get(lease.task)
    batched = declared is not None and declared.batch is not None  # a batch of one
    ex = Execution(lease, handler, mode_for(handler, 2), tasks=app.tasks, calls=calls,
                   streams=streams, item=batched)  # fmt: skip
    commit, raised = _execute(ex, loop, config)
    if commit is not None:
        _write(store, commit)
    return None if isinstance(raised, RetryAfter) else raised  # ("not now" is no error)
