-- The PostgreSQL backend's reads: runs, tasks, the evidence, counts, the idle workers' cheap
-- reads, the dashboard's pages and the engine's storage check (amcheck), each statement named with
-- its purpose.
--
-- Every list is a bounded index walk, so a page costs the same over a thousand runs or a million.
-- JSON goes out as text and is decoded by the store (``codec.loads``).

-- name: GET_RUN
-- One run by its id, with the status people see.
SELECT r.id, CASE WHEN r.status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
                      THEN 'running'
        WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
        THEN 'waiting' ELSE r.status END,
    r.state::text, r.revision, r.result::text, r.failure_reason, r.last_error, r.created_at,
    r.updated_at, r.finished_at, r.queue, r.priority, r.key, r.task,
    CASE WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        THEN r.wait_for END,
    r.parent_id
    FROM runs AS r WHERE r.id = %(run_id)s

-- name: LIST_RUNS
-- Runs newest first, below %(below)s (``SYSTEM_RUNS``: the users' runs only; above every id:
-- the system's too, B20), of one status if %(stored)s is given and of one queue if %(queue)s
-- is. Each optional filter is ``(%(x)s::type IS NULL OR ...)``: the statement is planned for its
-- values (a custom plan), so a status walks runs_status (succeeded: the primary key) and no
-- status the primary key, checking the queue per row.
SELECT r.id, CASE WHEN r.status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
                      THEN 'running'
        WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
        THEN 'waiting' ELSE r.status END,
    r.state::text, r.revision, r.result::text, r.failure_reason, r.last_error, r.created_at,
    r.updated_at, r.finished_at, r.queue, r.priority, r.key, r.task,
    CASE WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        THEN r.wait_for END,
    r.parent_id
    FROM runs AS r
    WHERE (%(stored)s::text IS NULL OR r.status = %(stored)s)
      AND (%(held)s::bool IS NULL OR EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) =
                      %(held)s)
      AND (%(waiting)s::bool IS NULL
           OR coalesce(r.wait_until >
               coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
                   false) = %(waiting)s)
      AND (%(queue)s::text IS NULL OR r.queue = %(queue)s) AND r.id < %(below)s
    ORDER BY r.id DESC LIMIT %(limit)s

-- name: GET_TASKS
-- A run's tasks, in id order, each with its lease while the run's lease row names it.
SELECT t.id, t.run_id, t.name, t.payload::text, t.available_at, t.created_at,
    l.owner, CASE WHEN l.owner IS NOT NULL THEN l.expires_at END,
    coalesce(l.attempts, t.attempts), coalesce(l.attempt_base, t.attempt_base), t.last_error,
    t.done_at, coalesce(l.claimed_at, t.claimed_at), t.done_attempt, t.done_owner, t.version
        FROM tasks AS t LEFT JOIN leases AS l ON l.run_id = t.run_id AND l.task_id = t.id
            WHERE t.run_id = %(run_id)s ORDER BY t.id

-- name: GET_TASK
-- One task by its id, with its lease.
SELECT t.id, t.run_id, t.name, t.payload::text, t.available_at, t.created_at,
    l.owner, CASE WHEN l.owner IS NOT NULL THEN l.expires_at END,
    coalesce(l.attempts, t.attempts), coalesce(l.attempt_base, t.attempt_base), t.last_error,
    t.done_at, coalesce(l.claimed_at, t.claimed_at), t.done_attempt, t.done_owner, t.version
        FROM tasks AS t LEFT JOIN leases AS l ON l.run_id = t.run_id AND l.task_id = t.id
            WHERE t.id = %(task_id)s

-- name: LIST_REJECTIONS
-- The writes the fence refused after %(after)s, oldest first.
SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE id > %(after)s ORDER BY id LIMIT %(limit)s

-- name: SUPERSEDED_COMMITS
-- integrity (chaos verifier): a finished task committed by an attempt that was superseded
SELECT id, run_id, done_attempt, attempts FROM tasks
    WHERE done_at IS NOT NULL AND done_attempt IS NOT NULL AND done_attempt != attempts

