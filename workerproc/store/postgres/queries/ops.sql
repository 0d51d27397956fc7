-- The PostgreSQL backend's producers, operators, finished-run totals and worker list, each
-- statement named with its one-line purpose (claims and commits are in ``sql``). Operators hold
-- the run row first (``RUN_STATUS ... FOR UPDATE``), then write its tasks and lease.

-- name: RUN_STATUS
-- A run's status and queue: what an operator reads first.
SELECT status, queue FROM runs WHERE id = %(run_id)s FOR UPDATE

-- name: CANCEL_RUN
-- An operator cancels a live run.
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
UPDATE runs SET status = 'cancelled', finished_at = now,
    updated_at = now, head_at = NULL, head_created = NULL, head_id = NULL, line_at = NULL,
        line = NULL FROM clock WHERE id = %(run_id)s AND status IN ('pending')
    RETURNING id

-- name: PENDING_TASKS
-- How many of a run's tasks are not done.
SELECT count(*) FROM tasks WHERE run_id = %(run_id)s AND done_at IS NULL

-- name: RETRY_RUN
-- retry_run: a new attempt generation. attempts keeps counting (the fencing token never
-- repeats); attempt_base restarts what max_attempts bounds; old leases are dropped (RETRY_TASKS)
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
UPDATE runs SET status = 'pending', failure_reason = NULL,
    finished_at = NULL, updated_at = now, wait_for = NULL, wait_until = NULL, wait_task = NULL
    FROM clock WHERE id = %(run_id)s

-- name: ATTEMPTS_DROPPED_BY_RETRY
-- ... the leases still held on the run (a cancelled run's holder) end in the history first ...
INSERT INTO task_attempts (run_id, task_id, attempt, owner,
        claimed_at, ended_at, outcome, error)
    SELECT l.run_id, l.task_id, l.attempts, l.owner, l.claimed_at, clock.now, 'released',
        'the run was retried: this lease was dropped'
    FROM leases AS l,
        (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now) AS
            clock
    WHERE l.run_id = %(run_id)s AND l.owner IS NOT NULL

-- name: RETRY_TASKS
-- ... then the lease goes, every pending task is due at a new generation (counting on from
-- its lease) when a lease still held would have expired (its holder may run on until it
-- hears, and pay within its lease: the new generation begins after it), else now; the run's
-- head is its first one again; idle workers are told
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
dropped AS (DELETE FROM leases WHERE run_id = %(run_id)s
             RETURNING task_id, attempts, owner, expires_at),
retried AS (
    UPDATE tasks AS t SET available_at = greatest(clock.now, coalesce(
            (SELECT max(d.expires_at) FROM dropped AS d WHERE d.owner IS NOT NULL), clock.now)),
        attempts = coalesce((SELECT d.attempts FROM dropped AS d WHERE d.task_id = t.id),
                            t.attempts),
        attempt_base = coalesce((SELECT d.attempts FROM dropped AS d WHERE d.task_id = t.id),
                                t.attempts)
    FROM clock WHERE t.run_id = %(run_id)s AND t.done_at IS NULL
    RETURNING t.available_at, t.created_at, t.id, t.line),
placed AS (
    UPDATE runs SET (head_at, line_at, head_created, head_id, line) = (
        SELECT CASE WHEN line IS NULL THEN available_at END,
            CASE WHEN line IS NOT NULL THEN available_at END, created_at, id, line
        FROM retried ORDER BY available_at, created_at, id LIMIT 1)
    WHERE id = %(run_id)s AND status IN ('pending'))
SELECT id, pg_notify('leasekeeper.' || current_schema(), '') FROM retried

-- name: LOCK_OWNER_RUNS
-- release_owner: the supervisor reaped this owner; its leases expire now. Runs first, in id
-- order (two releases never wait on each other in a cycle), then their leases (``steps``).
SELECT id FROM runs WHERE id IN (
    SELECT run_id FROM leases WHERE owner = %(owner)s) ORDER BY id FOR UPDATE

-- name: RELEASE_OWNER
-- The supervisor reaped this owner: its live leases expire now (after LOCK_OWNER_RUNS), and the
-- gates they held slots of (and the lines those kept closed) may admit again; idle workers are
-- told.
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
expired AS (UPDATE leases AS l SET expires_at = clock.now FROM clock
    WHERE l.owner = %(owner)s AND l.expires_at > clock.now
    RETURNING l.task_id, l.gate_a, l.gate_b, l.gate_c),
freed AS (SELECT gate_a AS gate FROM expired UNION SELECT gate_b FROM expired
          UNION SELECT gate_c FROM expired),
reopened AS (UPDATE gates AS g SET ready_at = least(g.ready_at, g.turn, clock.now),
        blocked_by = CASE WHEN g.gate IN (SELECT gate FROM freed) THEN g.blocked_by END
    FROM clock WHERE g.gate IN (SELECT gate FROM freed) OR g.blocked_by IN (SELECT gate FROM freed))
SELECT task_id, pg_notify('leasekeeper.' || current_schema(), '') FROM expired

-- name: PRUNE_RUNS
-- prune: finished runs older than the cutoff, a bounded batch per transaction (their tasks and
-- attempt history go with them, ON DELETE CASCADE; a lease a cancelled run kept, explicitly);
-- each deleted run answers its queue and status (the totals count it out)
-- (a child of a live parent stays: its join reads it, B14; so does a cancelled run whose holder
-- still runs its handler: its lease holds a slot of its limits until the holder ends it, B15;
-- and a delivery run its webhook names: it stays retryable, B20)
WITH doomed AS MATERIALIZED (
    SELECT id FROM runs AS x
        WHERE finished_at < (SELECT
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) - %(age)s
      AND NOT EXISTS (SELECT 1 FROM runs AS p WHERE p.id = x.parent_id
                      AND p.status = 'pending')
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = x.id AND l.owner IS NOT NULL
                      AND l.expires_at > (SELECT
                          coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)))
      AND (x.id < 1000000000000000 OR x.id NOT IN (SELECT run_id FROM webhooks))
    ORDER BY finished_at LIMIT %(limit)s FOR UPDATE OF x SKIP LOCKED),
