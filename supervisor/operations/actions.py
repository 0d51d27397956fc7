"""What the operator commands do to the store, free of click: open it (never creating it for a
read), enqueue, retry, cancel, prune, and the rows ``status`` and the dashboard show of the
workers. The operator commands (``supervisor.commands``) and the dashboard's actions call these."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from workerproc.identity import parse_owner
from workerproc.loading import load_app
from workerproc.store import (
    Inspector,
    InvalidPayload,
    Operator,
    Producer,
    RunNotFound,
    RunOver,
    Store,
    StoreError,
    TaskOptions,
    codec,
    open_store,
    resolve,
)
from workerproc.store.calls import MAX_RESULT, Resolved
from workerproc.store.codec import MAX_STATE, check_run_options, check_traceparent
from workerproc.store.types import JSON, AttemptEnd, Run, TaskInfo, WorkerInfo

from ..errors import ConfigError, SupervisorError
from ..loop.storegate import db_file
from . import render
from .render import run_status


def parse_json(text: str, what: str, limit: int = MAX_STATE) -> JSON:
    """A user's JSON: strict (no NaN), within the store's size and depth limits, or exit 2."""
    try:
        return codec.parse(text, what, limit)
    except InvalidPayload as exc:
        raise ConfigError(str(exc)) from None


@contextlib.contextmanager
def store_for(db: str, *, create: bool = False) -> Iterator[Store]:
    """Open the store; reading commands refuse to create a missing database file (or, on
    PostgreSQL, a missing schema). A bad address or option is refused first (exit 2)."""
    resolve(db)
    path = db_file(db)
    if not create and path is not None and not os.path.exists(path):
        raise SupervisorError(f"database {path} does not exist")
    store = open_store(db) if path is not None else open_store(db, migrate=create)
    try:
        yield store
    finally:
        with contextlib.suppress(StoreError):
            store.close()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_MIN, DURATION_MAX = 1.0, 3650 * 86400.0  # one second .. ten years
PRUNE_BATCH_MAX = 10_000


def parse_duration(text: str, what: str, *, bare_seconds: bool = False) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` -> seconds, within range. The unit is required
    unless ``bare_seconds`` (``spend --since 3600``, a read): a bare ``1`` could mean a second
    or a day, and a prune deletes what it matched."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if match is None or not (match.group(2) or bare_seconds):
        unit = " (a unit is required)" if match is not None else ""
        shapes = "3600, 90m, 24h, 7d or 2w" if bare_seconds else "90s, 30m, 12h, 7d or 2w"
        raise ConfigError(f"{what} must look like {shapes}{unit} (got {text!r})")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not DURATION_MIN <= seconds <= DURATION_MAX:
        raise ConfigError(f"{what} must be between 1s and 3650d (got {text!r})")
    return seconds


def prune(store: Operator, older_than: float, batch: int, force: bool = False) -> int:
    if not 1 <= batch <= PRUNE_BATCH_MAX:
        raise ConfigError(f"--batch must be between 1 and {PRUNE_BATCH_MAX}")
    return store.prune(older_than, batch=batch, force=force)


def declared_task(app_spec: str, task: str) -> tuple[TaskOptions, int]:
    """``task``'s declared options and its version (B25) in the app ``app_spec`` names
    (imported here, as ``start`` would); refused when the app has no such task (AppLoadError
    when it cannot be imported)."""
    app = load_app(app_spec)
    found = app.tasks.get(task)
    if found is None:
        names = ", ".join(sorted(app.tasks)[:20]) or "none"
        raise ConfigError(f"{app_spec} has no task {task!r} (its tasks: {names})")
    return found.options, found.version


def enqueue(
    store: Producer,
    task: str,
    payload: JSON,
    state: JSON,
    delay: float,
    *,
    key: str | None = None,
    queue: str = "default",
    priority: int = 0,
    traceparent: str | None = None,
    debounce: float | None = None,
    version: int | None = None,
) -> int:
    try:
        check_run_options(queue, priority, key)
        traceparent = None if traceparent is None else check_traceparent(traceparent)
        if debounce is not None and key is None:
            raise InvalidPayload("--debounce needs --key: the starts with one key make one run")
    except InvalidPayload as exc:
        raise ConfigError(str(exc)) from None
    return store.start_run(task, payload, state, delay, key=key, queue=queue, priority=priority,
                           traceparent=traceparent, debounce=debounce,
                           version=version)  # fmt: skip


# Attempts that reached a handler and ended without a commit (an exhausted claim never ran one)
RAN = frozenset({"released", "failed", "taken_over"})


def executions(task: TaskInfo, history: Sequence[AttemptEnd]) -> int:
    """How many times ``task`` was handed to a handler: its attempts that ended without a
    commit (released, failed, taken over), the one that committed, and the one holding its
    lease now. Its ``attempts`` counts claims (the fencing token): also the claim that found
    the attempt budget spent (R6), a prefetched lease handed back unstarted and one that lapsed
    before its handler began (``unstarted`` in the history, B3)."""
    ended = sum(1 for a in history if a.task_id == task.id and a.outcome in RAN)
    return ended + (task.done_attempt is not None) + (task.lease_owner is not None)


def with_waits(store: Inspector, runs: list[Run]) -> list[Run]:
    """``runs`` as operators see them: a pending run due now that no live worker would claim
    (none serves its queue and its next task, B22) reads as waiting, for "no worker serves
    task X" (``runs``, ``show`` and the dashboard say it alike)."""
    why = store.unserved([run.id for run in runs if run.status == "pending"])
    return [dataclasses.replace(run, status="waiting", waiting_for=why[run.id])
            if run.id in why else run for run in runs]  # fmt: skip


