-- SQLite's statements for paid calls (docs/protocol.md B13): a step's expensive call
-- (``ctx.once``) kept the moment it returned, so the next attempt of the same step reuses it.
--
-- A call is kept by any attempt of its step while the run is alive and the step not done, even
-- one whose lease was lost (it was paid for: an observation, not a state change); the first
-- kept answer wins and a later one is counted on the winner's row as paid, unused.

-- name: FIND_CALL
-- the stored answer of this step's call, if any
SELECT result, attempt, tokens FROM paid_calls
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash

-- name: COUNT_REUSE
-- ... and that it was used again
UPDATE paid_calls SET reused = reused + 1
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash

-- name: KEEP_CALL
-- keep a paid answer: only while the run is alive and its step not done; the first one wins
INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    SELECT :run_id, :task_id, :name, :request_hash, :result, :attempt, :owner, :tokens, :now
    WHERE EXISTS (SELECT 1 FROM runs AS r JOIN tasks AS t ON t.run_id = r.id
                  WHERE r.id = :run_id AND t.id = :task_id AND r.status IN ('pending', 'running')
                    AND t.done_at IS NULL)
    ON CONFLICT DO NOTHING RETURNING 1

-- name: CALL_LOSER
-- a later answer to a kept call: counted on the winner as paid, unused; the winner returned
UPDATE paid_calls SET unused = unused + 1,
        unused_tokens = unused_tokens + coalesce(:tokens, 0)
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash
    RETURNING result, attempt, tokens

-- name: RUN_CALLS
-- what ``show`` and the dashboard list, in the order they were paid
SELECT task_id, name, request_hash, attempt, owner, tokens, at, reused, unused,
        unused_tokens
    FROM paid_calls WHERE run_id = :run_id ORDER BY at, task_id, name LIMIT :limit

-- name: FORGET_CALL
-- drop a run's calls by name, for a fresh call
DELETE FROM paid_calls WHERE run_id = :run_id AND name = :name RETURNING 1

-- name: CALL_TOTALS
-- every kept call's numbers, for metrics and the chaos report
SELECT count(*), coalesce(sum(reused), 0), coalesce(sum(unused), 0),
        coalesce(sum(tokens), 0), coalesce(sum(reused * coalesce(tokens, 0)), 0),
        coalesce(sum(unused_tokens), 0)
    FROM paid_calls

-- name: LOCK_CALL
-- the step's calls begin one at a time: SQLite's write transaction holds the database's write
-- lock already, so this only reads the run (PostgreSQL locks it)
SELECT id FROM runs WHERE id = :run_id

-- name: EARLIER_INTENTS
-- the earlier intents of this call: how many, and how many are open (no answer, not settled)
SELECT count(*), coalesce(sum(answered_at IS NULL AND settled IS NULL), 0)
    FROM call_intents WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash

-- name: INSERT_INTENT
-- the intent, only under this attempt's live lease on a live run: a paid call begins only on
-- a lease the database holds at that moment; and how long that lease has left (the caller
-- calls fn only within it)
INSERT INTO call_intents (run_id, task_id, name, request_hash, attempt, owner,
        again, at)
    SELECT :run_id, :task_id, :name, :request_hash, :attempt, :owner, :again, :now
    WHERE EXISTS (SELECT 1 FROM leases AS l JOIN runs AS r ON r.id = l.run_id
                  WHERE l.run_id = :run_id AND l.task_id = :task_id AND l.owner = :owner
                    AND l.attempts = :attempt AND l.expires_at > :now
                    AND r.status IN ('pending', 'running'))
    RETURNING id, (SELECT expires_at FROM leases WHERE run_id = :run_id) - :now

-- name: ANSWER_INTENT
-- the intent's answer reached the database (once: a retried keep finds it answered)
UPDATE call_intents SET answered_at = :now
    WHERE id = :intent AND answered_at IS NULL RETURNING id

-- name: KEPT_ANSWER
-- the kept answer of a call, whoever kept it (a retried keep whose first try landed)
SELECT result, attempt, tokens, owner FROM paid_calls WHERE run_id = :run_id AND task_id = :task_id
    AND name = :name
      AND request_hash = :request_hash

-- name: INSERT_USAGE
-- What was used: a paid call's tokens and cost, kept with its answer, or an execution's
-- ``ctx.usage``, kept with its commit.
INSERT INTO usage (run_id, task_id, task, attempt, name, tokens, cost, at)
    VALUES (:run_id, :task_id, :task, :attempt, :name, :tokens, :cost, :now)

-- name: MARK_PARKED
-- the parking attempt gave its task back (RELEASE, not due before the deadline): the run waits
-- for ``:wait_for`` (``outcome_unknown:NAME``) on that task
UPDATE runs SET wait_for = :wait_for, wait_until = :now + :delay,
    wait_task = :task_id WHERE id = :run_id

