"""The invariants read from the database after every step (docs/protocol.md, Invariants), and
the checks made where the ledger sees a moment happen (a handler starting, a payment, a
resumed wait, a join's claim). ``world.Link.judge_commits`` checks the writes and claims."""

from __future__ import annotations

from typing import Any

from workerproc.store import Lease, Store
from workerproc.store.sqlite.dialect import SQLiteDialect

from .handlers import LIMIT, SIGNAL, TASKS
from .world import Ledger, Payment, Violation

GATED = tuple(sorted(name for name, o in TASKS.items() if o.limits))
TERMINAL = ("succeeded", "failed", "cancelled")


def handler_starts(store: Store, ledger: Ledger, owner: str, lease: Lease, now: float) -> None:
    """No handler starts on a lease the database did not confirm: recorded as begun, still
    this attempt's, live."""
    fence = (lease.task_id, lease.attempt)
    task = store.get_task(lease.task_id)
    live = (task is not None and task.lease_owner == owner and task.attempts == lease.attempt
            and (task.lease_expires_at or 0.0) > now)  # fmt: skip
    if fence not in ledger.recorded or not live:
        why = "not recorded as begun" if fence not in ledger.recorded else "not live"
        raise Violation("no handler started on a lease not confirmed",
                        f"task {lease.task_id} attempt {lease.attempt} ({owner}) began on a "
                        f"lease {why}")  # fmt: skip
    if lease.signal is not None:
        resumed(ledger, lease)
    if lease.children is not None:
        joined(store, ledger, lease)


def resumed(ledger: Ledger, lease: Lease) -> None:
    """A signal resumes one wait, once: every lease carrying it is of one task."""
    assert lease.signal is not None
    payload = lease.signal.payload
    n = payload.get("sig") if isinstance(payload, dict) else None
    if (
        lease.signal.name != SIGNAL
        or not isinstance(n, int)
        or ledger.signals.get(n) != (lease.run_id)
    ):
        raise Violation("signals resume once",
                        f"task {lease.task_id} resumed with a signal never sent to run "
                        f"{lease.run_id}: {lease.signal}")  # fmt: skip
    was = ledger.resumed.setdefault(n, lease.task_id)
    if was != lease.task_id:
        raise Violation("signals resume once",
                        f"signal {n} to run {lease.run_id} resumed task {was} and then task "
                        f"{lease.task_id}")  # fmt: skip


def joined(store: Store, ledger: Ledger, lease: Lease) -> None:
    """A join runs with every child it spawned, each ended."""
    assert lease.children is not None
    want = ledger.spawned.get(lease.task_id)
    got = tuple(c.run_id for c in lease.children)
    open_ = [c.run_id for c in lease.children if c.status not in TERMINAL]
    if want is None or got != want or open_:
        raise Violation("a join runs once with every child",
                        f"join task {lease.task_id} of run {lease.run_id} got children {got}, "
                        f"spawned {want}, still running {open_}")  # fmt: skip


def payment(ledger: Ledger, key: tuple[int, int, str], new: Payment) -> None:
    """A kept answer is never paid again: no earlier payment of this call was kept, or
    handed to its handler, or dropped while its worker lived. This holds for a payer whose
    live lease a retry dropped (B2) too: the new generation begins only once that lease
    would have expired, and the payer calls only while its lease has time left."""
    for was in ledger.payments.get(key, []):
        if was.state in ("kept", "used", "dropped"):
            raise Violation("a kept answer is never paid again",
                            f"call {key}: paid by attempt {new.attempt} ({new.owner}) after "
                            f"attempt {was.attempt} ({was.owner}) paid and its answer was "
                            f"{was.state}")  # fmt: skip
    ledger.payments.setdefault(key, []).append(new)


def after_step(store: Store, ledger: Ledger, now: float, lines: bool) -> None:
    """The database's own numbers against a recount, and its outbox, after every step;
    ``lines``: also whether any line waits for ever (a write: after the steps that move
    lines from outside a worker's exchange, and at every round of the quiet end)."""
    limits(store, ledger, now, lines)
    events(store, ledger)


