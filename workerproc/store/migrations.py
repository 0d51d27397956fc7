"""The one migration history both engines share: step ``n`` is ``HISTORY[n - 1]``, by the same
number and name on SQLite and PostgreSQL. Each engine's schema module gives a step's SQL by its
name (``sqlite/schema.py``, ``postgres/schema.py``); a step an engine had nothing to do for has
none there and is applied as an empty step, so every version number means the same schema
shape on both (types and the mechanisms in docs/explanation/schema.md aside).

Only append: a released step never changes its number, its name or what it does."""

from __future__ import annotations

from collections.abc import Mapping

HISTORY: tuple[str, ...] = (
    "runs_and_tasks",  # 1
    "evidence",  # 2: when a task was claimed, which attempt committed, refused writes
    "fewer_trigger_writes",  # 3
    "prev_owner",  # 4: who held a task before its claim
    "queues_priorities_keys",  # 5
    "dashboard_and_attempts",  # 6: runs.task, done_owner, the attempt history
    "cheaper_lease_triggers",  # 7
    "run_ids_never_reused",  # 8
    "running_from_leases",  # 9: running read from the leases, run totals, workers
    "task_options",  # 10 (B11)
    "limits",  # 11
    "paid_calls",  # 12 (B13)
    "waits",  # 13
    "schedules",  # 14
    "gates_ready_order",  # 15
    "events",  # 16 (B18)
    "traceparent",  # 17 (B19)
    "webhooks",  # 18 (B20)
    "gates_idle",  # 19
    "parent_join",  # 20
    "started",  # 21 (B3)
    "webhook_positions",  # 22
    "call_intents",  # 23
    "task_ids_never_reused",  # 24
    "streams",  # 25 (B21)
    "workers_tasks",  # 26 (B22)
    "step_inputs",  # 27 (B24)
    "task_versions",  # 28 (B25)
    "leases",  # 29: SQLite's leases in their own table, keyed by run (PostgreSQL's since 9)
    "task_lease_columns",  # 30: SQLite's task rows without their lease columns
    "stream_batches",  # 31: one row per batch of a stream (B21)
    "leases_owner_unindexed",  # 32: PostgreSQL's leases without an index of their owner
    "webhook_in_flight",  # 33: a webhook's window, its own (B20)
)

SCHEMA_VERSION = len(HISTORY)


def steps(engine: str, sql: Mapping[str, str]) -> list[str]:
    """The engine's SQL for every step of the history, in order (``""``: nothing to do there).
    A name the history does not have is a mistake, refused here rather than never applied."""
    unknown = sorted(set(sql) - set(HISTORY))
    if unknown:
        raise ValueError(f"{engine}: migrations not in the history: {unknown}")
    return [sql.get(name, "") for name in HISTORY]