def get_run(store: Inspector, run_id: int) -> dict[str, Any]:
    """A run and its tasks, each with its executions and its claims (``show``)."""
    found = store.get_run(run_id)
    if found is None:
        raise RunNotFound(run_id)
    (run,) = with_waits(store, [found])
    history = store.attempt_history(run_id)
    tasks = [
        {"step": step, **dataclasses.asdict(t), "executions": executions(t, history),
         "claims": t.attempts}
        for step, t in enumerate(store.get_tasks(run_id), 1)  # (a fork's --from STEP)
    ]  # fmt: skip
    return {"run": run, "tasks": tasks, "calls": store.paid_calls(run_id),
            "signals": store.run_signals(run_id), "batches": batches(store, run_id)}  # fmt: skip


def batches(store: Inspector, run_id: int) -> list[dict[str, Any]]:
    """Which batch call (its id and size) each of the run's batched steps went in, per attempt
    (the outbox's ``step.batched`` events, B23)."""
    found = store.events(after=0, limit=1000, run=run_id, system=True)
    return [{"task_id": e.data.get("task_id"), "task": e.task, "attempt": e.attempt,
             "batch": e.data.get("batch"), "items": e.data.get("items"), "at": e.at}
            for e in found if e.kind == "step.batched"]  # fmt: skip


def retry(store: Operator, run_id: int) -> float:
    """Retry one run; returns in how many seconds its new generation begins: 0 unless a
    cancelled handler's lease was still live (B2: the run waits for that lease's end)."""
    if store.retry_run(run_id):
        due = [t.available_at for t in store.get_tasks(run_id) if t.done_at is None]
        return max(0.0, min(due, default=0.0) - store.now())
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFound(run_id)
    if run.status in ("failed", "cancelled"):
        raise SupervisorError(f"{run_status(run_id, run.status)} but has no task left to retry")
    raise SupervisorError(
        f"{run_status(run_id, run.status)}: only failed or cancelled runs can be retried"
    )


def cancel(store: Operator, run_id: int) -> None:
    if store.cancel_run(run_id):
        return
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFound(run_id)
    ended = "was already cancelled" if run.status == "cancelled" else f"already {run.status}"
    raise SupervisorError(f"run {run_id} {ended}")