-- name: OVERLAPPING_LEASES
-- integrity: a run holding two live leases at once (R1 forbids it; since v3 the lease table's
-- primary key cannot hold two, and this finds what a broken claim could still leave: a live
-- lease on a task that is done or belongs to another run)
SELECT l.run_id, 2 FROM leases AS l
    LEFT JOIN tasks AS t ON t.id = l.task_id AND t.run_id = l.run_id AND t.done_at IS NULL
    WHERE l.owner IS NOT NULL
        AND l.expires_at > (SELECT
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
                AND t.id IS NULL

-- name: RUN_COUNTS
-- stats, in one snapshot, never reading a finished run: the live runs by queue and status
-- (runs_status), the finished ones from their totals, pending tasks by queue and state, leases
SELECT r.queue, CASE WHEN EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
    AND l.owner IS NOT NULL
        AND l.expires_at >
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) THEN 'running'
        WHEN coalesce(r.wait_until >
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
                THEN 'waiting' ELSE 'pending' END, count(*)
    FROM runs AS r WHERE r.status = 'pending' GROUP BY 1, 2

-- name: RUN_TOTALS
-- The finished runs by queue and status, as counted when they ended (COUNT_ENDED).
SELECT queue, status, sum(n)::bigint FROM run_totals GROUP BY queue, status
    HAVING sum(n) <> 0

-- name: TASK_COUNTS
-- (each live run's own tasks, looked up by the run: a nested loop by construction, so a plan
-- made while the live runs were few never rescans them per task)
SELECT r.queue, sum(x.ready)::bigint, sum(x.delayed)::bigint,
    sum(x.leased)::bigint, sum(x.expired)::bigint
    FROM (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
        AS c, runs AS r CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE l.owner IS NULL AND t.available_at <= c.now) AS ready,
            count(*) FILTER (WHERE l.owner IS NULL AND t.available_at > c.now) AS delayed,
            count(*) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at > c.now) AS leased,
            count(*) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at <= c.now) AS expired
        FROM tasks AS t LEFT JOIN leases AS l ON l.run_id = t.run_id AND l.task_id = t.id
            WHERE t.run_id = r.id AND t.done_at IS NULL) AS x
    WHERE r.status = 'pending' GROUP BY r.queue

-- name: LIVE_LEASES
-- Every lease held, by owner.
SELECT l.owner, l.task_id, l.run_id, t.name, l.attempts, l.expires_at
    FROM leases AS l JOIN tasks AS t ON t.id = l.task_id
    WHERE l.owner IS NOT NULL ORDER BY l.owner

-- name: LIST_WORKERS
-- the worker processes of every host, each with whether it beat within three of its periods
SELECT owner, host, pid, started_at, beat_every, slots, queues, version,
    state, heartbeat_at,
        heartbeat_at > coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) - 3
            * beat_every, tasks FROM workers
    ORDER BY host, started_at, pid

-- name: NEXT_READY
-- Idle workers: the earliest moment a claim could succeed in any queue: the first due run of
-- each priority level that no live lease holds (the claim index, walked past the few held runs
-- at its front), or the end of the first live lease on a run (if its head is due by then), or
-- the first gate whose line may admit a run (gates are not kept per queue: a worker may wake
-- once for another queue's line). A past value only says "claimable now". Every walk starts at
-- the connection's floor (%(floor)s, ``floors``) and reads each run's lease by its key, as the claim
-- does: it never reads the entries of runs that ended while the horizon was held. The first
-- lease to end is found from the leases, each run by its key (a run of any level and queue at
-- or above the floor is one of the levels walked): walked from the runs, it probed the lease of
-- every pending run above the floor, 55 ms among 10,000 (the supervisor's drain and progress
-- checks ask each second); the lease table holds the live leases and the dead versions vacuum
-- has not removed (all those ended since, while another client holds the horizon back). The second
-- column is the clock it judged by (``Reads.ready_in``: no other statement asks the time).
WITH RECURSIVE clock AS MATERIALIZED (SELECT
    coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
levels(p) AS (
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8)
    UNION ALL
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8
            AND priority > levels.p)
    FROM levels WHERE levels.p IS NOT NULL)