gone_leases AS (DELETE FROM leases WHERE run_id IN (SELECT id FROM doomed))
DELETE FROM runs WHERE id IN (SELECT id FROM doomed) RETURNING queue, status

-- name: PRUNE_REJECTIONS
-- Refused-write evidence older than the cutoff goes, a bounded batch per transaction.
DELETE FROM fence_rejections WHERE id IN (
    SELECT id FROM fence_rejections
        WHERE at < (SELECT
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) - %(age)s
    ORDER BY at LIMIT %(limit)s) RETURNING id

-- name: COUNT_ENDED
-- finished runs counted as they end, retry and go (``protocol.totals``): one row per queue,
-- status and shard (a writer picks a shard at random, so two seldom wait on one row)
INSERT INTO run_totals AS o (queue, status, shard, n)
    VALUES (%(queue)s, %(status)s, %(shard)s, %(n)s)
    ON CONFLICT (queue, status, shard) DO UPDATE SET n = o.n + excluded.n

-- name: WORKER_SEEN
-- the worker processes of every host (``protocol.workers``): each heartbeat writes its row (a
-- HOT update: no index changes); a clean stop deletes it; a row silent for ten of its periods
-- (and a minute) goes at the next worker's start
INSERT INTO workers AS w (owner, host, pid, started_at, heartbeat_at,
        beat_every, slots, queues, version, state, tasks)
    VALUES (%(owner)s, %(host)s, %(pid)s, %(started_at)s,
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8), %(beat_every)s,
            %(slots)s,
            %(queues)s, %(version)s, %(state)s, %(tasks)s)
    ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
        state = excluded.state, slots = excluded.slots

-- name: WORKER_GONE
-- A worker's clean stop deletes its row.
DELETE FROM workers WHERE owner = %(owner)s

-- name: PRUNE_WORKERS
-- The rows of workers silent for ten of their periods (and a minute) go, at a worker's start.
DELETE FROM workers
    WHERE heartbeat_at < coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) -
        10 * beat_every - 60

-- name: SNAPSHOT
-- the server's snapshot: it changes when any transaction on the server ends (a poller's token)
SELECT pg_current_snapshot()::text

-- name: NOW
-- the store's clock: the database's (or the injected one, handed back)
SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)

