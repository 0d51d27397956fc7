-- The SQLite backend's reads: runs, tasks, the evidence, counts, the idle workers' cheap reads
-- and the dashboard's pages. Reads are plain SELECTs (a WAL reader never takes the write lock);
-- every list is a bounded index walk, so a page costs the same over a thousand runs or a million.
--
-- A run's columns (``GET_RUN`` and every list of runs) say ``running`` for a pending run a live
-- lease holds (the row says ``pending``: schema v9), and ``waiting`` for a pending run no lease
-- holds whose wait's deadline is ahead (B14). A status filter is the stored status (``:stored``:
-- running is stored as pending), whether a live lease holds the run (``:held``) and whether it
-- waits (``:waiting``), each NULL when the status says nothing of it.

-- name: GET_RUN
-- One run by its id, with the status people see.
SELECT id, CASE WHEN status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = runs.id AND l.expires_at > :now) THEN 'running'
        WHEN status = 'pending' AND coalesce(wait_until > :now, 0) THEN 'waiting' ELSE status END,
    state, revision, result, failure_reason, last_error, created_at, updated_at, finished_at,
    queue, priority, key, task,
    CASE WHEN status = 'pending' AND coalesce(wait_until > :now, 0) AND NOT EXISTS (
            SELECT 1 FROM leases AS l WHERE l.run_id = runs.id AND l.expires_at > :now) THEN wait_for END, parent_id
    FROM runs WHERE id = :run_id

-- name: LIST_RUNS
-- Runs newest first, below :below (``SYSTEM_RUNS``: the users' runs only; above every id: the
-- system's too, B20), of one status if :stored is given (and of one queue if :queue is). Each
-- arm of the union walks its own index and only one of them runs (the others' constant
-- condition is false): no status walks the primary key (checking the queue per row), a status
-- walks runs_status. One ``(:x IS NULL OR ...)`` condition instead would walk the primary key
-- past every run of other statuses.
SELECT id, CASE WHEN status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = runs.id AND l.expires_at > :now) THEN 'running'
        WHEN status = 'pending' AND coalesce(wait_until > :now, 0) THEN 'waiting' ELSE status END,
    state, revision, result, failure_reason, last_error, created_at, updated_at, finished_at,
    queue, priority, key, task,
    CASE WHEN status = 'pending' AND coalesce(wait_until > :now, 0) AND NOT EXISTS (
            SELECT 1 FROM leases AS l WHERE l.run_id = runs.id AND l.expires_at > :now) THEN wait_for END, parent_id
    FROM runs WHERE id IN (
        SELECT id FROM runs WHERE :stored IS NULL AND (:queue IS NULL OR queue = :queue)
            AND id < :below
        UNION ALL
        SELECT id FROM runs WHERE status = :stored
            AND (:held IS NULL OR EXISTS (SELECT 1 FROM leases AS l
                WHERE l.run_id = runs.id AND l.expires_at > :now) = :held)
            AND (:waiting IS NULL OR coalesce(wait_until > :now, 0) = :waiting)
            AND (:queue IS NULL OR queue = :queue) AND id < :below
        ORDER BY id DESC LIMIT :limit)
    ORDER BY id DESC

-- name: GET_TASKS
-- A run's tasks, in id order.
SELECT id, run_id, name, payload, available_at, created_at,
    (SELECT l.owner FROM leases AS l WHERE l.run_id = tasks.run_id AND l.task_id = tasks.id),
    (SELECT l.expires_at FROM leases AS l WHERE l.run_id = tasks.run_id AND l.task_id = tasks.id),
    attempts, attempt_base, last_error, done_at, claimed_at, done_attempt,
    done_owner, version FROM tasks WHERE run_id = :run_id ORDER BY id

