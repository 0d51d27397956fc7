"""The handler side: ``App``, the ``@app.task`` decorator and its task objects, the worker
lifecycle hooks, and the test mode's entry point. What a handler gets is ``context.py``."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from .context import LeaseLost, RunCancelled, TaskContext
from .limits import LimitSpec
from .store import TaskOptions
from .store.codec import RESERVED, check_name
from .store.errors import InvalidPayload
from .store.limits import unfit
from .store.schedules import ScheduleSpec
from .store.types import DEFAULT_QUEUE, JSON
from .store.webhooks import DELIVERY_TASK
from .tasks import Task, check_batch, declare
from .versions import Migration, check_version, floor, served

if TYPE_CHECKING:
    from .store import Run, Store

Handler = Callable[[TaskContext], Any]
# A worker lifecycle hook: a plain function, or an ``async def`` one (run on the worker's loop)
Hook = Callable[[], None] | Callable[[], Awaitable[None]]
R = TypeVar("R")
T = TypeVar("T")
H = TypeVar("H", bound=Hook)

__all__ = ["App", "Handler", "Hook", "LeaseLost", "RunCancelled", "Task", "TaskContext"]


class App:
    """A registry of tasks and worker hooks: ``app = App()``, then ``@app.task`` on each
    handler and, for what each worker process sets up once, ``@app.on_worker_start``."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}  # name -> function: what a worker calls
        self.tasks: dict[str, Task[Any]] = {}  # name -> task object
        self.worker_start: list[Hook] = []
        self.worker_stop: list[Hook] = []
        self.limits: dict[str, LimitSpec] = {}  # name -> its declared numbers
        self.schedules: dict[str, ScheduleSpec] = {}  # name -> its declaration
        # task name -> from_version -> migration, until the task is registered (B25)
        self._pending_migrations: dict[str, dict[int, Migration]] = {}

    def limit(
        self,
        name: str,
        *,
        rate: str | float | None = None,
        burst: float | None = None,
        concurrency: int | None = None,
        tokens: str | float | None = None,
        token_burst: float | None = None,
        per: str | None = None,
    ) -> LimitSpec:
        """Declare a limit that tasks wait behind (``@app.task(limits=[name])``), kept in the
        database for every worker on every host and enforced in the claim:

        - ``rate``: starts per time (``"500/m"``, ``"10/s"``), ``burst`` of them at once;
        - ``concurrency``: handlers running at once (live leases);
        - ``tokens``: a token budget per time (``"200000/m"``), ``token_burst`` at once; each
          run reserves its task's ``tokens`` and settles what ``ctx.usage`` reports;
        - ``per``: one budget per value of this payload field (a tenant, say); runs of
          different keys take turns.

        Checked here (a ``ValueError`` at import). Workers write the numbers when they start;
        ``supervisor limits set`` changes them at run time until a release declares others."""
        spec = LimitSpec.declare(name, rate=rate, burst=burst, concurrency=concurrency,
                                 tokens=tokens, token_burst=token_burst, per=per)  # fmt: skip
        if name in self.limits and self.limits[name] != spec:
            raise ValueError(f"limit {name!r} is declared twice, with other numbers")
        if never := unfit(self._reservations(), {name: spec}):  # B12: it would wait for ever
            raise ValueError(f"app.limit({name!r}): {never[0]}")
        self.limits[name] = spec
        return spec

    def schedule(
        self, cron: str, *, task: str | None = None, payload: JSON = None, tz: str = "UTC",
        catch_up: str = "one", name: str | None = None, queue: str | None = None,
        priority: int | None = None,
    ) -> Callable[[T], T]:  # fmt: skip
        """Start a run of ``task`` at every tick of ``cron`` in time zone ``tz``, exactly once
        per tick across every worker on every host (``docs/how-to/schedules.md``):

        - ``cron``: five fields (minute hour day month weekday) or six with seconds first
          (``"*/10 * * * * *"``: every ten seconds), read by cronsim;
        - ``task``: the task a tick starts (as a decorator above ``@app.task``, that task);
          ``payload``: its payload; ``queue``, ``priority``: the task's declared ones unless
          given;
        - ``catch_up``: after downtime, ``"skip"`` the missed ticks, run ``"one"`` for them,
          or run ``"all"`` of them (the newest 1,000);
        - ``name``: the schedule's name (default: the task's), unique in the database.

        Checked here (a ``ValueError`` at import); a task that is not registered when a worker
        starts is a ``ValueError`` then. Workers write their app's schedules when they start.
        Called plainly (``app.schedule("0 * * * *", task="report")``) it declares at once; as a
        decorator without ``task``, the decorated task (or function) is the one started."""

        def add(spec: ScheduleSpec) -> None:
            held = self.schedules.get(spec.name)
            if held is not None and held != spec:
                raise ValueError(f"schedule {spec.name!r} is declared twice, otherwise: "
                                 "give the second one a name=")  # fmt: skip
            self.schedules[spec.name] = spec

        def spec_for(target: str) -> ScheduleSpec:
            return ScheduleSpec.declare(cron, task=target, name=name, payload=payload, tz=tz,
                                        catch_up=catch_up, queue=queue,
                                        priority=priority)  # fmt: skip

        if task is not None:
            add(spec_for(task))

        def decorate(target: T) -> T:
            if task is None:
                add(spec_for(target.name if isinstance(target, Task)
                              else str(getattr(target, "__name__", ""))))  # fmt: skip
            return target

        return decorate

    def schedule_specs(self) -> dict[str, ScheduleSpec]:
        """The app's schedules as a worker writes them: each task registered, its queue and
        priority the task's declared ones unless the schedule gave its own."""
        out = {}
        for key, spec in self.schedules.items():
            task = self.tasks.get(spec.task)
            if task is None:
                raise ValueError(f"schedule {key!r} starts task {spec.task!r}, which the app "
                                 "does not register (@app.task)")  # fmt: skip
            options = task.options
            out[key] = dataclasses.replace(
                spec, queue=spec.queue or options.queue or DEFAULT_QUEUE,
                priority=spec.priority if spec.priority is not None else options.priority or 0,
            )  # fmt: skip
        return out

    @overload
    def task(self, name: Callable[[TaskContext], R], /) -> Task[R]: ...
    @overload
    def task(
        self, name: str | None = None, /, *, max_attempts: int | None = None,
        retry_backoff: float | None = None, timeout: float | None = None,
        queue: str | None = None, priority: int | None = None,
        limits: Sequence[str] | None = None, tokens: int | None = None,
        stream_ttl: float | None = None, aliases: Sequence[str] = (),
        batch: int | None = None, batch_wait: float | None = None, version: int | None = None,
    ) -> Callable[[Callable[[Any], R]], Task[R]]: ...  # fmt: skip

    def task(
        self,
        name: str | Callable[[TaskContext], Any] | None = None,
        /,
        *,
        max_attempts: int | None = None,
        retry_backoff: float | None = None,
        timeout: float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        limits: Sequence[str] | None = None,
        tokens: int | None = None,
        stream_ttl: float | None = None,
        aliases: Sequence[str] = (),
        batch: int | None = None,
        batch_wait: float | None = None,
        version: int | None = None,
    ) -> Task[Any] | Callable[[Callable[[Any], Any]], Task[Any]]:
        """Register a handler and return its task object: ``@app.task`` (the function's own
        name), ``@app.task("name")``, or with options that override the pool's for this task:

        - ``max_attempts``: deliveries before the run fails (``--max-attempts``);
        - ``retry_backoff``: the first retry delay after a handler error, doubling per attempt
          (``--retry-backoff``; ``--retry-backoff-max`` still caps it, unless it is lower);
        - ``timeout``: the hard limit of one execution in seconds (``--task-timeout``);
        - ``queue``, ``priority``: where runs of it start (``task.start``,
          ``supervisor enqueue --app``) and the queue a run moves to when ``advance`` makes
          it the next task;
        - ``limits``: the limits (``app.limit``) its runs wait behind, at most three, and
          ``tokens``: what each run reserves from their token budgets (``ctx.usage`` settles
          what it really used);
        - ``stream_ttl``: seconds a succeeded run keeps the stream this task's handler wrote
          (``ctx.emit``) before it is dropped (None: until the run is pruned);
        - ``aliases``: other names this handler serves, with the same options: a task renamed
          in a release keeps serving the runs its old name started (``aliases=["old"]``).
          A worker claims only the tasks it has a handler for, by name or alias, so a rolling
          deploy's old workers never take a new release's task (docs/how-to/deploy.md);
        - ``batch``: a batch step: the handler takes a ``Batch`` of up to this many runs'
          tasks in one call (``docs/how-to/batch.md``), waiting ``batch_wait`` seconds at
          most (default 0.5) for them; each item keeps its own lease and is committed alone;
        - ``version``: the version of the run state this handler reads (1 to 1,000,000,
          default 1); runs started at an older one are upgraded by its ``@app.migrate``
          functions before it runs, and workers of an older release never claim runs at a
          newer one (B25, docs/how-to/deploy.md).

        They are checked here (a ``ValueError`` at import) and kept in the database by task
        name when a worker starts, so every worker on every host applies the same ones. A name
        registered twice for different functions is a ``ValueError``."""
        declared = {"max_attempts": max_attempts, "retry_backoff": retry_backoff,
                    "timeout": timeout, "queue": queue, "priority": priority,
                    "limits": limits, "tokens": tokens, "stream_ttl": stream_ttl}  # fmt: skip
        batching = (batch, batch_wait)
        if callable(name):  # bare @app.task
            return self._register(None, name, declared, batching, aliases, version)
        given = name

        def decorate(fn: Callable[[Any], Any]) -> Task[Any]:
            return self._register(given, fn, declared, batching, aliases, version)

        return decorate

    def _register(
        self, name: str | None, fn: Callable[[Any], Any], declared: dict[str, Any],
        batching: tuple[int | None, float | None] = (None, None), aliases: Sequence[str] = (),
        version: int | None = None,
    ) -> Task[Any]:  # fmt: skip
        migrations: dict[int, Migration] = {}
        if isinstance(fn, Task):  # a task object registered again (here, or in another app):
            name = name or fn.name  # its name and options, unless given anew
            if all(v is None for v in (*declared.values(), *batching, version)):
                declared = {**declared, **fn.options.declared}
                batching = (fn.batch, fn.batch_wait if fn.batch is not None else None)
                version, migrations = fn.version, dict(fn.migrations)
            fn = fn.fn
        name = name or str(getattr(fn, "__name__", ""))
        if isinstance(aliases, str):
            raise ValueError(f"@app.task({name!r}): aliases is a list of names, not a string")
        names = list(dict.fromkeys([name, *aliases]))
        for each in names:
            if each.startswith(RESERVED):
                raise ValueError(f"task names starting with {RESERVED!r} are leasekeeper's "
                                 f"own (got {each!r})")  # fmt: skip
        options = declare(name, **declared)
        level = 1 if version is None else check_version(version, f"@app.task({name!r}): version")
        for alias in names[1:]:
            try:
                check_name(alias, f"@app.task({name!r})'s alias")
            except InvalidPayload as exc:
                raise ValueError(str(exc)) from None
        for each in names:
            if each in self.handlers and self.handlers[each] is not fn:
                raise ValueError(f"task {each!r} is registered twice")
        if never := unfit({name: (options.limits or (), options.tokens)}, self.limits):
            raise ValueError(f"@app.task({name!r}): {never[0]}")  # B12: it would wait for ever
        size, wait = batching
        if size is not None:
            task: Task[Any] = Task(name, fn, options, *check_batch(name, size, wait, fn),
                                   version=level)  # fmt: skip
        elif wait is not None:
            raise ValueError(f"@app.task({name!r}): batch_wait is for a batch step (batch=...)")
        else:
            task = Task(name, fn, options, version=level)
        task.migrations.update(migrations)
        for each in names:  # an alias serves its runs with the task's handler and options
            self.handlers[each] = fn
            self.tasks[each] = task
        for each in names:  # migrations declared above their task (B25)
            if each in self._pending_migrations:
                self._attach(each)
        return task

    def migrate(self, task: str, *, from_version: int) -> Callable[[Migration], Migration]:
        """Declare how runs of ``task`` (its name or an alias) at ``from_version`` move to
        the next version (B25): ``fn(state) -> new_state``, a plain function of the run's JSON
        state. A run at an older version is upgraded once, when a worker next claims it, by
        the chain of migrations from its version to the task's, written under the lease's fence
        before the handler begins; a migration that raises fails the task like its handler
        would. The chain must have no gap up to the task's version (checked when a worker
        loads the app, ``check_versions``)."""
        check_version(from_version, f"@app.migrate({task!r}): from_version")

        def decorate(fn: Migration) -> Migration:
            if not callable(fn):
                raise ValueError(f"@app.migrate({task!r}) decorates a function of the state")
            held = self._pending_migrations.setdefault(task, {})
            if from_version in held and held[from_version] is not fn:
                raise ValueError(f"@app.migrate({task!r}, from_version={from_version}) is "
                                 "declared twice")  # fmt: skip
            held[from_version] = fn
            if task in self.tasks:
                self._attach(task)
            return fn

        return decorate

    def _attach(self, name: str) -> None:
        """The migrations declared for ``name`` go to its task, checked against its version."""
        task = self.tasks[name]
        for start, fn in self._pending_migrations.pop(name, {}).items():
            if start >= task.version:
                raise ValueError(f"@app.migrate({name!r}, from_version={start}): task {name!r} "
                                 f"is at version {task.version}; a migration goes from a "
                                 "lower one")  # fmt: skip
            if task.migrations.get(start, fn) is not fn:
                raise ValueError(f"@app.migrate({name!r}, from_version={start}) is declared "
                                 "twice")  # fmt: skip
            task.migrations[start] = fn

    def check_versions(self) -> dict[str, tuple[int, int]]:
        """Every task's versions served, by name: (the lowest its migrations reach, its
        version). ``ValueError`` for a migration of a task the app does not register, one
        from its version or above, or a gap in a chain (what a worker checks at load)."""
        for name in list(self._pending_migrations):
            if name not in self.tasks:
                raise ValueError(f"@app.migrate({name!r}): the app registers no task {name!r}")
            self._attach(name)
        return {name: (floor(task), task.version) for name, task in self.tasks.items()}

    def served_tasks(self) -> tuple[str, ...]:
        """What a worker of this app claims (B22, B25): its tasks and their aliases (their
        unversioned runs), ``name@v`` for each version its tasks serve, and the delivery task
        every worker has built in."""
        self.check_versions()
        return served(self.tasks, (DELIVERY_TASK,))

    def _reservations(self) -> dict[str, tuple[tuple[str, ...], int | None]]:
        """Each task's limits and token reservation, by name."""
        return {name: (task.options.limits or (), task.options.tokens)
                for name, task in self.tasks.items()}  # fmt: skip

    def task_options(self) -> dict[str, TaskOptions]:
        """Every task's declared options, by name (what a worker writes to the database)."""
        return {name: task.options for name, task in self.tasks.items()}

    # -- worker lifecycle hooks --------------------------------------------------------------
    def on_worker_start(self, fn: H) -> H:
        """Run ``fn`` in each worker process once it has started (after the fork), before it
        claims its first task: where a worker creates what its handlers share (an HTTP client,
        a model client, a database pool). An ``async def`` hook runs on the event loop that
        runs the ``async def`` handlers, so what it creates is bound to that loop. A hook that
        raises stops the worker before it claims anything (it exits 3 and the supervisor
        stops: a pool that cannot set up must not run). Hooks run in registration order."""
        self.worker_start.append(fn)
        return fn

    def on_worker_stop(self, fn: H) -> H:
        """Run ``fn`` in each worker process as it stops, after its last task (drain, recycle,
        a graceful stop; never after SIGKILL): close what the start hooks opened. Stop hooks
        run in reverse registration order; one that raises is logged and the others still
        run."""
        self.worker_stop.append(fn)
        return fn

    # -- the test mode -------------------------------------------------------------------------
    def run_inline(
        self,
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
        clock: Literal["virtual", "real"] | None = None,
    ) -> Run:
        """Run ``task`` in this process, through every step of its run (or ``steps`` of them),
        against a temporary SQLite store (or ``store``), and return the run as it ended:
        ``run.status``, ``run.state``, ``run.result``. ``signals``: ``{name: payload}`` sent
        to the run (its ``wait_for`` resumes with them); ``clock="virtual"``: delays, backoffs,
        ``RetryAfter`` and wait timeouts pass at once. See ``workerproc.testing``."""
        from .testing import run_inline  # noqa: PLC0415 - the test mode, only when used

        return run_inline(
            self, task, payload, state=state, steps=steps, store=store,
            raise_errors=raise_errors, hooks=hooks, max_attempts=max_attempts,
            signals=signals, clock=clock,
        )  # fmt: skip