-- name: INSERT_RUNS
-- Every run of the batch in one statement. Run and first-task ids are drawn from their
-- sequences in the items' order first (a system run's, B20, from the system's own), so ids
-- follow the items and each run is inserted with its head already set (no second write); a key
-- already taken (by a run that exists, or by an earlier item of the same batch) inserts nothing
-- and FIND_BY_KEYS, a second statement with a fresh snapshot, answers the first run's id.
-- ``{s}``: the schema prefix (empty on our own connections, whose search path is the schema;
-- the caller's connection gets qualified names); ``{channel}``: the schema's notification
-- channel, as an SQL expression.
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
i AS MATERIALIZED (
    SELECT i.*, CASE WHEN i.system THEN nextval('{s}system_run_ids')
                     ELSE nextval(pg_get_serial_sequence('{s}runs', 'id')) END AS id,
        nextval(pg_get_serial_sequence('{s}tasks', 'id')) AS task_id
    FROM unnest(%(states)s::text[], %(tasks)s::text[], %(payloads)s::text[],
                %(delays)s::float8[], %(keys)s::text[], %(queues)s::text[],
                %(priorities)s::int[], %(lines)s::text[], %(gates_a)s::text[],
                %(gates_b)s::text[], %(gates_c)s::text[], %(tokens)s::int[],
                %(traceparents)s::text[], %(systems)s::bool[], %(versions)s::int[])
         WITH ORDINALITY AS i(state, task, payload, delay, key, queue, priority, line, gate_a,
                              gate_b, gate_c, tokens, traceparent, system, version, n)
    ORDER BY i.n),
new_runs AS (
    INSERT INTO {s}runs (id, state, task, queue, priority, key, created_at, updated_at,
                           head_at, line_at, head_created, head_id, line, traceparent)
    SELECT i.id, i.state::json, i.task, i.queue, i.priority, i.key, clock.now, clock.now,
        CASE WHEN i.line IS NULL THEN clock.now + i.delay END,
        CASE WHEN i.line IS NOT NULL THEN clock.now + i.delay END, clock.now, i.task_id, i.line,
        i.traceparent
    FROM i, clock ORDER BY i.n
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING RETURNING id),
first_tasks AS (
    INSERT INTO {s}tasks (id, run_id, name, payload, available_at, created_at, line, gate_a,
                            gate_b, gate_c, tokens, input_state, input_queue, version)
    SELECT i.task_id, i.id, i.task, i.payload::json, clock.now + i.delay, clock.now, i.line,
        i.gate_a, i.gate_b, i.gate_c, i.tokens, i.state::json, i.queue, i.version
    FROM i JOIN new_runs USING (id), clock ORDER BY i.n),
enqueued AS (
    INSERT INTO {s}events (at, run_id, kind, task, data)
    SELECT clock.now, i.id, 'run.enqueued', i.task, json_strip_nulls(json_build_object(
        'queue', i.queue, 'key', i.key, 'delay', nullif(i.delay, 0)))
    FROM i JOIN new_runs USING (id), clock ORDER BY i.n)
SELECT i.id, new_runs.id IS NOT NULL,
    CASE WHEN new_runs.id IS NOT NULL THEN pg_notify({channel}, '') END
FROM i LEFT JOIN new_runs USING (id) ORDER BY i.n

-- name: FIND_BY_KEYS
-- The runs of these keys (a key already taken inserts nothing: this answers its run). ``{s}``: the
-- schema prefix, as INSERT_RUNS.
SELECT key, id FROM {s}runs WHERE key = ANY(%(keys)s::text[])

-- name: WATCH_RUN
-- wait(): from now on, this run's end sends a NOTIFY on the end channel
UPDATE runs SET watched = true WHERE id = %(run_id)s AND NOT watched

-- name: CALLERS_DATABASE
-- transactional enqueue: the caller's connection reaches our schema, at our version, in our
-- database; whether the version table numbers the shared history (named rows) or is from
-- before it (schema.LEGACY_VERSIONS)
SELECT current_database(),
    (SELECT max(version) FROM {s}leasekeeper_schema),
    EXISTS (SELECT FROM pg_attribute WHERE attrelid = '{s}leasekeeper_schema'::regclass
            AND attname = 'name' AND NOT attisdropped)

-- name: SET_TASK_OPTIONS
-- A worker declares a task's options (B11).
INSERT INTO task_options (name, options, updated_at)
    VALUES (%(name)s, %(options)s::json,
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    ON CONFLICT (name) DO UPDATE SET options = excluded.options, updated_at = excluded.updated_at

-- name: DROP_TASK_OPTIONS
-- A task's options go.
DELETE FROM task_options WHERE name = %(name)s

-- name: RUNS_MATCHING
-- A bulk operation's next runs: up to %(limit)s of the users' runs after %(after)s (below
-- %(below)s), in id order, that match every filter given (NULL: any): the status as
-- ``LIST_RUNS`` reads it (%(stored)s, %(held)s, %(waiting)s), live (%(live)s), the run's task,
-- its queue, and created or finished within the last %(created_within)s or
-- %(finished_within)s seconds. Read without a lock: each run is then held (``RUN_STATUS``).
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
SELECT r.id FROM runs AS r, clock
    WHERE r.id > %(after)s AND r.id < %(below)s
      AND (%(stored)s::text IS NULL OR r.status = %(stored)s::text)
      AND (%(live)s::boolean IS NULL OR r.status IN ('pending', 'running'))
      AND (%(held)s::boolean IS NULL OR EXISTS (SELECT 1 FROM leases AS l
            WHERE l.run_id = r.id AND l.owner IS NOT NULL
              AND l.expires_at > clock.now) = %(held)s::boolean)
      AND (%(waiting)s::boolean IS NULL
           OR coalesce(r.wait_until > clock.now, false) = %(waiting)s::boolean)
      AND (%(task)s::text IS NULL OR r.task = %(task)s::text)
      AND (%(queue)s::text IS NULL OR r.queue = %(queue)s::text)
      AND (%(created_within)s::float8 IS NULL
           OR r.created_at >= clock.now - %(created_within)s::float8)
      AND (%(finished_within)s::float8 IS NULL
           OR r.finished_at >= clock.now - %(finished_within)s::float8)
    ORDER BY r.id LIMIT %(limit)s

-- name: LOCK_KEY
-- A debounced start holds its key until the COMMIT (a transaction-scoped advisory lock on the
-- key's hash, in a class of leasekeeper's own): debounced starts of one key take turns, so two
-- never both find the key's run begun and race each other's inserts.
SELECT pg_advisory_xact_lock(hashtext('leasekeeper.debounce'), hashtext(%(key)s))

-- name: KEY_RUN
-- A debounced start: the run that holds the key, if any, held (its row locked: a claim skips
-- it until the COMMIT, so it cannot begin under the statements that follow). ``{s}``: the
-- schema prefix, as INSERT_RUNS.
SELECT id FROM {s}runs WHERE key = %(key)s FOR UPDATE

-- name: DEBOUNCE_RUN
-- A debounced start: the key's run (held), pending with its one task never claimed (no lease
-- row: not even one handed back), takes the new payload and is due %(delay)s seconds from now,
-- its head moved with it; its id, or nothing when it began (or ended) already. ``{s}``: the
-- schema prefix.
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
moved AS (
    UPDATE {s}tasks AS t SET payload = %(payload)s::json, available_at = clock.now + %(delay)s
    FROM clock
    WHERE t.run_id = %(run_id)s AND t.attempts = 0 AND t.done_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM {s}leases AS l WHERE l.run_id = t.run_id)
      AND (SELECT count(*) FROM {s}tasks AS u WHERE u.run_id = t.run_id) = 1
      AND EXISTS (SELECT 1 FROM {s}runs AS r WHERE r.id = t.run_id AND r.status = 'pending')
    RETURNING t.run_id, t.available_at, t.line)