-- name: GET_TASK
-- One task by its id.
SELECT id, run_id, name, payload, available_at, created_at,
    (SELECT l.owner FROM leases AS l WHERE l.run_id = tasks.run_id AND l.task_id = tasks.id),
    (SELECT l.expires_at FROM leases AS l WHERE l.run_id = tasks.run_id AND l.task_id = tasks.id),
    attempts, attempt_base, last_error, done_at, claimed_at, done_attempt,
    done_owner, version FROM tasks WHERE id = :task_id

-- name: LIST_REJECTIONS
-- The writes the fence refused after :after, oldest first.
SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE id > :after ORDER BY id LIMIT :limit

-- name: SUPERSEDED_COMMITS
-- Integrity (the chaos verifier): a finished task committed by an attempt that was superseded.
SELECT id, run_id, done_attempt, attempts FROM tasks
    WHERE done_at IS NOT NULL AND done_attempt IS NOT NULL AND done_attempt != attempts

-- name: OVERLAPPING_LEASES
-- Integrity: a run holding two live leases at once (R1 forbids it).
SELECT l.run_id, count(*) FROM leases AS l JOIN tasks AS t ON t.id = l.task_id
    WHERE l.expires_at > :now AND t.done_at IS NULL AND t.run_id = l.run_id
    GROUP BY l.run_id HAVING count(*) > 1

-- name: RUN_COUNTS
-- Stats never read a finished run: the live runs by queue and status (runs_status); the
-- finished ones come from their totals (RUN_TOTALS).
SELECT queue, CASE WHEN EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = runs.id
            AND l.expires_at > :now)
        THEN 'running' WHEN coalesce(wait_until > :now, 0) THEN 'waiting' ELSE 'pending' END,
    count(*)
    FROM runs WHERE status IN ('pending', 'running') GROUP BY 1, 2

-- name: RUN_TOTALS
-- The finished runs by queue and status, as counted when they ended (COUNT_ENDED).
SELECT queue, status, sum(n) FROM run_totals GROUP BY queue, status
    HAVING sum(n) <> 0

-- name: TASK_COUNTS
-- The live runs' pending tasks by queue: ready, delayed, leased, and leased past their expiry.
SELECT r.queue,
    coalesce(sum(l.owner IS NULL AND t.available_at <= :now), 0),
    coalesce(sum(l.owner IS NULL AND t.available_at > :now), 0),
    coalesce(sum(l.owner IS NOT NULL AND l.expires_at > :now), 0),
    coalesce(sum(l.owner IS NOT NULL AND l.expires_at <= :now), 0)
    FROM tasks AS t JOIN runs AS r ON r.id = t.run_id
    LEFT JOIN leases AS l ON l.run_id = t.run_id AND l.task_id = t.id
    WHERE t.done_at IS NULL AND r.status IN ('pending', 'running') GROUP BY r.queue

-- name: LIVE_LEASES
-- Every lease held, by owner.
SELECT l.owner, l.task_id, l.run_id, t.name, l.attempts, l.expires_at
    FROM leases AS l JOIN tasks AS t ON t.id = l.task_id
    WHERE l.owner IS NOT NULL ORDER BY l.owner

-- name: LIST_WORKERS
-- The worker processes of every host, each with whether it beat within three of its periods.
SELECT owner, host, pid, started_at, beat_every, slots, queues, version, state,
    heartbeat_at, heartbeat_at > :now - 3 * beat_every, tasks FROM workers
    ORDER BY host, started_at, pid

-- name: NEXT_READY
-- Idle workers of every queue: the earliest moment a claim could succeed (one index seek per
-- queue, the queues found by skipping through runs_claim; never a scan of the pending runs),
-- or the first gate whose line may admit a run (gates are not kept per queue, so a worker may
-- wake for a line of another queue once, and find nothing).
WITH RECURSIVE served(q) AS (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL
    UNION ALL
    SELECT (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL AND queue > served.q)
    FROM served WHERE q IS NOT NULL)
    SELECT min(at) FROM (
        SELECT (SELECT min(ready_at) FROM runs WHERE queue = served.q AND ready_at IS NOT NULL)
            AS at FROM served WHERE q IS NOT NULL
        UNION ALL SELECT min(ready_at) FROM gates WHERE ready_at IS NOT NULL)

