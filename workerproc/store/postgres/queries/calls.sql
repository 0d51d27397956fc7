-- PostgreSQL's statements for paid calls (docs/protocol.md B13): a step's expensive
-- call (``ctx.once``) kept the moment it returned, so the next attempt of the same step reuses it.
--
-- A call is kept by any attempt of its step while the run is alive and the step not done, even
-- one whose lease was lost (it was paid for: an observation, not a state change); the first
-- kept answer wins (a racing insert waits for the first and then does nothing) and a later one
-- is counted on the winner's row as paid, unused.

-- name: FIND_CALL
-- the stored answer of this step's call, if any
SELECT result::text, attempt, tokens FROM paid_calls WHERE run_id = %(run_id)s
    AND task_id = %(task_id)s AND name = %(name)s
      AND request_hash = %(request_hash)s

-- name: COUNT_REUSE
-- ... and that it was used again
UPDATE paid_calls SET reused = reused + 1 WHERE run_id = %(run_id)s AND task_id = %(task_id)s
    AND name = %(name)s
      AND request_hash = %(request_hash)s

-- name: KEEP_CALL
-- keep a paid answer: only while the run is alive and its step not done; the first one wins
INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    SELECT %(run_id)s, %(task_id)s, %(name)s, %(request_hash)s, %(result)s::json,
        %(attempt)s, %(owner)s, %(tokens)s,
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
    WHERE EXISTS (SELECT 1 FROM runs AS r JOIN tasks AS t ON t.run_id = r.id
                  WHERE r.id = %(run_id)s AND t.id = %(task_id)s AND r.status IN ('pending')
                    AND t.done_at IS NULL)
    ON CONFLICT DO NOTHING RETURNING 1

-- name: CALL_LOSER
-- a later answer to a kept call: counted on the winner as paid, unused; the winner returned
UPDATE paid_calls SET unused = unused + 1,
        unused_tokens = unused_tokens + coalesce(%(tokens)s::bigint, 0)
    WHERE run_id = %(run_id)s AND task_id = %(task_id)s AND name = %(name)s
      AND request_hash = %(request_hash)s
    RETURNING result::text, attempt, tokens

-- name: RUN_CALLS
-- what ``show`` and the dashboard list, in the order they were paid
SELECT task_id, name, request_hash, attempt, owner, tokens, at, reused, unused,
        unused_tokens
    FROM paid_calls WHERE run_id = %(run_id)s ORDER BY at, task_id, name LIMIT %(limit)s

-- name: FORGET_CALL
-- drop a run's calls by name, for a fresh call
DELETE FROM paid_calls WHERE run_id = %(run_id)s AND name = %(name)s RETURNING 1

-- name: CALL_TOTALS
-- every kept call's numbers, for metrics and the chaos report
SELECT count(*), coalesce(sum(reused), 0), coalesce(sum(unused), 0),
        coalesce(sum(tokens), 0), coalesce(sum(reused * coalesce(tokens, 0)), 0),
        coalesce(sum(unused_tokens), 0)
    FROM paid_calls

-- name: LOCK_CALL
-- the run's calls begin one at a time (the run row first, as the schema's lock order says): two
-- attempts racing on one call (a paused worker wakes while its successor calls) must each see
-- the other's intent, so the second is counted as a payment again. NO KEY UPDATE: inserts that
-- only reference the run (a keep, an intent) do not wait for it
SELECT id FROM runs WHERE id = %(run_id)s FOR NO KEY UPDATE

-- name: EARLIER_INTENTS
-- the earlier intents of this call: how many, and how many are open (no answer, not settled)
SELECT count(*),
        count(*) FILTER (WHERE answered_at IS NULL AND settled IS NULL)
    FROM call_intents WHERE run_id = %(run_id)s AND task_id = %(task_id)s AND name = %(name)s
      AND request_hash = %(request_hash)s