UPDATE {s}runs AS r
    SET head_at = CASE WHEN m.line IS NULL THEN m.available_at END,
        line_at = CASE WHEN m.line IS NOT NULL THEN m.available_at END, updated_at = clock.now
    FROM moved AS m, clock WHERE r.id = m.run_id
    RETURNING r.id

-- name: RELEASE_KEY
-- A debounced start whose key's run began already: that run goes on without its key, which a
-- new run takes. ``{s}``: the schema prefix.
UPDATE {s}runs SET key = NULL WHERE id = %(run_id)s

-- name: FORK_SOURCE
-- A fork (B24): the run, how many steps it entered, and its step %(step)s (the step-th task in
-- id order, NULL columns when it never entered it): the task's name and payload, what it was
-- entered with (NULL: before that was kept), the run's priority and the step's version (B25). Reads only: nothing of the
-- run is locked.
SELECT r.id, (SELECT count(*) FROM tasks WHERE run_id = r.id), t.name, t.payload::text,
        t.input_state::text, coalesce(t.input_queue, r.queue), r.priority, t.version
    FROM runs AS r LEFT JOIN (SELECT name, payload, input_state, input_queue, version FROM tasks
                              WHERE run_id = %(run_id)s ORDER BY id
                              LIMIT 1 OFFSET %(step)s::bigint - 1) AS t ON true
    WHERE r.id = %(run_id)s