-- name: NEXT_READY_QUEUES
-- NEXT_READY for the queues of :queues (a JSON array).
WITH RECURSIVE served(q) AS (SELECT value FROM json_each(:queues))
    SELECT min(at) FROM (
        SELECT (SELECT min(ready_at) FROM runs WHERE queue = served.q AND ready_at IS NOT NULL)
            AS at FROM served WHERE q IS NOT NULL
        UNION ALL SELECT min(ready_at) FROM gates WHERE ready_at IS NOT NULL)

-- name: RUNS_BEFORE
-- The dashboard's keyset page: the runs below :before, newest first, of one status (:stored)
-- and of one first task (:task) if they are given. As LIST_RUNS, each arm walks its own index
-- and only one runs: no filter the primary key, a status runs_status, a task runs_task, both
-- the one of the two the planner finds narrower (its statistics). Each arm's constant
-- condition is what keeps the others from walking: a merge of ordered arms reads each arm to
-- its first row, and an arm that matches nothing would be read to its end.
SELECT id, CASE WHEN status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = runs.id AND l.expires_at > :now) THEN 'running'
        WHEN status = 'pending' AND coalesce(wait_until > :now, 0) THEN 'waiting' ELSE status END,
    state, revision, result, failure_reason, last_error, created_at, updated_at, finished_at,
    queue, priority, key, task,
    CASE WHEN status = 'pending' AND coalesce(wait_until > :now, 0) AND NOT EXISTS (
            SELECT 1 FROM leases AS l WHERE l.run_id = runs.id AND l.expires_at > :now) THEN wait_for END, parent_id
    FROM runs WHERE id IN (
        SELECT id FROM runs WHERE :stored IS NULL AND :task IS NULL AND id < :before
        UNION ALL
        SELECT id FROM runs WHERE :task IS NULL AND status = :stored
            AND (:held IS NULL OR EXISTS (SELECT 1 FROM leases AS l
                WHERE l.run_id = runs.id AND l.expires_at > :now) = :held)
            AND (:waiting IS NULL OR coalesce(wait_until > :now, 0) = :waiting) AND id < :before
        UNION ALL
        SELECT id FROM runs WHERE :stored IS NULL AND task = :task AND id < :before
        UNION ALL
        SELECT id FROM runs WHERE :stored IS NOT NULL AND :task IS NOT NULL
            AND status = :stored AND task = :task
            AND (:held IS NULL OR EXISTS (SELECT 1 FROM leases AS l
                WHERE l.run_id = runs.id AND l.expires_at > :now) = :held)
            AND (:waiting IS NULL OR coalesce(wait_until > :now, 0) = :waiting)
            AND id < :before
        ORDER BY id DESC LIMIT :limit)
    ORDER BY id DESC

-- name: RUNS_AFTER
-- The newer page: the runs above :after and below :below, oldest first (the caller reverses
-- them), filtered and walked as RUNS_BEFORE.
SELECT id, CASE WHEN status = 'pending' AND EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = runs.id AND l.expires_at > :now) THEN 'running'
        WHEN status = 'pending' AND coalesce(wait_until > :now, 0) THEN 'waiting' ELSE status END,
    state, revision, result, failure_reason, last_error, created_at, updated_at, finished_at,
    queue, priority, key, task,
    CASE WHEN status = 'pending' AND coalesce(wait_until > :now, 0) AND NOT EXISTS (
            SELECT 1 FROM leases AS l WHERE l.run_id = runs.id AND l.expires_at > :now) THEN wait_for END, parent_id
    FROM runs WHERE id IN (
        SELECT id FROM runs WHERE :stored IS NULL AND :task IS NULL
            AND id > :after AND id < :below
        UNION ALL
        SELECT id FROM runs WHERE :task IS NULL AND status = :stored
            AND (:held IS NULL OR EXISTS (SELECT 1 FROM leases AS l
                WHERE l.run_id = runs.id AND l.expires_at > :now) = :held)
            AND (:waiting IS NULL OR coalesce(wait_until > :now, 0) = :waiting)
            AND id > :after AND id < :below
        UNION ALL
        SELECT id FROM runs WHERE :stored IS NULL AND task = :task
            AND id > :after AND id < :below
        UNION ALL
        SELECT id FROM runs WHERE :stored IS NOT NULL AND :task IS NOT NULL
            AND status = :stored AND task = :task
            AND (:held IS NULL OR EXISTS (SELECT 1 FROM leases AS l
                WHERE l.run_id = runs.id AND l.expires_at > :now) = :held)
            AND (:waiting IS NULL OR coalesce(wait_until > :now, 0) = :waiting)
            AND id > :after AND id < :below
        ORDER BY id ASC LIMIT :limit)
    ORDER BY id ASC

