-- PostgreSQL's statements for schedules (``protocol/schedules.py``), and the table's
-- migration. A firing locks the schedule's row first (``SCHEDULE_ROW ... FOR UPDATE``): a second
-- firer waits, then reads the ``next_at`` the first one wrote and fires nothing; the
-- compare-and-set on ``next_at`` (``SCHEDULE_FIRE``) fences the write all the same.

-- name: SCHEDULE_ROWS
-- Every schedule, by name.
SELECT name, cron, tz, task, payload::text, queue, priority, catch_up, next_at, last_tick,
    last_run, fired, declared::text, declared_by, declared_at FROM schedules ORDER BY name

-- name: DECLARE_SCHEDULE
-- an app's declaration: a new or changed one starts from its next tick after now
INSERT INTO schedules (name, cron, tz, task, payload, queue, priority,
        catch_up, next_at, declared, declared_by, declared_at)
    VALUES (%(name)s, %(cron)s, %(tz)s, %(task)s, %(payload)s::json, %(queue)s, %(priority)s,
            %(catch_up)s, %(next_at)s, %(declared)s::json, %(by)s,
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, tz = excluded.tz,
        task = excluded.task, payload = excluded.payload, queue = excluded.queue,
        priority = excluded.priority, catch_up = excluded.catch_up, next_at = excluded.next_at,
        declared = excluded.declared, declared_by = excluded.declared_by,
        declared_at = excluded.declared_at

-- name: DROP_SCHEDULE
-- A schedule goes.
DELETE FROM schedules WHERE name = %(name)s

-- name: SCHEDULE_ROW
-- the row a firing decides on, locked: a concurrent firer waits here, then sees the new next_at
SELECT name, cron, tz, task, payload::text, queue, priority, catch_up, next_at, last_tick,
    last_run, fired, declared::text, declared_by, declared_at FROM schedules
        WHERE name = %(name)s FOR UPDATE

-- name: SCHEDULE_FIRE
-- the firing's compare-and-set: only the firer that saw this next_at moves it
UPDATE schedules SET next_at = %(next_at)s,
        last_tick = coalesce(%(tick)s, last_tick), last_run = coalesce(%(run_id)s, last_run),
        fired = fired + %(count)s
    WHERE name = %(name)s AND next_at = %(expected)s

-- name: SCHEDULES_DUE
-- what a firer looks at without a lock: the due schedules, the next tick of all
SELECT name, next_at FROM schedules
    WHERE next_at <= coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
    ORDER BY next_at, name LIMIT %(limit)s

-- name: NEXT_SCHEDULE
-- The next tick of all the schedules (a firer sleeps until then).
SELECT min(next_at) FROM schedules
