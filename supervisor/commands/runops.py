"""Operators' writes to runs: ``retry`` and ``cancel``, of one run (RUN) or of every run a
filter matches (``--status``, ``--task``, ``--queue``, ``--since``; ``--all`` for no filter),
the store's bulk writes doing a thousand runs per transaction; ``fork``: a new run from a step
of one run (docs/protocol.md B24)."""

from __future__ import annotations

from typing import TypeGuard

import click

from workerproc.store.protocol.bulk import LIVE, RETRYABLE
from workerproc.store.protocol.forks import MAX_STEP

from ..errors import ConfigError
from ..operations import actions, render
from .clickutil import RUN_ID, Name, Number, db_option, option


def _filters(fn: click.decorators.FC) -> click.decorators.FC:
    """The filter of a bulk write (each optional; together: runs that match all of them)."""
    for decorate in reversed([
        option("--task", type=Name("task name"), default=None, metavar="TASK",
               help="only runs of this task (the run's first task, as runs shows it)"),
        option("--queue", default=None, metavar="NAME", help="only runs of this queue"),
        option("--all", "every", is_flag=True,
               help="without RUN or a filter: every run the command can change"),
    ]):  # fmt: skip
        fn = decorate(fn)
    return fn


def _single(
    run: int | None, filters: tuple[object, ...], every: bool, command: str
) -> TypeGuard[int]:
    """Whether the call names one run (RUN), not a filter; refuses RUN with a filter, and
    neither of them."""
    filtered = every or any(x is not None for x in filters)
    if run is not None and filtered:
        raise ConfigError(f"{command}: give RUN or a filter, not both")
    if run is None and not filtered:
        raise ConfigError(
            f"{command}: give RUN, or a filter (--status, --task, --queue, --since), or --all"
        )
    return run is not None


@click.command()
@click.argument("run", type=RUN_ID, required=False)  # (shown as [RUN])
@db_option
@option("--status", type=click.Choice(RETRYABLE), default=None,
        help="without RUN: runs that ended so (default: failed)")  # fmt: skip
@option("--since", default=None, metavar="DURATION",
        help="without RUN: runs that ended within the last DURATION (e.g. 1h, 7d)")  # fmt: skip
@_filters
def retry(
    run: int | None, db: str, status: str | None, since: str | None, task: str | None,
    queue: str | None, every: bool,
) -> None:  # fmt: skip
    """Queue a failed or cancelled run again (its attempts start over); without RUN, every
    failed (or --status cancelled) run the filter matches."""
    if _single(run, (status, since, task, queue), every, "retry"):
        with actions.store_for(db) as store:
            wait = actions.retry(store, run)
        if wait >= 1:  # (B2: a cancelled handler's lease was still live)
            click.echo(f"run {run} queued again: it begins in {wait:.0f} s, when the lease its "
                       "cancelled handler held runs out")  # fmt: skip
        else:
            click.echo(f"run {run} queued again")
        return
    seconds = None if since is None else actions.parse_duration(since, "--since")
    with actions.store_for(db) as store:
        count = store.retry_many(status or "failed", task, seconds, queue=queue)
    click.echo(f"{render.plural(count, 'run')} queued again")


@click.command()
@click.argument("run", type=RUN_ID, required=False)  # (shown as [RUN])
@db_option
@option("--status", type=click.Choice(LIVE), default=None,
        help="without RUN: only runs in this state (default: any live run)")  # fmt: skip
@option("--since", default=None, metavar="DURATION",
        help="without RUN: runs started within the last DURATION (e.g. 10m, 1h)")  # fmt: skip
@_filters
def cancel(
    run: int | None, db: str, status: str | None, since: str | None, task: str | None,
    queue: str | None, every: bool,
) -> None:  # fmt: skip
    """Cancel a run that has not finished; a handler running it is stopped within a heartbeat.
    Without RUN, every live run the filter matches (--all: every live run)."""
    if _single(run, (status, since, task, queue), every, "cancel"):
        with actions.store_for(db) as store:
            actions.cancel(store, run)
        click.echo(f"run {run} cancelled")
        return
    seconds = None if since is None else actions.parse_duration(since, "--since")
    with actions.store_for(db) as store:
        count = store.cancel_many(task, status, seconds, queue=queue, every=every)
    click.echo(f"{render.plural(count, 'run')} cancelled")


@click.command()
@click.argument("run", type=RUN_ID)
@db_option
@option(
    "--from",
    "from_step",
    type=Number(int, 1, MAX_STEP),
    required=True,
    metavar="STEP",
    help="the step to begin at: 1 is the run's first task, 2 the task it advanced to, ...",
)
@option(
    "--state",
    "state_json",
    default=None,
    metavar="JSON",
    help="the new run's state (default: the state RUN had when it entered STEP)",
)
def fork(run: int, db: str, from_step: int, state_json: str | None) -> None:
    """Start a new run from step STEP of run RUN and print its id: it runs STEP's task (its
    payload) and what follows, from the state RUN had when it entered STEP (or --state). RUN
    is left as it is; the steps before STEP do not run again, and the new run's steps pay
    anew for their paid calls."""
    state = None
    if state_json is not None:
        state = actions.parse_json(state_json, "--state")
        if state is None:
            raise ConfigError("--state null: leave --state out to keep the state RUN entered "
                              "STEP with")  # fmt: skip
    with actions.store_for(db) as store:
        click.echo(store.fork(run, from_step, state))


ALL = [retry, cancel, fork]