-- name: HEAD_TASKS
-- B22: of the runs named (:run_ids, a JSON array), those whose head is due and no live lease
-- holds, with their head task's name, their queue and the task's version (B25): what a worker
-- must serve to claim them
SELECT r.id, t.name, r.queue, t.version FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
    WHERE r.id IN (SELECT value FROM json_each(:run_ids)) AND r.head_at <= :now
      AND r.status IN ('pending', 'running')
      AND NOT EXISTS (SELECT 1 FROM leases AS a WHERE a.run_id = r.id
                      AND a.expires_at > :now)
    ORDER BY r.id

-- name: TASK_NAMES
-- The distinct first-task names, by skipping through runs_task (one seek per name, never a
-- scan of the runs).
WITH RECURSIVE names(name) AS (
        SELECT (SELECT min(task) FROM runs)
        UNION ALL
        SELECT (SELECT min(task) FROM runs WHERE task > names.name) FROM names
        WHERE names.name IS NOT NULL LIMIT :limit)
    SELECT name FROM names WHERE name IS NOT NULL

-- name: ATTEMPT_HISTORY
-- A run's attempts that ended without a commit.
SELECT task_id, attempt, owner, claimed_at, ended_at, outcome, error,
    taken_by FROM task_attempts WHERE run_id = :run_id ORDER BY task_id, attempt, id

-- name: RUN_REJECTIONS
-- The writes the fence refused for a run's tasks, oldest first.
SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE task_id IN (SELECT id FROM tasks WHERE run_id = :run_id) ORDER BY id

-- name: FINISHED_SINCE
-- Runs finished per bucket among the newest runs (a primary-key walk from the end: bounded,
-- no index on finished_at, so finishing a run writes no extra index entry).
SELECT CAST((finished_at - :since) / :bucket AS INTEGER) AS slot,
        coalesce(sum(status = 'succeeded'), 0), coalesce(sum(status = 'failed'), 0),
        coalesce(sum(status = 'cancelled'), 0)
    FROM (SELECT status, finished_at FROM runs ORDER BY id DESC LIMIT :newest)
    WHERE finished_at >= :since GROUP BY slot ORDER BY slot

-- name: FAILED_SINCE
-- The runs that failed since a moment (``--drain --fail-on-failed``), per queue: a walk of the
-- failed runs (runs_status), few where it matters.
SELECT queue, count(*) FROM runs WHERE status = 'failed'
    AND finished_at >= :since GROUP BY queue ORDER BY queue

-- name: TASK_OPTIONS
-- Per-task options (B11): every task that declares some (a few rows).
SELECT name, options FROM task_options ORDER BY name

-- name: PENDING_IDS
-- The newest pending runs' ids, newest first, below :below (the users' runs only), of the
-- queues in :queues (a JSON array; NULL: every queue): where a drain looks for runs no worker of
-- its pool serves (B22). Ids only, walking runs_status: nothing to decode.
SELECT id FROM runs WHERE status = 'pending' AND id < :below
    AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
    ORDER BY id DESC LIMIT :limit
