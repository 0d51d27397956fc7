"""Operator commands on the database: enqueue, status, runs, show, retry, cancel, check, prune."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from workerproc.options import DAY
from workerproc.store import RunNotFound, StoreCorrupt, redact_url
from workerproc.store.codec import MAX_PAYLOAD, RESERVED
from workerproc.store.types import RUN_STATUSES

from .. import exitcodes
from ..errors import ConfigError, NotRunning, SupervisorError
from ..loop.pidfile import live_pid, read_state
from ..loop.storegate import db_file
from ..operations import actions, render
from .calls import calls_table
from .clickutil import RUN_ID, Name, Number, db_option, json_option, option

ENQUEUE_QUEUE = "SUPERVISOR_ENQUEUE_QUEUE"
RETIRED_QUEUE = "SUPERVISOR_QUEUE"


@click.command()
@click.argument("task", type=Name("task name"))
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
@option("--key", default=None, metavar="KEY", help="idempotency key: a run with it already "
        "there is the answer, nothing new is started")  # fmt: skip
@option("--debounce", type=Number(float, 0.001, 365 * DAY), default=None, metavar="S",
        help="with --key: the key's run not begun yet takes this payload and starts S seconds "
        "from now; one begun already: a new run")  # fmt: skip
@option(
    "--queue",
    envvar=ENQUEUE_QUEUE,
    default=None,
    metavar="NAME",
    help="the run's queue (default: the one TASK declares with --app, else 'default')",
)
@option(
    "--priority",
    type=Number(int, -1000, 1000),
    default=None,
    metavar="N",
    help="higher is claimed first within the queues a worker serves (default: the one TASK "
    "declares with --app, else 0)",
)
@option(
    "--app",
    "app_spec",
    default=None,
    metavar="MODULE:ATTR",
    help="the workerproc.App that runs TASK: a name it lacks is refused, and TASK's declared "
    "queue, priority and version apply",
)
@option(
    "--traceparent",
    envvar="TRACEPARENT",
    default=None,
    metavar="TRACEPARENT",
    help="the W3C trace context the run's steps continue (with the otel extra): "
    "00-<trace id>-<span id>-<flags>, as a traced script or a CI job passes it in TRACEPARENT",
)
def enqueue(
    task: str,
    db: str,
    payload: str,
    state_json: str,
    delay: float,
    key: str | None,
    debounce: float | None,
    queue: str | None,
    priority: int | None,
    app_spec: str | None,
    traceparent: str | None,
) -> None:
    """Start a run whose first task is TASK; print its id."""
    if RETIRED_QUEUE in os.environ:  # renamed: beside start's SUPERVISOR_QUEUES it misled
        raise ConfigError(
            f"{RETIRED_QUEUE} is no longer read: enqueue's queue is --queue or {ENQUEUE_QUEUE} "
            "(SUPERVISOR_QUEUES is the list of queues start serves)"
        )
    version = None  # without the app: an unversioned run (B25)
    if app_spec is not None:  # before anything is parsed or created: a typo fails here
        declared, version = actions.declared_task(app_spec, task)
        queue = declared.queue if queue is None else queue
        priority = declared.priority if priority is None else priority
    data = actions.parse_json(payload, "--payload", MAX_PAYLOAD)
    state = actions.parse_json(state_json, "--state")
    path = db_file(db)
    new = path is not None and not os.path.lexists(path)
    with actions.store_for(db, create=True) as store:  # never beside a leftover -wal (the store)
        run_id = actions.enqueue(
            store, task, data, state, delay, key=key,
            queue="default" if queue is None else queue, priority=priority or 0,
            traceparent=traceparent, debounce=debounce, version=version,
        )  # fmt: skip
        click.echo(run_id)
    if new:  # never silently: a typo, or a pool's database that vanished, shows here
        click.echo(f"created a new database {path}", err=True)


@click.command()
@db_option
@option("--pidfile", envvar="SUPERVISOR_PIDFILE", default=None, metavar="FILE",
        help="also list the supervisor's workers")  # fmt: skip
@json_option
def status(db: str, pidfile: str | None, as_json: bool) -> None:
    """The worker processes every host lists in the database, this host's supervisor and its
    workers (pid, RSS, task, lease expiry), queue counts and runs by status."""
    with actions.store_for(db) as store:
        stats = store.stats()
        pool = store.workers()
    state, down = None, None
    if pidfile:
        try:
            live_pid(pidfile)
            state = read_state(pidfile)
        except NotRunning as exc:
            down = str(exc)  # a stale state file lists dead workers: show none
    workers = actions.worker_rows(state, stats)
    queue = {k: getattr(stats, k) for k in ("ready", "delayed", "leased", "expired")}
    if as_json:
        doc: dict[str, Any] = {"queue": queue, "runs": stats.runs, "workers": workers}
        doc["pool"] = pool
        doc["queues"] = stats.queues
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
    click.echo(actions.pool_lines(pool, stats.now) + "\n")
    if state is not None:
        click.echo(
            f"supervisor {state.get('pid')}: {state.get('phase')}, "
            f"{render.plural(len(workers), 'worker')} (target {state.get('target')})"
        )
        if line := render.reload_line(state.get("reload")):
            click.echo(line)
        rows = [
            [w["pid"], w["index"], w["phase"], f"{w['busy']}/{w['slots']}", w["leases"],
             w["rss_mb"], w["task_id"], w["run_id"], w["attempt"],
             render.relative(w["lease_expires_at"], stats.now)]
            for w in workers
        ]  # fmt: skip
        headers = ["pid", "index", "phase", "busy", "leases", "rss MB", "task", "run", "attempt",
                   "lease expires"]  # fmt: skip
        click.echo(render.table(headers, rows) + "\n")
    statuses = ("pending", "running", "waiting", "succeeded", "failed", "cancelled")
    rows = [
        [name, c.ready, c.delayed, c.leased, c.expired, *(c.runs.get(s, 0) for s in statuses)]
        for name, c in stats.queues.items()
    ]
    if len(rows) != 1:  # the totals, when there is more (or less) than one queue
        rows.append(["(all)", *queue.values(), *(stats.runs.get(s, 0) for s in statuses)])
    click.echo(render.table(["queue", *queue, *statuses], rows))
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
@option(
    "--status",
    "status_",
    type=click.Choice(RUN_STATUSES),
    default=None,
    help="only runs with this status",
)
@option("--queue", default=None, metavar="NAME", help="only runs of this queue")
@option(
    "--limit",
    type=Number(int, 1, 100_000),
    default=50,
    metavar="K",
    help="at most K runs, newest first",
)
@option("--all", "all_", is_flag=True,
        help="the system's own runs too (the webhooks' delivery runs)")  # fmt: skip
@json_option
def runs(
    db: str, status_: str | None, queue: str | None, limit: int, all_: bool, as_json: bool
) -> None:
    """List runs, newest first (the system's own runs, numbered apart, with --all or their
    queue named)."""
    system = all_ or (queue or "").startswith(RESERVED)
    with actions.store_for(db) as store:
        found = actions.with_waits(store, store.list_runs(status_, limit, queue=queue,
                                                          system=system))  # fmt: skip
    if as_json:
        click.echo(render.to_json(found))
        return
    rows = [
        [r.id, r.status, r.queue, r.priority, r.revision, render.when(r.updated_at),
         r.failure_reason or r.waiting_for, r.last_error]
        for r in found
    ]  # fmt: skip
    headers = ["id", "status", "queue", "prio", "rev", "updated", "reason", "last error"]
    click.echo(render.table(headers, rows))


WAIT_CODES = {
    "succeeded": exitcodes.OK,
    "failed": exitcodes.RUN_FAILED,
    "cancelled": exitcodes.RUN_CANCELLED,
}


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@db_option
@option(
    "--timeout",
    type=Number(float, 0.0, 365 * DAY),
    default=None,
    metavar="S",
    help="give up after S seconds (exit 14); default: wait as long as it takes",
)
@json_option
def wait(run_id: int, db: str, timeout: float | None, as_json: bool) -> int:
    """Wait until RUN ends; the exit code says how (0 succeeded, 12 failed, 13 cancelled, 14
    still running after --timeout, 15 no such run)."""
    with actions.store_for(db) as store:
        try:
            run = store.wait(run_id, timeout)
        except TimeoutError as exc:
            click.echo(f"supervisor: {exc}", err=True)
            return exitcodes.WAIT_TIMEOUT
        except RunNotFound as exc:
            click.echo(f"supervisor: error: {exc}", err=True)
            return exitcodes.RUN_UNKNOWN
    if as_json:
        click.echo(render.to_json(run))
    else:
        why = (
            f" ({run.failure_reason}: {render.short(run.last_error or '')})"
            if run.failure_reason
            else ""
        )
        click.echo(f"run {run.id} {run.status}{why}; result: {json.dumps(run.result)}")
    return WAIT_CODES[run.status]


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@db_option
@json_option
def show(run_id: int, db: str, as_json: bool) -> None:
    """One run: state, result, failure and its tasks (by step, as fork --from counts them): how
    many times each ran (executions) and was claimed (claims: also a claim that found the
    attempt budget spent), and its errors; its paid calls (ctx.once): how often each was
    made, paid again, left unknown and reused; and, for a batch step, which batch call (its id
    and size) each attempt went in. A task's version is the one its run's state was written
    for (B25; "-": unversioned)."""
    with actions.store_for(db) as store:
        data = actions.get_run(store, run_id)
        now = store.now()
    if as_json:
        click.echo(render.to_json(data))
        return
    run = data["run"]
    fields = [
        ("run", run.id), ("status", run.status), ("waits for", run.waiting_for),
        ("revision", run.revision),
        ("state", json.dumps(run.state)), ("result", json.dumps(run.result)),
        ("failure", run.failure_reason), ("last error", run.last_error),
        ("created", render.when(run.created_at)), ("updated", render.when(run.updated_at)),
        ("finished", render.when(run.finished_at)),
    ]  # fmt: skip
    for key, value in fields:
        if value is not None or key != "waits for":  # only a waiting run says what for
            click.echo(f"{key + ':':<12}{'-' if value is None else value}")
    rows = [
        [t["step"], t["id"], t["name"], t["executions"], t["claims"],
         render.when(t["done_at"]) or "no", t["lease_owner"],
         render.relative(t["lease_expires_at"], now), t["last_error"], t["version"]]
        for t in data["tasks"]
    ]  # fmt: skip
    headers = ["step", "task", "name", "executions", "claims", "done", "owner", "lease", "error",
               "version"]  # fmt: skip
    click.echo("\n" + render.table(headers, rows))
    if data["calls"]:  # ctx.once's calls: made, paid again, unknown, kept and reused
        click.echo("\npaid calls:\n" + calls_table(data["calls"]))
    if data["batches"]:  # the batch call each attempt of a batch step went in
        rows = [[b["task_id"], b["task"], b["attempt"], b["batch"], b["items"],
                 render.when(b["at"])] for b in data["batches"]]  # fmt: skip
        headers = ["task", "name", "attempt", "batch", "items", "at"]
        click.echo("\nbatches:\n" + render.table(headers, rows))
    if data["signals"]:  # newest first; "kept": no wait has taken it yet
        rows = [
            [
                x.id,
                x.name,
                render.short(json.dumps(x.payload)),
                render.when(x.sent_at),
                "kept" if x.task_id is None else f"task {x.task_id}",
            ]
            for x in data["signals"]
        ]
        click.echo("\n" + render.table(["signal", "name", "payload", "sent", "resumed"], rows))


@click.command()
@db_option
@option(
    "--quick",
    is_flag=True,
    help="a quicker check: SQLite's quick_check, or amcheck without its heap checks",
)
def check(db: str, quick: bool) -> None:
    """Check the database: the engine's own storage check, then the lease invariants; the
    limits' lines are recounted, and a line whose runs could wait for ever is reopened."""
    try:
        with actions.store_for(db) as store:
            name = store.integrity_check_name(quick)
            damage = store.check_integrity(quick=quick)
            violations = [] if damage else store.integrity_violations()
            repaired = [] if damage else store.repair_lines()
    except StoreCorrupt as exc:  # too damaged to open
        name, damage, violations = "quick_check" if quick else "integrity_check", [str(exc)], []
        repaired = []
    for line in damage + violations:
        click.echo(line)
    for line in repaired:
        click.echo(f"repaired: {line}")
    if damage:
        raise SupervisorError(
            f"{redact_url(db)} is corrupt ({name}: {len(damage)} problem(s) above): stop every "
            "pool on it and restore it from a backup"
        )
    if violations:
        raise SupervisorError(
            f"{redact_url(db)}: {len(violations)} lease invariant(s) violated (above)"
        )
    if name is None:
        click.echo("storage not checked: this database offers no check of its own storage "
                   "(PostgreSQL: a superuser runs CREATE EXTENSION amcheck)")  # fmt: skip
        click.echo("ok: the lease invariants hold")
        return
    click.echo(f"ok: {name} found no damage and the lease invariants hold")