SELECT least(
    (SELECT min(x.head_at) FROM levels AS lv CROSS JOIN LATERAL (
        SELECT r.head_at FROM runs AS r
        WHERE r.priority = lv.p AND r.head_at >= %(floor)s::float8
          AND (r.status = 'pending') IS TRUE
          AND coalesce((SELECT l.expires_at FROM leases AS l WHERE l.run_id = r.id),
                       '-infinity') <= (SELECT now FROM clock)
        ORDER BY r.head_at LIMIT 1) AS x WHERE lv.p IS NOT NULL),
    (SELECT min(greatest(r.head_at, l.expires_at)) FROM leases AS l
     CROSS JOIN LATERAL (SELECT r.head_at FROM runs AS r WHERE r.id = l.run_id
         AND r.head_at >= %(floor)s::float8 OFFSET 0) AS r
     WHERE l.expires_at > (SELECT now FROM clock)),
    (SELECT min(ready_at) FROM gates WHERE ready_at IS NOT NULL)),
    (SELECT now FROM clock)

-- name: NEXT_READY_QUEUES
-- NEXT_READY for the queues of %(queues)s: every level of each queue (the loose scan of
-- runs_prio, then runs_claim per queue), from the floor of those queues.
WITH RECURSIVE clock AS MATERIALIZED (SELECT
    coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
served(q) AS (SELECT unnest(%(queues)s::text[])),
every_level(p) AS (
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8)
    UNION ALL
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8
            AND priority > every_level.p)
    FROM every_level WHERE every_level.p IS NOT NULL),
levels(q, p) AS (SELECT served.q, every_level.p FROM served CROSS JOIN every_level)
SELECT least(
    (SELECT min(x.head_at) FROM levels AS lv CROSS JOIN LATERAL (
        SELECT r.head_at FROM runs AS r
        WHERE r.queue = lv.q AND r.priority = lv.p AND r.head_at >= %(floor)s::float8
            AND (r.status = 'pending') IS TRUE
          AND coalesce((SELECT l.expires_at FROM leases AS l WHERE l.run_id = r.id),
                       '-infinity') <= (SELECT now FROM clock)
        ORDER BY r.head_at LIMIT 1) AS x WHERE lv.p IS NOT NULL),
    (SELECT min(greatest(r.head_at, l.expires_at)) FROM leases AS l
     CROSS JOIN LATERAL (SELECT r.head_at FROM runs AS r WHERE r.id = l.run_id
         AND r.queue = ANY(%(queues)s::text[]) AND r.head_at >= %(floor)s::float8 OFFSET 0) AS r
     WHERE l.expires_at > (SELECT now FROM clock)),
    (SELECT min(ready_at) FROM gates WHERE ready_at IS NOT NULL)),
    (SELECT now FROM clock)

-- name: RUNS_BEFORE
-- The dashboard's keyset page: the runs below %(before)s, newest first, of one status
-- (%(stored)s) and of one first task (%(task)s) if they are given. Planned for its values, as
-- LIST_RUNS: no filter walks the primary key, a status runs_status, a task runs_task, both one
-- of the two.
SELECT r.id, CASE WHEN r.status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
                      THEN 'running'
        WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
        THEN 'waiting' ELSE r.status END,
    r.state::text, r.revision, r.result::text, r.failure_reason, r.last_error, r.created_at,
    r.updated_at, r.finished_at, r.queue, r.priority, r.key, r.task,
    CASE WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        THEN r.wait_for END,
    r.parent_id
    FROM runs AS r
    WHERE (%(stored)s::text IS NULL OR r.status = %(stored)s)
      AND (%(held)s::bool IS NULL OR EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) =
                      %(held)s)
      AND (%(waiting)s::bool IS NULL
           OR coalesce(r.wait_until >
               coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
                   false) = %(waiting)s)
      AND (%(task)s::text IS NULL OR r.task = %(task)s) AND r.id < %(before)s
    ORDER BY r.id DESC LIMIT %(limit)s