def resolve_call(
    store: Operator, run_id: int, name: str, answer: str | None, pay_again: bool, what: str
) -> tuple[Resolved, bool]:
    """An operator's word on RUN's call NAME whose outcome is unknown (``supervisor resolve``,
    the dashboard's Resolve form): ``answer`` (JSON text, ``what`` names it in an error) kept
    as if the call had returned it, or ``pay_again``; exactly one of the two. Returns what
    ``resolve`` did and whether the call has a kept answer now (its next attempt reuses it)."""
    if (answer is None) == (not pay_again):
        raise ConfigError(f"give {what} or pay again, one of the two")
    try:
        if pay_again:
            done = store.resolve(run_id, name, pay_again=True)
        else:
            done = store.resolve(run_id, name, answer=parse_json(answer or "", what, MAX_RESULT))
    except RunOver as exc:  # its own words are a signal's
        raise SupervisorError(
            f"{run_status(run_id, exc.status)}: a run that is over has no call to resolve"
        ) from None
    made = [i for i in store.call_timeline(run_id) if i.name == name]
    newest = (made[-1].task_id, made[-1].request_hash) if made else None
    answered = any((c.task_id, c.request_hash) == newest and c.kept
                   for c in store.paid_calls(run_id) if c.name == name)  # fmt: skip
    return done, answered


def resolved_line(run_id: int, name: str, done: Resolved, answered: bool) -> str:
    """What ``resolve`` did, in one line."""
    if done.kept:
        what = f"answer kept for call {name!r}"
    elif answered:
        what = (f"an answer was kept already for call {name!r}: the first kept answer wins, "
                "and its next attempt reuses it")  # fmt: skip
    else:
        what = f"call {name!r} is paid again by its next attempt"
    settled = render.plural(done.settled, "intent") + " without an answer settled"
    goes = "the run goes on now" if done.resumed else "the run was not parked on this call"
    return f"run {run_id}: {what}; {settled}; {goes}"


def pool_lines(pool: list[WorkerInfo], now: float) -> str:
    """The worker processes of every host, as the database lists them (``status``)."""
    if not pool:
        return "no worker process is listed in the database"
    alive = [w for w in pool if w.alive]
    hosts = len({w.host for w in alive})
    head = (
        f"{render.plural(len(alive), 'worker process', 'worker processes')} alive on "
        f"{render.plural(hosts, 'host')}, {render.plural(sum(w.slots for w in alive), 'slot')}"
    )
    rows = [
        [w.host, w.pid, w.state if w.alive else "silent", render.plural(w.slots, "slot"),
         ",".join(w.queues) if w.queues else "(all)", w.version,
         render.relative(w.heartbeat_at, now)]
        for w in pool
    ]  # fmt: skip
    table = render.table(["host", "pid", "state", "slots", "queues", "version", "last beat"],
                         rows)  # fmt: skip
    return f"{head}\n{table}"


def worker_rows(state: dict[str, Any] | None, store_stats: Any) -> list[dict[str, Any]]:
    """Workers from the supervisor's state file, joined with RSS and their live leases (with
    slots, a worker holds several: the row shows how many, and the soonest to expire)."""
    import psutil  # noqa: PLC0415 - at first use: only status reads the workers' memory

    leases: dict[str, list[Any]] = {}
    for lease in store_stats.leases:
        if parse_owner(lease.owner) is not None and lease.expires_at > store_stats.now:
            leases.setdefault(lease.owner, []).append(lease)
    capacity = (state or {}).get("concurrency") or 1
    rows = []
    for w in (state or {}).get("workers", []):
        try:
            rss_mb: float | None = psutil.Process(w["pid"]).memory_info().rss / 1048576
        except psutil.Error:
            rss_mb = None
        held = sorted(leases.get(w.get("owner", ""), []), key=lambda lease: lease.expires_at)
        first = held[0] if held else None
        rows.append(
            {
                "pid": w["pid"],
                "index": w.get("index"),
                "phase": f"retiring ({w['retiring']})" if w.get("retiring") else w.get("phase"),
                "busy": w.get("busy", 0),
                "slots": capacity,
                "leases": len(held),
                "rss_mb": None if rss_mb is None else round(rss_mb, 1),
                "task_id": first.task_id if first else w.get("task_id"),
                "run_id": first.run_id if first else None,
                "attempt": first.attempt if first else w.get("attempt"),
                "lease_expires_at": first.expires_at if first else None,
                "owner": w.get("owner"),
            }
        )
    return rows