-- name: INSERT_INTENT
-- the intent, only under this attempt's live lease on a live run: a paid call begins only on
-- a lease the database holds at that moment; and how long that lease has left (the caller
-- calls fn only within it)
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
held AS MATERIALIZED (
    SELECT l.expires_at - clock.now AS left_s
    FROM clock, leases AS l JOIN runs AS r ON r.id = l.run_id
    WHERE l.task_id = %(task_id)s AND l.run_id = %(run_id)s AND l.owner = %(owner)s
      AND l.attempts = %(attempt)s AND l.expires_at > clock.now AND r.status IN ('pending')),
made AS (
    INSERT INTO call_intents (run_id, task_id, name, request_hash, attempt, owner, again, at)
    SELECT %(run_id)s, %(task_id)s, %(name)s, %(request_hash)s, %(attempt)s, %(owner)s,
        %(again)s, clock.now
    FROM clock, held RETURNING id)
SELECT made.id, held.left_s FROM made, held

-- name: ANSWER_INTENT
-- the intent's answer reached the database (once: a retried keep finds it answered)
UPDATE call_intents SET answered_at =
    coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
    WHERE id = %(intent)s AND answered_at IS NULL RETURNING id

-- name: KEPT_ANSWER
-- the kept answer of a call, whoever kept it (a retried keep whose first try landed)
SELECT result::text, attempt, tokens, owner FROM paid_calls WHERE run_id = %(run_id)s
    AND task_id = %(task_id)s AND name = %(name)s
      AND request_hash = %(request_hash)s

-- name: INSERT_USAGE
-- What was used: a paid call's tokens and cost, kept with its answer, or an execution's
-- ``ctx.usage``, kept with its commit.
INSERT INTO usage (run_id, task_id, task, attempt, name, tokens, cost, at)
    VALUES (%(run_id)s, %(task_id)s, %(task)s, %(attempt)s, %(name)s, %(tokens)s, %(cost)s,
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))

-- name: MARK_PARKED
-- the parking attempt gave its task back (RELEASE, not due before the deadline): the run waits
-- for ``wait_for`` (``outcome_unknown:NAME``) on that task
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
    clock AS MATERIALIZED (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now FROM run)
UPDATE runs AS r SET wait_for = %(wait_for)s, wait_until = clock.now + %(delay)s,
    wait_task = %(task_id)s FROM clock WHERE r.id = %(run_id)s RETURNING r.id

-- name: UNPARK
-- the parked task is due now, the run waits no more, its head is that task, and idle workers
-- are told (a resolve, or a late answer kept)
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
    clock AS MATERIALIZED (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now FROM run),
found AS MATERIALIZED (
    SELECT r.wait_task AS task_id, t.created_at, t.line FROM runs AS r
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL
    WHERE r.id = %(run_id)s AND r.status IN ('pending') AND r.wait_for = %(wait_for)s
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.task_id = t.id)),
due AS (UPDATE tasks AS t SET available_at = clock.now FROM found AS f, clock
    WHERE t.id = f.task_id),
over AS (UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL, (head_at,
    line_at, head_created, head_id, line) = (
        SELECT CASE WHEN f.line IS NULL THEN f.a END, CASE WHEN f.line IS NOT NULL THEN f.a END,
            f.c, f.i, f.line
        FROM (SELECT h.available_at AS a, h.created_at AS c, h.id AS i, h.line AS line
              FROM tasks AS h WHERE h.run_id = r.id AND h.done_at IS NULL
                  AND h.id <> f.task_id UNION ALL SELECT clock.now, f.created_at, f.task_id,
                      f.line) AS f
        ORDER BY f.a, f.c, f.i LIMIT 1)
    FROM found AS f, clock WHERE r.id = %(run_id)s RETURNING r.id)
SELECT task_id, (SELECT pg_notify('leasekeeper.' || current_schema(), '') FROM over) FROM found

-- name: FORGET_INTENTS
-- an operator's fresh start (``forget``): the name's calls without an answer stop nothing now
UPDATE call_intents SET settled = 'pay_again'
    WHERE run_id = %(run_id)s AND name = %(name)s AND answered_at IS NULL AND settled IS NULL

