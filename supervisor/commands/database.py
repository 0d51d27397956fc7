"""Operator commands on the database: enqueue, status, runs, show, retry, cancel, check, prune."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from workerproc.config import DAY
from workerproc.store import RunNotFound, StoreCorrupt
from workerproc.store.codec import MAX_PAYLOAD

from ..errors import NotRunning, SupervisorError
from ..loop.pidfile import live_pid, read_state
from ..loop.storegate import db_file
from . import ops, render
from .clickutil import RUN_ID, Number, db_option, json_option, option


@click.command()
@click.argument("task")
@db_option
@option("--payload", default="null", metavar="JSON", help="the first task's payload (JSON)")
@option("--state", "state_json", default="{}", metavar="JSON", help="the run's initial state")
@option(
    "--delay",
    type=Number(float, 0, 365 * DAY),
    default=0.0,
    metavar="S",
    help="start no sooner than S seconds",
)
def enqueue(task: str, db: str, payload: str, state_json: str, delay: float) -> None:
    """Start a run whose first task is TASK; print its id."""
    data = ops.parse_json(payload, "--payload", MAX_PAYLOAD)
    state = ops.parse_json(state_json, "--state")
    path = db_file(db)
    new = path is not None and not os.path.lexists(path)
    with ops.store_for(db, create=True) as store:  # never beside a leftover -wal (the store)
        click.echo(ops.enqueue(store, task, data, state, delay))
    if new:  # never silently: a typo, or a pool's database that vanished, shows here
        click.echo(f"created a new database {path}", err=True)


@click.command()
@db_option
@option("--pidfile", default=None, metavar="FILE", help="also list the supervisor's workers")
@json_option
def status(db: str, pidfile: str | None, as_json: bool) -> None:
    """Workers (pid, RSS, task, lease expiry), queue counts and runs by status."""
    with ops.store_for(db) as store:
        stats = store.stats()
    state, down = None, None
    if pidfile:
        try:
            live_pid(pidfile)
            state = read_state(pidfile)
        except NotRunning as exc:
            down = str(exc)  # a stale state file lists dead workers: show none
    workers = ops.worker_rows(state, stats)
    queue = {k: getattr(stats, k) for k in ("ready", "delayed", "leased", "expired")}
    if as_json:
        doc: dict[str, Any] = {"queue": queue, "runs": stats.runs, "workers": workers}
        doc["supervisor"] = (
            None
            if state is None
            else {
                k: state.get(k) for k in ("pid", "phase", "target", "generation", "tick", "reload")
            }
        )
        click.echo(render.to_json(doc))
        return
    if down:
        click.echo(down + "\n")
    if state is not None:
        click.echo(
            f"supervisor {state.get('pid')}: {state.get('phase')}, "
            f"{len(workers)} workers (target {state.get('target')})"
        )
        if line := render.reload_line(state.get("reload")):
            click.echo(line)
        rows = [
            [w["pid"], w["slot"], w["phase"], w["rss_mb"], w["task_id"], w["run_id"],
             w["attempt"], render.relative(w["lease_expires_at"], stats.now)]
            for w in workers
        ]  # fmt: skip
        headers = ["pid", "slot", "phase", "rss MB", "task", "run", "attempt", "lease expires"]
        click.echo(render.table(headers, rows) + "\n")
    click.echo(render.table(list(queue), [list(queue.values())]) + "\n")
    statuses = ("pending", "running", "succeeded", "failed", "cancelled")
    click.echo(render.table(statuses, [[stats.runs.get(s, 0) for s in statuses]]))
    if stats.leases and state is None:
        click.echo("\nleases:")
        rows = [
            [lease.owner, lease.task_id, lease.run_id, lease.task, lease.attempt,
             render.relative(lease.expires_at, stats.now)]
            for lease in stats.leases
        ]  # fmt: skip
        click.echo(render.table(["owner", "task", "run", "name", "attempt", "expires"], rows))


@click.command()
@db_option
@option("--status", "status_", default=None, metavar="S", help="only runs with this status")
@option(
    "--limit",
    type=Number(int, 1, 100_000),
    default=50,
    metavar="K",
    help="at most K runs, newest first",
)
@json_option
def runs(db: str, status_: str | None, limit: int, as_json: bool) -> None:
    """List runs, newest first."""
    ops.check_status(status_)
    with ops.store_for(db) as store:
        found = store.list_runs(status_, limit)
    if as_json:
        click.echo(render.to_json(found))
        return
    rows = [
        [r.id, r.status, r.revision, render.when(r.updated_at), r.failure_reason, r.last_error]
        for r in found
    ]
    click.echo(render.table(["id", "status", "rev", "updated", "reason", "last error"], rows))


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@db_option
@json_option
def show(run_id: int, db: str, as_json: bool) -> None:
    """One run: state, result, failure and its tasks with attempts and errors."""
    with ops.store_for(db) as store:
        data = ops.get_run(store, run_id)
        now = store.now()
    if as_json:
        click.echo(render.to_json(data))
        return
    run = data["run"]
    fields = [
        ("run", run.id), ("status", run.status), ("revision", run.revision),
        ("state", json.dumps(run.state)), ("result", json.dumps(run.result)),
        ("failure", run.failure_reason), ("last error", run.last_error),
        ("created", render.when(run.created_at)), ("updated", render.when(run.updated_at)),
        ("finished", render.when(run.finished_at)),
    ]  # fmt: skip
    for key, value in fields:
        click.echo(f"{key + ':':<12}{'-' if value is None else value}")
    rows = [
        [t.id, t.name, t.attempts, render.when(t.done_at) or "no",
         t.lease_owner, render.relative(t.lease_expires_at, now), t.last_error]
        for t in data["tasks"]
    ]  # fmt: skip
    click.echo("\n" + render.table(["task", "name", "attempts", "done", "owner", "lease", "error"],
                                   rows))  # fmt: skip


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@db_option
def retry(run_id: int, db: str) -> None:
    """Queue a failed or cancelled run again (its attempts start over)."""
    with ops.store_for(db) as store:
        ops.retry(store, run_id)
    click.echo(f"run {run_id} queued again")


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@db_option
def cancel(run_id: int, db: str) -> None:
    """Cancel a run that has not finished; a worker holding its task drops it."""
    with ops.store_for(db) as store:
        if store.get_run(run_id) is None:
            raise RunNotFound(run_id)
        ops.cancel(store, run_id)
    click.echo(f"run {run_id} cancelled")


@click.command()
@db_option
@option(
    "--quick",
    is_flag=True,
    help="a quicker check: SQLite's quick_check, or amcheck without its heap checks",
)
def check(db: str, quick: bool) -> None:
    """Check the database: the engine's own storage check, then the lease invariants."""
    try:
        with ops.store_for(db) as store:
            name = store.integrity_check_name(quick)
            damage = store.check_integrity(quick=quick)
            violations = [] if damage else store.integrity_violations()
    except StoreCorrupt as exc:  # too damaged to open
        name, damage, violations = "quick_check" if quick else "integrity_check", [str(exc)], []
    for line in damage + violations:
        click.echo(line)
    if damage:
        raise SupervisorError(
            f"{db} is corrupt ({name}: {len(damage)} problem(s) above): stop every pool on it "
            "and restore it from a backup"
        )
    if violations:
        raise SupervisorError(f"{db}: {len(violations)} lease invariant(s) violated (above)")
    if name is None:
        click.echo("storage not checked: this database offers no check of its own storage "
                   "(PostgreSQL: a superuser runs CREATE EXTENSION amcheck)")  # fmt: skip
        click.echo("ok: the lease invariants hold")
        return
    click.echo(f"ok: {name} found no damage and the lease invariants hold")


@click.command()
@db_option
@option("--older-than", required=True, metavar="DURATION", help="e.g. 7d, 12h, 30m (1s-3650d)")
@option("--batch", type=int, default=1000, metavar="K", help="runs deleted per transaction")
def prune(db: str, older_than: str, batch: int) -> None:
    """Delete finished runs (and their tasks) that finished longer than DURATION ago."""
    seconds = ops.parse_duration(older_than, "--older-than")
    with ops.store_for(db) as store:
        count = ops.prune(store, seconds, batch)
    click.echo(f"pruned {count} finished run(s) older than {older_than}")


ALL = [enqueue, status, runs, show, retry, cancel, check, prune]
