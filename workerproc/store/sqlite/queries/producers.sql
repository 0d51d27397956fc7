-- SQLite's producers: a new run and its first task (``start_run``), and the per-task
-- options an app declares (docs/protocol.md B11).

-- name: INSERT_RUN
-- start_run: a new run (its first task: INSERT_TASK). With a key, a run with that key already
-- there makes the insert a no-op (and FIND_BY_KEY answers its id). A new run's id is one past the
-- largest ever given (schema v8: ids are never reused), below the system's runs (v22: SYSTEM_RUNS
-- up, a range of their own, B20): one index seek each.
INSERT INTO runs (id, state, task, queue, priority, key, created_at, updated_at,
        traceparent)
    VALUES (max(coalesce(
        (SELECT max(id) FROM runs
            WHERE id < 1000000000000000), 0), (SELECT high FROM run_ids)) + 1, :state, :name,
                :queue, :priority, :key, :now, :now, :traceparent)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING RETURNING id

-- name: INSERT_SYSTEM_RUN
-- start_run of a system run (a webhook's delivery run), as INSERT_RUN: its id one past the
-- largest system id ever given (from SYSTEM_RUNS up).
INSERT INTO runs (id, state, task, queue, priority, key, created_at, updated_at,
        traceparent)
    VALUES (max(coalesce((SELECT max(id) FROM runs), 0),
        (SELECT system_high FROM run_ids), 1000000000000000) + 1, :state, :name, :queue,
            :priority, :key, :now, :now, :traceparent)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING RETURNING id

-- name: FIND_BY_KEY
-- start_run with a key another run has already: that run's id.
SELECT id FROM runs WHERE key = :key

-- name: INSERT_TASK
-- start_run: the run's first task, due after :delay. A task with limits names its gates, its line
-- and its reservation (store/limits.py); the head trigger puts its run in the line instead of the
-- claim index. Its id is one past the largest ever given, so a pruned task's id never comes back
-- (migration 24). It keeps the state and queue the run starts with (its input, B24); :version:
-- the task's version its state is written for (B25; NULL: unversioned).
INSERT INTO tasks (id, run_id, name, payload, available_at, created_at, line,
        gate_a, gate_b, gate_c, tokens, input_state, input_queue, version)
    VALUES (max(coalesce((SELECT max(id) FROM tasks), 0), (SELECT task_high FROM run_ids)) + 1,
            :run_id, :name, :payload, :now + :delay, :now, :line, :gate_a, :gate_b, :gate_c,
            :tokens, :state, :queue, :version)

-- name: SET_TASK_OPTIONS
-- per-task options (B11): the options an app declares for a task name, replacing those declared
-- before.
INSERT INTO task_options (name, options, updated_at)
    VALUES (:name, :options, :now)
    ON CONFLICT (name) DO UPDATE SET options = excluded.options, updated_at = excluded.updated_at

-- name: DROP_TASK_OPTIONS
-- per-task options (B11): a task name's declared options dropped.
DELETE FROM task_options WHERE name = :name