-- name: CALL_TO_RESOLVE
-- the newest call of this name in the run (what ``resolve`` answers)
SELECT task_id, request_hash, attempt FROM call_intents
    WHERE run_id = %(run_id)s AND name = %(name)s ORDER BY id DESC LIMIT 1

-- name: SETTLE_INTENTS
-- An operator settles this call's open intents (``resolve``: answer, or pay again).
UPDATE call_intents SET settled = %(settled)s
    WHERE run_id = %(run_id)s AND task_id = %(task_id)s AND name = %(name)s
      AND request_hash = %(request_hash)s AND answered_at IS NULL AND settled IS NULL

-- name: RESOLVE_CALL
-- An operator's answer to a parked call, kept as the call's answer (a kept one wins).
INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    VALUES (%(run_id)s, %(task_id)s, %(name)s, %(request_hash)s, %(result)s::json, %(attempt)s,
            %(owner)s, NULL,
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    ON CONFLICT DO NOTHING RETURNING 1

-- name: RUN_INTENTS
-- A run's intents in the order they were made (the timeline), each with whether its outcome is
-- unknown: unanswered, and its attempt no longer holds a live lease.
SELECT i.task_id, i.name, i.request_hash, i.attempt, i.owner, i.again, i.at,
        i.answered_at, i.settled, (i.answered_at IS NULL AND NOT EXISTS (SELECT 1 FROM leases AS l
            WHERE l.task_id = i.task_id
    AND l.owner = i.owner AND l.attempts = i.attempt
        AND l.expires_at >
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)))
    FROM call_intents AS i WHERE i.run_id = %(run_id)s ORDER BY i.id LIMIT %(limit)s

-- name: INTENT_TOTALS
-- Every intent's numbers: made, made again, unknown (metrics and the chaos report).
SELECT count(*), count(*) FILTER (WHERE i.again),
        count(*) FILTER (WHERE (i.answered_at IS NULL AND NOT EXISTS (SELECT 1 FROM leases AS l
            WHERE l.task_id = i.task_id
    AND l.owner = i.owner AND l.attempts = i.attempt
        AND l.expires_at >
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))))
    FROM call_intents AS i

-- name: RUN_INTENT_COUNTS
-- A run's intents per call (``show``): made, made again, unknown, and the first one's time.
SELECT i.task_id, i.name, i.request_hash, count(*),
        count(*) FILTER (WHERE i.again), count(*) FILTER (WHERE (i.answered_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.task_id = i.task_id
    AND l.owner = i.owner AND l.attempts = i.attempt
        AND l.expires_at >
            coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)))), min(i.at)
    FROM call_intents AS i WHERE i.run_id = %(run_id)s
    GROUP BY i.task_id, i.name, i.request_hash

-- name: SPEND_BY_TASK
-- Tokens and cost kept since a moment, per task, the dearest first.
SELECT u.task, count(*), count(u.name), coalesce(sum(u.tokens), 0), sum(u.cost)
    FROM usage AS u  WHERE u.at >= %(since)s GROUP BY 1
    ORDER BY coalesce(sum(u.cost), 0) DESC, coalesce(sum(u.tokens), 0) DESC, 1
    LIMIT %(limit)s

-- name: SPEND_BY_FIELD
-- Tokens and cost kept since a moment, per value of a field of the task's payload, the dearest
-- first.
SELECT t.payload ->> %(field)s, count(*), count(u.name), coalesce(sum(u.tokens), 0), sum(u.cost)
    FROM usage AS u JOIN tasks AS t ON t.id = u.task_id WHERE u.at >= %(since)s GROUP BY 1
    ORDER BY coalesce(sum(u.cost), 0) DESC, coalesce(sum(u.tokens), 0) DESC, 1
    LIMIT %(limit)s

-- name: STORE_IDENTITY
-- this database's identity (``once_key``)
SELECT id FROM store_identity
