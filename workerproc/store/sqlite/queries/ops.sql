-- The SQLite backend's operators (cancel, retry, prune), finished-run totals and worker list,
-- each statement named with its one-line purpose (claims and commits are in ``sql``), as
-- PostgreSQL's ``ops_sql``. An operator reads the run first (``RUN_STATUS``), then writes its
-- tasks.

-- name: CANCEL_RUN
-- An operator cancels a live run.
UPDATE runs SET status = 'cancelled', finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN ('pending', 'running')

-- name: RUN_STATUS
-- A run's status and queue: what an operator reads first.
SELECT status, queue FROM runs WHERE id = :run_id

-- name: PENDING_TASKS
-- How many of a run's tasks are not done.
SELECT count(*) FROM tasks WHERE run_id = :run_id AND done_at IS NULL

-- name: RETRY_TASKS_DUE
-- retry_run: a new attempt generation. attempts keeps counting (the fencing token never
-- repeats); attempt_base restarts what max_attempts bounds; the run is due when its lease
-- would have expired (a cancelled run's holder may run on until it hears, and pay within its
-- lease: the new generation begins after it), else now (``steps.retry_tasks``: then the old
-- lease is dropped, RETRY_LEASE_DROPPED).
UPDATE tasks SET attempt_base = attempts,
    available_at = max(:now, coalesce((SELECT expires_at FROM leases WHERE run_id = :run_id),
                                      :now))
    WHERE run_id = :run_id AND done_at IS NULL

-- name: RETRY_LEASE_DROPPED
-- retry_run: the run's old lease is dropped
DELETE FROM leases WHERE run_id = :run_id

-- name: RETRY_RUN
-- An operator's retry: the run is pending again, its failure and wait forgotten.
UPDATE runs SET status = 'pending', failure_reason = NULL, finished_at = NULL,
    updated_at = :now, wait_for = NULL, wait_until = NULL, wait_task = NULL
    WHERE id = :run_id

-- name: PRUNE_RUNS
-- prune: finished runs older than the cutoff, a bounded batch per transaction (their tasks go
-- with them, ON DELETE CASCADE); refused-write evidence older than the cutoff likewise
-- (a child of a live parent stays: its join reads it, B14)
-- (nor a cancelled run whose holder still runs its handler: its lease holds a slot of its
-- limits until the holder ends it, B15; nor a delivery run its webhook names: it stays
-- retryable, B20)
DELETE FROM runs WHERE id IN (
    SELECT id FROM runs AS x WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < :now - :age AND NOT EXISTS (
          SELECT 1 FROM runs AS p WHERE p.id = x.parent_id AND p.status IN ('pending', 'running'))
      AND NOT EXISTS (SELECT 1 FROM leases AS a WHERE a.run_id = x.id
                      AND a.expires_at > :now)
      AND (x.id < 1000000000000000 OR x.id NOT IN (SELECT run_id FROM webhooks))
    LIMIT :limit) RETURNING queue, status

-- name: PRUNE_REJECTIONS
-- Refused-write evidence older than the cutoff goes, a bounded batch per transaction.
DELETE FROM fence_rejections WHERE id IN (
    SELECT id FROM fence_rejections WHERE at < :now - :age ORDER BY id LIMIT :limit)

-- name: COUNT_ENDED
-- finished runs counted as they end, retry and go (``protocol.totals``)
INSERT INTO run_totals (queue, status, shard, n)
    VALUES (:queue, :status, :shard, :n)
    ON CONFLICT (queue, status, shard) DO UPDATE SET n = n + excluded.n

-- name: WORKER_SEEN
-- the worker processes of every host (``protocol.workers``): each heartbeat writes its row; a
-- clean stop deletes it; a row silent for ten of its periods (and a minute) goes at the next
-- worker's start
INSERT INTO workers (owner, host, pid, started_at, heartbeat_at, beat_every,
        slots, queues, version, state, tasks)
    VALUES (:owner, :host, :pid, :started_at, :now, :beat_every, :slots, :queues, :version,
            :state, :tasks)
    ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
        state = excluded.state, slots = excluded.slots

-- name: WORKER_GONE
-- A worker's clean stop deletes its row.
DELETE FROM workers WHERE owner = :owner

-- name: PRUNE_WORKERS
-- The rows of workers silent for ten of their periods (and a minute) go, at a worker's start.
DELETE FROM workers WHERE heartbeat_at < :now - 10 * beat_every - 60

-- name: RUNS_MATCHING
-- A bulk operation's next runs: up to :limit of the users' runs after :after (below :below), in
-- id order, that match every filter given (NULL: any): the status as ``LIST_RUNS`` reads it
-- (:stored, :held, :waiting), live (:live), the run's task, its queue, and created or finished
-- within the last :created_within or :finished_within seconds.
SELECT id FROM runs
    WHERE id > :after AND id < :below
      AND (:stored IS NULL OR status = :stored)
      AND (:live IS NULL OR status IN ('pending', 'running'))
      AND (:held IS NULL OR EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = runs.id AND l.expires_at > :now) = :held)
      AND (:waiting IS NULL OR coalesce(wait_until > :now, 0) = :waiting)
      AND (:task IS NULL OR task = :task)
      AND (:queue IS NULL OR queue = :queue)
      AND (:created_within IS NULL OR created_at >= :now - :created_within)
      AND (:finished_within IS NULL OR finished_at >= :now - :finished_within)
    ORDER BY id LIMIT :limit

-- name: LOCK_KEY
-- A debounced start holds its key until the COMMIT: here the write transaction holds the
-- whole database already, so nothing more is taken.
SELECT 1 WHERE :key IS NOT NULL

-- name: KEY_RUN
-- A debounced start: the run that holds the key, if any.
SELECT id FROM runs WHERE key = :key

-- name: DEBOUNCE_RUN
-- A debounced start: the key's run, pending with its one task never claimed, takes the new
-- payload and is due :delay seconds from now (its head moves with it, by the tasks' triggers);
-- its id, or nothing when it began (or ended) already.
UPDATE tasks SET payload = :payload, available_at = :now + :delay
    WHERE run_id = :run_id AND attempts = 0 AND done_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM leases WHERE run_id = :run_id)
      AND (SELECT count(*) FROM tasks AS u WHERE u.run_id = :run_id) = 1
      AND (SELECT status FROM runs WHERE id = :run_id) = 'pending'
    RETURNING run_id

-- name: RELEASE_KEY
-- A debounced start whose key's run began already: that run goes on without its key, which a
-- new run takes.
UPDATE runs SET key = NULL WHERE id = :run_id

-- name: FORK_SOURCE
-- A fork (B24): the run, how many steps it entered, and its step :step (the :step-th task in id
-- order, NULL columns when it never entered it): the task's name and payload, what it was
-- entered with (NULL: before that was kept), the run's priority and the step's version (B25). Reads only.
SELECT r.id, (SELECT count(*) FROM tasks WHERE run_id = r.id), t.name, t.payload,
        t.input_state, coalesce(t.input_queue, r.queue), r.priority, t.version
    FROM runs AS r LEFT JOIN (SELECT name, payload, input_state, input_queue, version FROM tasks
                              WHERE run_id = :run_id ORDER BY id LIMIT 1 OFFSET :step - 1) AS t ON 1
    WHERE r.id = :run_id