@click.command()
@db_option
@option(
    "--older-than",
    required=True,
    metavar="DURATION",
    help="a number and its unit: s, m, h, d or w (e.g. 7d, 12h, 30m; 1s-3650d)",
)
@option("--batch", type=int, default=1000, metavar="K", help="runs deleted per transaction")
@option("--force", is_flag=True,
        help="also delete old events a named consumer has not acknowledged yet")  # fmt: skip
def prune(db: str, older_than: str, batch: int, force: bool) -> None:
    """Delete finished runs (and their tasks) that finished longer than DURATION ago, and
    events as old that every named consumer has acknowledged."""
    seconds = actions.parse_duration(older_than, "--older-than")
    with actions.store_for(db) as store:
        count = actions.prune(store, seconds, batch, force)
    click.echo(f"pruned {render.plural(count, 'finished run')} older than {older_than}")


@click.command()
@db_option
def migrate(db: str) -> None:
    """Create the database's schema, or bring it to this version (start and enqueue do it
    themselves; the reading commands never do)."""
    path = db_file(db)
    new = path is not None and not os.path.lexists(path)
    with actions.store_for(db, create=True) as store:
        click.echo(f"{redact_url(store.url)}: the schema is current")
    if new:
        click.echo(f"created a new database {path}", err=True)


ALL = [enqueue, status, runs, show, wait, check, prune, migrate]
