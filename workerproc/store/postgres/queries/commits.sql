-- PostgreSQL's fenced commits of one lease each (docs/protocol.md R2, R5), and the attempt
-- history; the batched completions (FINISH, ADVANCE, RELEASE, HANDBACK, SET_STATE) are composed
-- in Python (``batch_sql``: a VALUES row per commit of the batch), and ACK is TASK_DONE then
-- SUCCEED_IF_EMPTY for each commit (``steps.ack``).
--
-- Fenced statements lock the run row FIRST (the ``run`` CTE) and read "now" only after that
-- lock is held (the ``clock`` CTE; ``%(now)s`` is NULL in production: the database clock), so
-- a write that waited behind another is judged at the instant it got its turn. The fence: the
-- lease (``i``: its run id, task id, attempt and owner) matches the lease row ``l`` and its
-- expiry is ahead of "now"; zero rows means the caller's lease is lost. A lease that ends is
-- deleted (``fenced``), and what it counted is written on its task, once.

-- name: LOCK_RUNS
-- a batch locks its runs in id order before its first write (two batches never wait on each
-- other in a cycle); each statement's own lock of its run is then a no-op
SELECT id FROM runs WHERE id = ANY(%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE

-- name: CHECK_FENCE
-- every fenced commit that is not one statement first asks: is this lease still the live one?
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now
    FROM run)
SELECT l.run_id FROM leases AS l, clock,
    (SELECT %(run_id)s::bigint AS run_id, %(task_id)s::bigint AS task_id,
    %(attempt)s::int AS attempt, %(owner)s::text AS owner) AS i
    WHERE l.run_id = i.run_id AND l.task_id = i.task_id AND l.attempts = i.attempt
    AND l.owner = i.owner AND l.expires_at > clock.now

-- name: SET_VERSION
-- migrate (B25): the claimed task moves to the version its run's state was migrated to, in the
-- transaction whose fenced compare-and-set (SET_STATE) wrote that state: written only once the
-- fence held. What the step was entered with (B24) becomes the migrated state, so that a fork
-- from this step gets a state and a version that go together.
UPDATE tasks SET version = %(version)s,
        input_state = CASE WHEN input_state IS NULL THEN NULL ELSE %(state)s::json END
    WHERE id = %(task_id)s AND run_id = %(run_id)s

-- name: TASK_DONE
-- ack / drop: the task is done (its lease goes, who held it stays on the task); a run still
-- alive moves its head to its next pending task in R1 order, if any (a head with limits puts
-- the run in its line, not in the claim index), and idle workers hear of it. The run is
-- named by its key (``r.id = %(run_id)s``): joined to ``fenced`` only, it was planned as a walk
-- of runs_status, every dead 'pending' entry of it, while another client held the horizon back
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now
    FROM run),
fenced AS MATERIALIZED (
    DELETE FROM leases AS l USING clock,
        (SELECT %(run_id)s::bigint AS run_id, %(task_id)s::bigint AS task_id,
    %(attempt)s::int AS attempt, %(owner)s::text AS owner) AS i
    WHERE l.run_id = i.run_id AND l.task_id = i.task_id AND l.attempts = i.attempt
    AND l.owner = i.owner AND l.expires_at > clock.now RETURNING l.*),
done AS (
    UPDATE tasks AS t SET done_at = clock.now, done_attempt = %(attempt)s,
        done_owner = %(owner)s, attempts = f.attempts, attempt_base = f.attempt_base,
        claimed_at = f.claimed_at
    FROM fenced AS f, clock WHERE t.id = f.task_id),
moved AS (
    UPDATE runs AS r SET (head_at, line_at, head_created, head_id, line) = (
        SELECT CASE WHEN f.line IS NULL THEN f.a END, CASE WHEN f.line IS NOT NULL THEN f.a END,
            f.c, f.i, f.line
        FROM (SELECT h.available_at AS a, h.created_at AS c, h.id AS i, h.line AS line
              FROM tasks AS h WHERE h.run_id = r.id AND h.done_at IS NULL
                AND h.id <> f.task_id) AS f
        ORDER BY f.a, f.c, f.i LIMIT 1), updated_at = clock.now
    FROM fenced AS f, clock WHERE r.id = %(run_id)s AND r.id = f.run_id
      AND r.status IN ('pending')
    RETURNING r.head_id)
SELECT f.task_id,
    (SELECT pg_notify('leasekeeper.' || current_schema(), '') FROM moved
     WHERE head_id IS NOT NULL)
FROM fenced AS f

-- name: INSERT_REJECTION
-- every refused fenced write is kept: evidence that a zombie tried and was turned away
INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    SELECT now, %(task_id)s, %(run_id)s, %(owner)s, %(attempt)s, %(op)s
    FROM (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
          AS now) AS clock

-- name: SUCCEED_IF_EMPTY
-- ack (after TASK_DONE): a run whose last task is acknowledged has succeeded (its head columns and its line
-- cleared)
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
UPDATE runs SET status = 'succeeded', finished_at = now, updated_at = now,
    head_at = NULL, head_created = NULL, head_id = NULL, line_at = NULL, line = NULL
    FROM clock
    WHERE id = %(run_id)s AND status IN ('pending')
      AND NOT EXISTS (SELECT 1 FROM tasks WHERE run_id = %(run_id)s AND done_at IS NULL)

-- name: TASK_FAILED
-- fail (fenced): the holder fails its run (FAIL_RUN first); its lease goes, the task keeps its
-- place for retry_run
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now
    FROM run),
fenced AS MATERIALIZED (
    DELETE FROM leases AS l USING clock,
        (SELECT %(run_id)s::bigint AS run_id, %(task_id)s::bigint AS task_id,
    %(attempt)s::int AS attempt, %(owner)s::text AS owner) AS i
    WHERE l.run_id = i.run_id AND l.task_id = i.task_id AND l.attempts = i.attempt
    AND l.owner = i.owner AND l.expires_at > clock.now RETURNING l.*)
UPDATE tasks AS t SET last_error = coalesce(%(error)s, t.last_error), attempts = f.attempts,
    attempt_base = f.attempt_base, claimed_at = f.claimed_at
    FROM fenced AS f WHERE t.id = f.task_id RETURNING t.id

-- name: ATTEMPT_ENDED
-- the attempt history, written on the unhappy paths only (never on claim -> commit): an
-- exhausted claim or a failure ends the lease's attempt without a commit; read from the lease
-- before the statement that ends it (the fence was checked already)
INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at,
        ended_at, outcome, error)
    SELECT l.run_id, l.task_id, l.attempts, l.owner, l.claimed_at, clock.now, %(outcome)s,
        %(error)s
    FROM leases AS l,
        (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
         AS now) AS clock
    WHERE l.run_id = %(run_id)s AND l.task_id = %(task_id)s AND l.owner IS NOT NULL