-- name: RUNS_AFTER
-- The newer page: the runs above %(after)s and below %(below)s, oldest first (the caller
-- reverses them), filtered and walked as RUNS_BEFORE.
SELECT r.id, CASE WHEN r.status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
                      THEN 'running'
        WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
        THEN 'waiting' ELSE r.status END,
    r.state::text, r.revision, r.result::text, r.failure_reason, r.last_error, r.created_at,
    r.updated_at, r.finished_at, r.queue, r.priority, r.key, r.task,
    CASE WHEN r.status = 'pending'
          AND coalesce(r.wait_until >
              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), false)
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        THEN r.wait_for END,
    r.parent_id
    FROM runs AS r
    WHERE (%(stored)s::text IS NULL OR r.status = %(stored)s)
      AND (%(held)s::bool IS NULL OR EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at >
                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) =
                      %(held)s)
      AND (%(waiting)s::bool IS NULL
           OR coalesce(r.wait_until >
               coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
                   false) = %(waiting)s)
      AND (%(task)s::text IS NULL OR r.task = %(task)s)
      AND r.id > %(after)s AND r.id < %(below)s
    ORDER BY r.id ASC LIMIT %(limit)s

-- name: HEAD_TASKS
-- B22: of the runs named, those whose head is due and no live lease holds, with their head
-- task's name, their queue and the task's version (B25): what a worker must serve to claim them
SELECT r.id, t.name, r.queue, t.version FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
    WHERE r.id = ANY(%(run_ids)s::bigint[]) AND r.status = 'pending'
      AND r.head_at <= coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.expires_at >
          coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    ORDER BY r.id

-- name: TASK_NAMES
-- task_names: the distinct first-task names, skipping through runs_task (one probe per name)
WITH RECURSIVE names(name) AS (
        SELECT (SELECT min(task) FROM runs)
        UNION ALL
        SELECT (SELECT min(task) FROM runs WHERE task > names.name) FROM names
        WHERE names.name IS NOT NULL)
    SELECT name FROM names WHERE name IS NOT NULL LIMIT %(limit)s

-- name: ATTEMPT_HISTORY
-- the attempt history: attempts that ended without a commit
SELECT task_id, attempt, owner, claimed_at, ended_at, outcome, error,
    taken_by FROM task_attempts WHERE run_id = %(run_id)s ORDER BY task_id, attempt, id

-- name: RUN_REJECTIONS
-- The writes the fence refused for a run's tasks, oldest first.
SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE task_id IN (SELECT id FROM tasks WHERE run_id = %(run_id)s) ORDER BY id

-- name: FINISHED_SINCE
-- finished_since: runs finished per bucket since ``since``, at most the ``newest`` of them: a
-- backward walk of runs_finished from now, so the chart costs what finished in its window,
-- however long the history
SELECT floor((finished_at - %(since)s) / %(bucket)s)::bigint AS slot,
        count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed'),
        count(*) FILTER (WHERE status = 'cancelled')
    FROM (SELECT status, finished_at FROM runs WHERE finished_at >= %(since)s
          ORDER BY finished_at DESC LIMIT %(newest)s) AS newest
    GROUP BY slot ORDER BY slot

-- name: FAILED_SINCE
-- failed_since: the runs that failed since a moment (``--drain --fail-on-failed``), per queue
SELECT queue, count(*) FROM runs WHERE status = 'failed'
    AND finished_at >= %(since)s GROUP BY queue ORDER BY queue

-- name: AMCHECK
-- The engine's own check of its storage: where amcheck is installed, if it is.
SELECT n.nspname, e.extversion FROM pg_extension AS e
    JOIN pg_namespace AS n ON n.oid = e.extnamespace WHERE e.extname = 'amcheck'

-- name: OUR_INDEXES
-- The B-tree indexes of our schema (amcheck checks each).
SELECT c.oid::regclass::text FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_am AS am ON am.oid = c.relam
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND am.amname = 'btree' ORDER BY c.relname

-- name: OUR_TABLES
-- The tables of our schema (amcheck checks each one's heap).
SELECT c.oid::regclass::text FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relkind = 'r' ORDER BY c.relname

-- name: TASK_OPTIONS
-- per-task options (B11): every task that declares some (a few rows)
SELECT name, options::text FROM task_options ORDER BY name

-- name: PENDING_IDS
-- The newest pending runs' ids, newest first, below %(below)s (the users' runs only), of the
-- queues in %(queues)s (NULL: every queue): where a drain looks for runs no worker of its pool
-- serves (B22). Ids only, walking runs_status: nothing to decode.
SELECT id FROM runs WHERE status = 'pending' AND id < %(below)s
    AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
    ORDER BY id DESC LIMIT %(limit)s