def limits(store: Store, ledger: Ledger, now: float, lines: bool) -> None:
    """A limit's slots in use equal the live leases of its tasks; no line waits for ever."""
    info = {i.name: i for i in store.limits(keys=0)}
    if LIMIT not in info:
        return
    live = sum(1 for (task_id, attempt), expiry in ledger.granted.items()
               if expiry > now and ledger.latest.get(task_id) == attempt
               and ledger.names.get(task_id) in GATED)  # fmt: skip
    if info[LIMIT].in_use != live:
        raise Violation("limit counters equal a recount",
                        f"limit {LIMIT!r} says {info[LIMIT].in_use} in use, the leases say "
                        f"{live}")  # fmt: skip
    repaired = store.repair_lines() if lines else []
    if repaired:
        raise Violation("limit counters equal a recount", "; ".join(repaired))


def events(store: Store, ledger: Ledger) -> None:
    """Events in commit order without gaps: what a reader sees after its cursor extends what
    it saw, one id after another."""
    after = ledger.events[-1] if ledger.events else 0
    gapless = isinstance(store.dialect, SQLiteDialect)  # PostgreSQL may skip a rolled-back id
    while True:
        batch = store.events(after=after, limit=500, system=True)
        if not batch:
            return
        for ev in batch:
            if ev.id <= after or (gapless and ev.id != after + 1):
                raise Violation("events in commit order without gaps",
                                f"event {ev.id} follows {after}")  # fmt: skip
            after = ev.id
            ledger.events.append(ev.id)


def at_end(store: Store, ledger: Ledger) -> None:
    """After the quiet end: every run ended or waits for a named reason; every answer handed to
    a handler is kept, and ``paid_again`` counts every second payment; the outbox, read
    again from the start, is what the readers saw."""
    for run_id in sorted(ledger.runs):
        run = store.get_run(run_id)
        if run is None:
            continue  # pruned
        if run.status not in TERMINAL and not (run.status == "waiting" and run.waiting_for):
            tasks = [(t.id, t.name, t.lease_owner, t.available_at - store.now())
                     for t in store.get_tasks(run_id) if t.done_at is None]  # fmt: skip
            why = f"run {run_id} is {run.status} with nothing to move it: {tasks}"
            raise Violation("every run ends or is waiting for a named reason", why)
    for (run_id, task_id, name), pays in sorted(ledger.payments.items()):
        calls = {(c.task_id, c.name): c for c in store.paid_calls(run_id)}
        call = calls.get((task_id, name))
        if call is None:
            if store.get_run(run_id) is None:
                continue  # pruned with its run
            why = f"call {name!r} of task {task_id}: paid {len(pays)}x, no record"
            raise Violation("a kept answer is never paid again", why)
        if call.paid_again < len(pays) - 1:
            raise Violation("a kept answer is never paid again",
                            f"call {name!r} of task {task_id}: paid {len(pays)}x, paid_again "
                            f"says {call.paid_again}")  # fmt: skip
        used = [p for p in pays if p.state in ("kept", "used")]
        if used and not call.kept:
            raise Violation("a kept answer is never paid again",
                            f"call {name!r} of task {task_id}: attempt {used[0].attempt}'s "
                            "answer reached its handler but is not kept")  # fmt: skip
    seen, now_read, after = list(ledger.events), [], 0
    while batch := store.events(after=after, limit=500, system=True):
        now_read += [ev.id for ev in batch]
        after = batch[-1].id
    kept = [i for i in seen if now_read and i >= now_read[0]]  # (prune drops the oldest)
    if now_read[: len(kept)] != kept:
        raise Violation(
            "events in commit order without gaps",
            "a reader from the start sees other events than the readers did",
        )


def names() -> list[str]:
    return list(INVARIANTS)


INVARIANTS = (
    "at most one live holder per task",
    "no write by a non-holder",
    "no handler started on a lease not confirmed",
    "every run ends or is waiting for a named reason",
    "attempts spent only by started handlers",
    "limit counters equal a recount",
    "a kept answer is never paid again",
    "signals resume once",
    "a join runs once with every child",
    "events in commit order without gaps",
    "a stream has no gap and no splice",
)


def holders(workers: Any, ledger: Ledger, now: float) -> None:
    """At most one live holder per task: of the handlers running, one per task at most holds
    a lease the database granted and has not seen lapse."""
    live: dict[int, str] = {}
    for w in workers:
        for (task_id, attempt), ex in sorted(w.running.items()):
            if ex.lost or ledger.granted.get((task_id, attempt), 0.0) <= now:
                continue
            if task_id in live:
                raise Violation("at most one live holder per task",
                                f"task {task_id}: {live[task_id]} and {w.owner} (attempt "
                                f"{attempt}) both run on live leases")  # fmt: skip
            live[task_id] = f"{w.owner} (attempt {attempt})"
