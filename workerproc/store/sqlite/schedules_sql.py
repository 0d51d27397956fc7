"""SQLite's statements for schedules (``protocol/schedules.py``), and the table's
migration. A firing runs in one write transaction (BEGIN IMMEDIATE holds the whole database), so
reading the schedule's row and moving its ``next_at`` by compare-and-set need no row lock."""

from __future__ import annotations

# 14: schedules, one row each: its declaration, the next tick it will fire
# (``next_at``, what the compare-and-set of a firing matches) and what it fired last
MIGRATION = """
    CREATE TABLE schedules (
        name        TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        cron        TEXT NOT NULL,
        tz          TEXT NOT NULL,
        task        TEXT NOT NULL CHECK (length(task) > 0),
        payload     TEXT NOT NULL CHECK (json_valid(payload)),
        queue       TEXT NOT NULL,
        priority    INTEGER NOT NULL DEFAULT 0,
        catch_up    TEXT NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
        next_at     REAL NOT NULL,
        last_tick   REAL,
        last_run    INTEGER,
        fired       INTEGER NOT NULL DEFAULT 0,
        declared    TEXT NOT NULL CHECK (json_valid(declared)),
        declared_by TEXT NOT NULL,
        declared_at REAL NOT NULL
    );
    CREATE INDEX schedules_next ON schedules (next_at);
"""

_COLUMNS = """name, cron, tz, task, payload, queue, priority, catch_up, next_at, last_tick,
    last_run, fired, declared, declared_by, declared_at"""
SCHEDULE_ROWS = f"SELECT {_COLUMNS} FROM schedules ORDER BY name"
# an app's declaration: a new or changed one starts from its next tick after now
DECLARE_SCHEDULE = """INSERT INTO schedules (name, cron, tz, task, payload, queue, priority,
        catch_up, next_at, declared, declared_by, declared_at)
    VALUES (:name, :cron, :tz, :task, :payload, :queue, :priority, :catch_up, :next_at,
            :declared, :by, :now)
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, tz = excluded.tz,
        task = excluded.task, payload = excluded.payload, queue = excluded.queue,
        priority = excluded.priority, catch_up = excluded.catch_up, next_at = excluded.next_at,
        declared = excluded.declared, declared_by = excluded.declared_by,
        declared_at = excluded.declared_at"""
DROP_SCHEDULE = "DELETE FROM schedules WHERE name = :name"
# the row a firing decides on (the write lock is held already)
SCHEDULE_ROW = f"SELECT {_COLUMNS} FROM schedules WHERE name = :name"
# the firing's compare-and-set: only the firer that saw this next_at moves it
SCHEDULE_FIRE = """UPDATE schedules SET next_at = :next_at,
        last_tick = coalesce(:tick, last_tick), last_run = coalesce(:run_id, last_run),
        fired = fired + :count
    WHERE name = :name AND next_at = :expected"""
# what a firer looks at without the write lock: the due schedules, the next tick of all
SCHEDULES_DUE = """SELECT name, next_at FROM schedules WHERE next_at <= :now
    ORDER BY next_at, name LIMIT :limit"""
NEXT_SCHEDULE = "SELECT min(next_at) FROM schedules"
