-- PostgreSQL's statements of a claim's aftermath and of renewals (docs/protocol.md R3, R6):
-- the claims themselves are composed in Python (``sql.claim_sql``: a walk per served queue).
--
-- Time: ``%(now)s`` is NULL in production, and then every statement reads the database clock
-- (``clock_timestamp()``) once, inside the statement; a test injects its clock through the same
-- parameter. A lease is the run's row of ``leases``; a run alive is 'pending' (a lease on it
-- says "running").

-- name: DROP_EXHAUSTED_LEASE
-- claim (R6): a claim past max_attempts hands nothing out: the lease goes (its counts stay on
-- the task), the run fails (FAIL_RUN); the task's last error says why
WITH gone AS (
    DELETE FROM leases WHERE run_id = %(run_id)s AND task_id = %(task_id)s
    RETURNING task_id, attempts, attempt_base, claimed_at)
UPDATE tasks AS t SET attempts = g.attempts, attempt_base = g.attempt_base,
    claimed_at = g.claimed_at FROM gone AS g WHERE t.id = g.task_id RETURNING t.last_error

-- name: FAIL_RUN
-- claim (R6), fail: the run fails, with its reason and its last error (the task's, if none is
-- given), and its head columns (and its line) are cleared; only a run still alive, answered
-- once per run failed
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
UPDATE runs SET status = 'failed', failure_reason = %(reason)s,
    last_error = coalesce(%(error)s, last_error), finished_at = now, updated_at = now,
    head_at = NULL, head_created = NULL, head_id = NULL, line_at = NULL, line = NULL
    FROM clock WHERE id = %(run_id)s AND status IN ('pending') RETURNING id

-- name: RENEW_MANY
-- renew (R3): every lease of one owner in one statement: the runs are locked in id order first
-- (no cycle with a batched commit), "now" is read after; each lease matches its own (task id,
-- attempt) with the one fence of the commits, and the new expiry is max(old, now + ttl) (a HOT
-- update: only the expiry changes); the protocol records each lease refused as evidence, with
-- its event, in the next transaction. Each renewed lease also says whether its run is still
-- alive (B15), read from the locked row (the newest version: a cancel that committed while
-- this waited for the lock is seen). The leases whose handlers begin on this renewal
-- (``starts``) are recorded as begun (B3).
WITH run AS MATERIALIZED (
    SELECT id, status FROM runs WHERE id = ANY(%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE),
clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now
    FROM (SELECT count(*) FROM run) AS locked),
i AS (SELECT *, %(owner)s::text AS owner
       FROM unnest(%(task_ids)s::bigint[], %(attempts)s::int[], %(runs)s::bigint[],
                   %(starts)s::boolean[]) AS i(task_id, attempt, run_id, start)),
renewed AS (
    UPDATE leases AS l SET expires_at = greatest(l.expires_at, clock.now + %(ttl)s),
        started = l.started OR i.start
    FROM i, clock
    WHERE l.run_id = i.run_id AND l.task_id = i.task_id AND l.attempts = i.attempt
    AND l.owner = i.owner AND l.expires_at > clock.now
    RETURNING l.task_id, l.attempts AS attempt, l.expires_at, l.run_id)
SELECT n.task_id, n.attempt, n.expires_at, run.status IN ('pending')
FROM renewed AS n JOIN run ON run.id = n.run_id
