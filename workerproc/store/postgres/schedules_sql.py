"""PostgreSQL's statements for schedules (``protocol/schedules.py``), and the table's
migration. A firing locks the schedule's row first (``SCHEDULE_ROW ... FOR UPDATE``): a second
firer waits, then reads the ``next_at`` the first one wrote and fires nothing; the
compare-and-set on ``next_at`` (``SCHEDULE_FIRE``) fences the write all the same."""

from __future__ import annotations

from .fragments import CLOCK

# 8: schedules, one row each: its declaration, the next tick it will fire
# (``next_at``, what the compare-and-set of a firing matches) and what it fired last
MIGRATION = """
    CREATE TABLE schedules (
        name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        cron        text NOT NULL,
        tz          text NOT NULL,
        task        text NOT NULL CHECK (length(task) > 0),
        payload     json NOT NULL,
        queue       text NOT NULL,
        priority    integer NOT NULL DEFAULT 0,
        catch_up    text NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
        next_at     double precision NOT NULL,
        last_tick   double precision,
        last_run    bigint,
        fired       bigint NOT NULL DEFAULT 0,
        declared    json NOT NULL,
        declared_by text NOT NULL,
        declared_at double precision NOT NULL
    );
    CREATE INDEX schedules_next ON schedules (next_at);
"""

_COLUMNS = """name, cron, tz, task, payload::text, queue, priority, catch_up, next_at, last_tick,
    last_run, fired, declared::text, declared_by, declared_at"""
SCHEDULE_ROWS = f"SELECT {_COLUMNS} FROM schedules ORDER BY name"
# an app's declaration: a new or changed one starts from its next tick after now
DECLARE_SCHEDULE = f"""INSERT INTO schedules (name, cron, tz, task, payload, queue, priority,
        catch_up, next_at, declared, declared_by, declared_at)
    VALUES (%(name)s, %(cron)s, %(tz)s, %(task)s, %(payload)s::json, %(queue)s, %(priority)s,
            %(catch_up)s, %(next_at)s, %(declared)s::json, %(by)s, {CLOCK})
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, tz = excluded.tz,
        task = excluded.task, payload = excluded.payload, queue = excluded.queue,
        priority = excluded.priority, catch_up = excluded.catch_up, next_at = excluded.next_at,
        declared = excluded.declared, declared_by = excluded.declared_by,
        declared_at = excluded.declared_at"""
DROP_SCHEDULE = "DELETE FROM schedules WHERE name = %(name)s"
# the row a firing decides on, locked: a concurrent firer waits here, then sees the new next_at
SCHEDULE_ROW = f"SELECT {_COLUMNS} FROM schedules WHERE name = %(name)s FOR UPDATE"
# the firing's compare-and-set: only the firer that saw this next_at moves it
SCHEDULE_FIRE = """UPDATE schedules SET next_at = %(next_at)s,
        last_tick = coalesce(%(tick)s, last_tick), last_run = coalesce(%(run_id)s, last_run),
        fired = fired + %(count)s
    WHERE name = %(name)s AND next_at = %(expected)s"""
# what a firer looks at without a lock: the due schedules, the next tick of all
SCHEDULES_DUE = f"""SELECT name, next_at FROM schedules WHERE next_at <= {CLOCK}
    ORDER BY next_at, name LIMIT %(limit)s"""
NEXT_SCHEDULE = "SELECT min(next_at) FROM schedules"