-- name: UNPARK_TASK
-- the parked task is due now, and the run waits no more (a resolve, or a late answer kept)
UPDATE tasks SET available_at = :now WHERE id = (
        SELECT wait_task FROM runs WHERE id = :run_id AND wait_for = :wait_for
          AND status IN ('pending', 'running'))
      AND done_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = :run_id AND l.task_id = tasks.id)
    RETURNING id

-- name: UNPARKED
-- The parked run waits no more (after UNPARK_TASK made its task due).
UPDATE runs SET wait_for = NULL, wait_until = NULL, wait_task = NULL WHERE id = :run_id

-- name: FORGET_INTENTS
-- an operator's fresh start (``forget``): the name's calls without an answer stop nothing now
UPDATE call_intents SET settled = 'pay_again'
    WHERE run_id = :run_id AND name = :name AND answered_at IS NULL AND settled IS NULL

-- name: CALL_TO_RESOLVE
-- the newest open or unanswered call of this name in the run (what ``resolve`` answers)
SELECT task_id, request_hash, attempt FROM call_intents
    WHERE run_id = :run_id AND name = :name ORDER BY id DESC LIMIT 1

-- name: SETTLE_INTENTS
-- An operator settles this call's open intents (``resolve``: answer, or pay again).
UPDATE call_intents SET settled = :settled
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash AND answered_at IS NULL AND settled IS NULL

-- name: RESOLVE_CALL
-- An operator's answer to a parked call, kept as the call's answer (a kept one wins).
INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    VALUES (:run_id, :task_id, :name, :request_hash, :result, :attempt, :owner, NULL, :now)
    ON CONFLICT DO NOTHING RETURNING 1

-- name: RUN_INTENTS
-- A run's intents in the order they were made (the timeline), each with whether its outcome is
-- unknown: unanswered, and its attempt no longer holds a live lease.
SELECT i.task_id, i.name, i.request_hash, i.attempt, i.owner, i.again, i.at,
        i.answered_at, i.settled, (i.answered_at IS NULL AND NOT EXISTS (SELECT 1 FROM leases AS t
            WHERE t.run_id = i.run_id AND t.task_id = i.task_id
    AND t.owner = i.owner AND t.attempts = i.attempt AND t.expires_at > :now))
    FROM call_intents AS i WHERE i.run_id = :run_id ORDER BY i.id LIMIT :limit

-- name: INTENT_TOTALS
-- Every intent's numbers: made, made again, unknown (metrics and the chaos report).
SELECT count(*), coalesce(sum(i.again), 0), coalesce(sum((i.answered_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM leases AS t WHERE t.run_id = i.run_id
    AND t.task_id = i.task_id AND t.owner = i.owner AND t.attempts = i.attempt
    AND t.expires_at > :now))), 0)
    FROM call_intents AS i

-- name: RUN_INTENT_COUNTS
-- A run's intents per call (``show``): made, made again, unknown, and the first one's time.
SELECT i.task_id, i.name, i.request_hash, count(*),
        coalesce(sum(i.again), 0), coalesce(sum((i.answered_at IS NULL AND NOT EXISTS (SELECT 1
            FROM leases AS t WHERE t.run_id = i.run_id AND t.task_id = i.task_id
    AND t.owner = i.owner AND t.attempts = i.attempt AND t.expires_at > :now))), 0),
        min(i.at)
    FROM call_intents AS i WHERE i.run_id = :run_id
    GROUP BY i.task_id, i.name, i.request_hash

-- name: SPEND_BY_TASK
-- Tokens and cost kept since a moment, per task, the dearest first.
SELECT u.task, count(*), coalesce(sum(u.name IS NOT NULL), 0), coalesce(sum(u.tokens), 0),
        sum(u.cost)
    FROM usage AS u  WHERE u.at >= :since GROUP BY 1
    ORDER BY coalesce(sum(u.cost), 0) DESC, coalesce(sum(u.tokens), 0) DESC, 1 LIMIT :limit

-- name: SPEND_BY_FIELD
-- Tokens and cost kept since a moment, per value of a field of the task's payload, the dearest
-- first.
SELECT json_extract(t.payload, :path), count(*), coalesce(sum(u.name IS NOT NULL), 0),
    coalesce(sum(u.tokens), 0),
        sum(u.cost)
    FROM usage AS u JOIN tasks AS t ON t.id = u.task_id WHERE u.at >= :since GROUP BY 1
    ORDER BY coalesce(sum(u.cost), 0) DESC, coalesce(sum(u.tokens), 0) DESC, 1 LIMIT :limit

-- name: STORE_IDENTITY
-- this database's identity (``once_key``)
SELECT id FROM store_identity
