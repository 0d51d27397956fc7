-- SQLite's statements for schedules (``protocol/schedules.py``), and the table's
-- migration. A firing runs in one write transaction (BEGIN IMMEDIATE holds the whole database), so
-- reading the schedule's row and moving its ``next_at`` by compare-and-set need no row lock.

-- name: SCHEDULE_ROWS
-- Every schedule, by name.
SELECT name, cron, tz, task, payload, queue, priority, catch_up, next_at, last_tick,
    last_run, fired, declared, declared_by, declared_at FROM schedules ORDER BY name

-- name: DECLARE_SCHEDULE
-- an app's declaration: a new or changed one starts from its next tick after now
INSERT INTO schedules (name, cron, tz, task, payload, queue, priority,
        catch_up, next_at, declared, declared_by, declared_at)
    VALUES (:name, :cron, :tz, :task, :payload, :queue, :priority, :catch_up, :next_at,
            :declared, :by, :now)
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, tz = excluded.tz,
        task = excluded.task, payload = excluded.payload, queue = excluded.queue,
        priority = excluded.priority, catch_up = excluded.catch_up, next_at = excluded.next_at,
        declared = excluded.declared, declared_by = excluded.declared_by,
        declared_at = excluded.declared_at

-- name: DROP_SCHEDULE
-- A schedule goes.
DELETE FROM schedules WHERE name = :name

-- name: SCHEDULE_ROW
-- the row a firing decides on (the write lock is held already)
SELECT name, cron, tz, task, payload, queue, priority, catch_up, next_at, last_tick,
    last_run, fired, declared, declared_by, declared_at FROM schedules WHERE name = :name

-- name: SCHEDULE_FIRE
-- the firing's compare-and-set: only the firer that saw this next_at moves it
UPDATE schedules SET next_at = :next_at,
        last_tick = coalesce(:tick, last_tick), last_run = coalesce(:run_id, last_run),
        fired = fired + :count
    WHERE name = :name AND next_at = :expected

-- name: SCHEDULES_DUE
-- what a firer looks at without the write lock: the due schedules, the next tick of all
SELECT name, next_at FROM schedules WHERE next_at <= :now
    ORDER BY next_at, name LIMIT :limit

-- name: NEXT_SCHEDULE
-- The next tick of all the schedules (a firer sleeps until then).
SELECT min(next_at) FROM schedules
