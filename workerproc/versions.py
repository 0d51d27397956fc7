"""Task versions and state migrations (B25): ``@app.task(version=2)`` and
``@app.migrate("task", from_version=1)``.

A task row records the version of the task its run's state was written for (``tasks.version``:
``Task.start`` records the task's version; a producer without the app records none, an
*unversioned* task, which every version of the task serves as it is). A worker serves a task
at the versions its migrations reach: ``floor`` (the lowest ``from_version``, or the version
itself without migrations) up to its version. Its claims ask for those only (``served``: the
names, for unversioned tasks, and ``name@v`` for each version), so an old worker of a rolling
deploy never takes a run a newer release has moved on. A claimed task at an older version is
upgraded before its handler begins: the chain of migrations runs on its state, and the new state
and version are written under the lease's fence (``Store.migrate_state``), once per run: a
later attempt reads the new version and migrates nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .store import CasResult, Lease
from .store.codec import MAX_VERSION
from .store.types import JSON

if TYPE_CHECKING:
    from .execution import Execution
    from .once import CallBook
    from .tasks import Task

SEP = "@"  # a served entry: "name@version" (a version is a number: the last "@" splits it)
Migration = Callable[[JSON], JSON]


def check_version(value: object, what: str) -> int:
    """A task version: a whole number from 1 to ``MAX_VERSION``; ``ValueError`` says so."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
        raise ValueError(f"{what} must be a whole number from 1 to {MAX_VERSION:,} "
                         f"(got {value!r})")  # fmt: skip
    return value


def floor(task: Task[Any]) -> int:
    """The lowest version ``task`` serves: where its chain of migrations begins. A chain with
    a gap, or a migration from the task's own version or above, is a ``ValueError``."""
    froms = sorted(task.migrations)
    if froms and task.batch is not None:
        raise ValueError(f"@app.migrate({task.name!r}): a batch step's runs are not migrated "
                         "(its items share one call); give it a new task name instead")  # fmt: skip
    for start in froms:
        if start >= task.version:
            raise ValueError(f"@app.migrate({task.name!r}, from_version={start}): the task "
                             f"is at version {task.version}; a migration goes from a lower "
                             "one")  # fmt: skip
    if not froms:
        return task.version
    missing = sorted(set(range(froms[0], task.version)) - set(froms))
    if missing:
        gap = missing[0]
        raise ValueError(f"task {task.name!r} (version {task.version}) migrates from version "
                         f"{froms[0]} but has no migration from version {gap}: declare "
                         f"@app.migrate({task.name!r}, from_version={gap})")  # fmt: skip
    return froms[0]


def served(tasks: Mapping[str, Task[Any]], builtin: Iterable[str] = ()) -> tuple[str, ...]:
    """What a worker with ``tasks`` (name or alias -> task) claims: each name (its unversioned
    runs) and ``name@v`` for every version it serves; ``builtin``: names served unversioned."""
    out = set(builtin)
    for name, task in tasks.items():
        out.add(name)
        out.update(f"{name}{SEP}{v}" for v in range(floor(task), task.version + 1))
    return tuple(sorted(out))


def plan(lease: Lease, tasks: Mapping[str, Task[Any]]) -> tuple[int, JSON] | None:
    """The version and state ``lease``'s run moves to before its handler begins (None: none:
    unversioned, or at the task's version already). Runs the migrations (the user's code: what
    they raise fails the task as a handler's error would)."""
    task = tasks.get(lease.task)
    if task is None or lease.version is None or lease.version >= task.version:
        return None
    state = lease.state
    for start in range(lease.version, task.version):
        step = task.migrations.get(start)
        if step is None:  # below the chain: the claim never asks for it (``served``)
            raise MigrationMissing(f"task {lease.task!r} has no migration from version {start}")
        state = step(state)
    return task.version, state


class MigrationMissing(Exception):
    """A run at a version the worker's chain does not reach (never claimed by ``served``)."""


class MigrationRefused(Exception):
    """The migration's write changed nothing although the lease was live: the run's revision
    moved under it. The task goes back as after any error."""


def upgraded(lease: Lease, version: int, state: JSON, result: CasResult) -> Lease:
    """The lease the handler runs with once its migration was written (``result`` ok): the
    new state, at the next revision and the new version."""
    if result is CasResult.LEASE_LOST:
        from .context import LeaseLost  # noqa: PLC0415 - context imports the store first

        raise LeaseLost()
    if result is not CasResult.OK:
        raise MigrationRefused(f"the migration of run {lease.run_id} to version {version} was "
                               "refused: its revision moved")  # fmt: skip
    return dataclasses.replace(lease, state=state, revision=lease.revision + 1, version=version)


def upgrade(ex: Execution) -> None:
    """B25: before ``ex``'s handler begins (on the thread about to call it), its run's state is
    migrated to its task's version and written under the lease's fence, if it is older. What a
    migration raises is the handler's error; a refused write is a lost lease."""
    step = plan(ex.lease, ex.tasks)
    if step is None:
        return
    version, state = step
    lease = ex.lease
    calls = _calls(ex)
    future = calls.call(lambda store: store.migrate_state(lease, version, state))
    _upgraded(ex, version, state, future.result(_bound(lease)))


async def upgrade_async(ex: Execution) -> None:
    """``upgrade`` for an ``async def`` handler, on its loop: the write on the calls' threads."""
    import asyncio  # noqa: PLC0415 - on the loop: imported already

    step = plan(ex.lease, ex.tasks)
    if step is None:
        return
    version, state = step
    lease = ex.lease
    future = _calls(ex).submit(lambda store: store.migrate_state(lease, version, state))
    async with asyncio.timeout(_bound(lease)):  # (wait_for may swallow a cancellation on 3.11)
        result = await asyncio.wrap_future(future)
    _upgraded(ex, version, state, result)


def _calls(ex: Execution) -> CallBook:
    if ex.calls is None:
        raise MigrationRefused("this worker has no store to write a migration with")
    return ex.calls


def _bound(lease: Lease) -> float:
    """How long a migration's write may take: the lease's ttl (then it is lost anyway)."""
    return max(1.0, lease.expires_at - lease.claimed_at)


def _upgraded(ex: Execution, version: int, state: JSON, result: CasResult) -> None:
    ex.lease = upgraded(ex.lease, version, state, result)
    ex.ctx._lease = ex.lease
