-- SQLite's claims and renewals (docs/protocol.md R1, R3, R6): the claim of the first
-- claimable runs of the served queues, what a claimed task's handler is given, and a
-- lease's renewal. A lease is its run's row of ``leases`` (schema step 29): a claim writes it
-- (owner, expiry, the attempt counted; its triggers copy the counts onto the task and move the
-- run's ready_at), a takeover rewrites it in place, keeping the lease it replaced in its prev_*
-- columns; every write after it carries the fence (task id AND owner AND attempt AND a live
-- expiry). SQLite 3.40 answers ``prev_owner IS NOT NULL`` wrongly in an INSERT's RETURNING on a
-- WITHOUT ROWID table (true for a column the insert left NULL): the claims ask typeof().

-- name: LEASE_INSERT
-- a claim's lease rows (``{lease}`` in every claim): for each claimed task, its run's lease: this
-- owner, the attempt counted, the expiry, whether its handler may begin at once (:start), the
-- gates and tokens its task holds
INSERT INTO leases AS l (run_id, task_id, owner, attempts, attempt_base, expires_at,
        claimed_at, started, gate_a, gate_b, gate_c, reserved)
    SELECT t.run_id, t.id, :owner, t.attempts + 1, t.attempt_base, :now + :ttl, :now, :start,
        t.gate_a, t.gate_b, t.gate_c, t.tokens

-- name: LEASE_TAKEOVER
-- a claim's takeover (``{takeover}`` in every claim): a run whose lease ended has it rewritten in
-- place, the lease it replaced kept in the prev_* columns (the attempt history's takeover row);
-- a takeover of an unstarted lease of the same task spends no attempt (B3), and a lease the
-- claimer takes over from itself waits for its older handler (``started`` false)
ON CONFLICT (run_id) DO UPDATE SET task_id = excluded.task_id, owner = excluded.owner,
    attempts = excluded.attempts,
    attempt_base = excluded.attempt_base + (l.task_id = excluded.task_id AND NOT l.started),
    expires_at = excluded.expires_at, claimed_at = excluded.claimed_at,
    started = excluded.started AND l.owner IS NOT excluded.owner,
    gate_a = excluded.gate_a, gate_b = excluded.gate_b, gate_c = excluded.gate_c,
    reserved = excluded.reserved, prev_task = l.task_id, prev_owner = l.owner,
    prev_attempts = l.attempts, prev_base = l.attempt_base, prev_claimed_at = l.claimed_at,
    prev_expires_at = l.expires_at, prev_started = l.started, prev_reserved = l.reserved
    WHERE l.expires_at <= excluded.claimed_at

-- name: CLAIM
-- claim (R1): one statement picks the first :limit claimable runs of every queue with pending
-- work (the queues found by a loose index scan of the claim index, one seek per queue), a higher
-- priority first, then in head order (the head is a run's first pending task in (available_at,
-- created_at, id) order, kept by triggers), and leases each one's first task: inserts its run's
-- lease, or takes an expired one over in place (ON CONFLICT ... WHERE it ended). A run is
-- claimable when its head is due, it is alive, and it holds no live lease; each picked run gives
-- one task, so not even one statement can hand out two leases in one run (nor could the lease
-- table's key hold two). Priority levels are found by a loose index scan (a max() below
-- the last one), so every walk of the claim index is bounded by head_at <= :now: delayed runs are
-- never walked, however many there are, and a run with 100,000 tasks behind one live lease costs
-- one index entry. A claim that takes over a lease whose handler never began spends no attempt
-- (B3): its attempt_base moves with attempts, as a hand-back's does; and the claim records
-- whether its own lease begins at once (:start) or waits (its start recorded by RENEW_MANY). A
-- lease the claimer takes over from itself waits: its older handler may still run in that worker,
-- and the new one begins only once it ended (SET reads the lease as it was). With :tasks (a JSON
-- array), only runs whose head task is one of them (B22: what the claimer has handlers for):
-- its name for an unversioned task, "name@version" for one at a version (B25).
WITH RECURSIVE
  served(q) AS (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL
    UNION ALL
    SELECT (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL AND queue > served.q)
    FROM served WHERE q IS NOT NULL),
  levels(q, p) AS (
    SELECT q, (SELECT max(priority) FROM runs WHERE queue = served.q AND head_at IS NOT NULL)
    FROM served WHERE q IS NOT NULL
    UNION ALL
    SELECT q, (SELECT max(priority) FROM runs
               WHERE queue = levels.q AND head_at IS NOT NULL AND priority < levels.p)
    FROM levels WHERE p IS NOT NULL),
  picked(run_id) AS (
    SELECT r.id FROM levels JOIN runs AS r ON r.id IN (
        SELECT x.id FROM runs AS x
        WHERE x.queue = levels.q AND x.priority = levels.p AND x.head_at <= :now
          AND +x.status IN ('pending', 'running')
          AND (:tasks IS NULL OR (SELECT coalesce(h.name || '@' || h.version, h.name)
                                  FROM tasks AS h WHERE h.id = x.head_id)
                                 IN (SELECT value FROM json_each(:tasks)))
          AND NOT EXISTS (SELECT 1 FROM leases AS a
                          WHERE a.run_id = x.id AND a.expires_at > :now)
        ORDER BY x.head_at, x.head_created, x.head_id LIMIT :limit)
    WHERE levels.p IS NOT NULL
    ORDER BY r.priority DESC, r.head_at, r.head_created, r.head_id LIMIT :limit)
{lease}
    FROM tasks AS t WHERE t.id IN (
        SELECT (SELECT h.id FROM tasks AS h
                WHERE h.run_id = picked.run_id AND h.done_at IS NULL AND h.available_at <= :now
                ORDER BY h.available_at, h.created_at, h.id LIMIT 1)
        FROM picked)
{takeover}
RETURNING task_id, run_id, NULL, NULL, attempts, attempt_base, expires_at,
    typeof(prev_owner) <> 'null'

-- name: CLAIM_QUEUES
-- claim (R1) from the named queues (:queues, a JSON array), each one's priority levels walked as
-- CLAIM walks every queue's.
WITH RECURSIVE
  served(q) AS (SELECT value FROM json_each(:queues)),
  levels(q, p) AS (
    SELECT q, (SELECT max(priority) FROM runs WHERE queue = served.q AND head_at IS NOT NULL)
    FROM served WHERE q IS NOT NULL
    UNION ALL
    SELECT q, (SELECT max(priority) FROM runs
               WHERE queue = levels.q AND head_at IS NOT NULL AND priority < levels.p)
    FROM levels WHERE p IS NOT NULL),
  picked(run_id) AS (
    SELECT r.id FROM levels JOIN runs AS r ON r.id IN (
        SELECT x.id FROM runs AS x
        WHERE x.queue = levels.q AND x.priority = levels.p AND x.head_at <= :now
          AND +x.status IN ('pending', 'running')
          AND (:tasks IS NULL OR (SELECT coalesce(h.name || '@' || h.version, h.name)
                                  FROM tasks AS h WHERE h.id = x.head_id)
                                 IN (SELECT value FROM json_each(:tasks)))
          AND NOT EXISTS (SELECT 1 FROM leases AS a
                          WHERE a.run_id = x.id AND a.expires_at > :now)
        ORDER BY x.head_at, x.head_created, x.head_id LIMIT :limit)
    WHERE levels.p IS NOT NULL
    ORDER BY r.priority DESC, r.head_at, r.head_created, r.head_id LIMIT :limit)
{lease}
    FROM tasks AS t WHERE t.id IN (
        SELECT (SELECT h.id FROM tasks AS h
                WHERE h.run_id = picked.run_id AND h.done_at IS NULL AND h.available_at <= :now
                ORDER BY h.available_at, h.created_at, h.id LIMIT 1)
        FROM picked)
{takeover}
RETURNING task_id, run_id, NULL, NULL, attempts, attempt_base, expires_at,
    typeof(prev_owner) <> 'null'

-- name: CLAIM_OTHERS
-- claim (R1) from every queue but those of :skip (a JSON array), as CLAIM: a worker's claim for
-- its users' slots, which leaves the webhooks' queue to its delivery lane (B20).
WITH RECURSIVE
  served(q) AS (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL
    UNION ALL
    SELECT (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL AND queue > served.q)
    FROM served WHERE q IS NOT NULL),
  levels(q, p) AS (
    SELECT q, (SELECT max(priority) FROM runs WHERE queue = served.q AND head_at IS NOT NULL)
    FROM served WHERE q IS NOT NULL AND q NOT IN (SELECT value FROM json_each(:skip))
    UNION ALL
    SELECT q, (SELECT max(priority) FROM runs
               WHERE queue = levels.q AND head_at IS NOT NULL AND priority < levels.p)
    FROM levels WHERE p IS NOT NULL),
  picked(run_id) AS (
    SELECT r.id FROM levels JOIN runs AS r ON r.id IN (
        SELECT x.id FROM runs AS x
        WHERE x.queue = levels.q AND x.priority = levels.p AND x.head_at <= :now
          AND +x.status IN ('pending', 'running')
          AND (:tasks IS NULL OR (SELECT coalesce(h.name || '@' || h.version, h.name)
                                  FROM tasks AS h WHERE h.id = x.head_id)
                                 IN (SELECT value FROM json_each(:tasks)))
          AND NOT EXISTS (SELECT 1 FROM leases AS a
                          WHERE a.run_id = x.id AND a.expires_at > :now)
        ORDER BY x.head_at, x.head_created, x.head_id LIMIT :limit)
    WHERE levels.p IS NOT NULL
    ORDER BY r.priority DESC, r.head_at, r.head_created, r.head_id LIMIT :limit)
{lease}
    FROM tasks AS t WHERE t.id IN (
        SELECT (SELECT h.id FROM tasks AS h
                WHERE h.run_id = picked.run_id AND h.done_at IS NULL AND h.available_at <= :now
                ORDER BY h.available_at, h.created_at, h.id LIMIT 1)
        FROM picked)
{takeover}
RETURNING task_id, run_id, NULL, NULL, attempts, attempt_base, expires_at,
    typeof(prev_owner) <> 'null'

-- name: CLAIM_TASK
-- claim (R1) of one task's runs (:task: a batch's claim for more of its items), from the named
-- queues (:queues, a JSON array; NULL: every queue but those of :skip): the first :limit
-- claimable runs whose head is a task of that name, a higher priority first, then in head
-- order, each leased as CLAIM leases. Runs in a line (head_at NULL) are never walked: they are
-- admitted by their gates, one by one, in the worker's plain claim. :tasks: as CLAIM's (B25).
WITH picked(run_id) AS (
    SELECT x.id FROM runs AS x JOIN tasks AS h ON h.id = x.head_id
    WHERE x.head_at <= :now AND h.name = :task AND +x.status IN ('pending', 'running')
      AND (:tasks IS NULL OR coalesce(h.name || '@' || h.version, h.name)
                             IN (SELECT value FROM json_each(:tasks)))
      AND (:queues IS NULL OR x.queue IN (SELECT value FROM json_each(:queues)))
      AND x.queue NOT IN (SELECT value FROM json_each(:skip))
      AND NOT EXISTS (SELECT 1 FROM leases AS a
                      WHERE a.run_id = x.id AND a.expires_at > :now)
    ORDER BY x.priority DESC, x.head_at, x.head_created, x.head_id LIMIT :limit)
{lease}
    FROM tasks AS t WHERE t.id IN (
        SELECT (SELECT h.id FROM tasks AS h
                WHERE h.run_id = picked.run_id AND h.done_at IS NULL AND h.available_at <= :now
                ORDER BY h.available_at, h.created_at, h.id LIMIT 1)
        FROM picked)
{takeover}
RETURNING task_id, run_id, NULL, NULL, attempts, attempt_base, expires_at,
    typeof(prev_owner) <> 'null'

-- name: RUN_STATES
-- claim: for every task a claim leased (:task_ids, a JSON array), in one statement right after
-- the claim (a claim answers its lease rows only): the task's id, name and payload, its run's
-- state, revision and queue (the handler's), the task's declared options (B11; NULL: none), the
-- signal that resumed it if it waited for one, the run's parent and its join task (B14), its
-- trace context (tracing), and the task's version (B25).
SELECT t.id, t.name, t.payload, r.state, r.revision, r.queue,
    (SELECT options FROM task_options WHERE name = t.name),
    t.signal_id, r.parent_id, r.join_task, r.traceparent, t.version
    FROM json_each(:task_ids) AS j CROSS JOIN tasks AS t ON t.id = j.value
    CROSS JOIN runs AS r ON r.id = t.run_id

-- name: DROP_EXHAUSTED_LEASE
-- claim (R6): a claim past max_attempts hands nothing out: drop the lease (its counts stay on
-- the task), fail the run; the task's last error says why
DELETE FROM leases WHERE run_id = :run_id AND task_id = :task_id
    RETURNING (SELECT last_error FROM tasks WHERE id = :task_id)

-- name: FAIL_RUN
-- claim (R6), fail: the run fails, with its reason and its last error (the task's, if none is
-- given); only a run still alive ('running': a run from before schema v9).
UPDATE runs SET status = 'failed', failure_reason = :reason,
    last_error = coalesce(:error, last_error), finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN ('pending', 'running')

-- name: RENEW
-- renew (R3): a live lease's new expiry (``steps.renew_many`` renews each lease of the batch in
-- turn). Each renewed lease also says whether its run is still alive (B15): a cancelled run's
-- holder hears it at its next renewal, and stops its handler. A lease whose handler begins on
-- this renewal (``:start``) is recorded as begun (B3).
UPDATE leases SET expires_at = max(expires_at, :now + :ttl), started = started OR :start
    WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now
    RETURNING task_id, attempts, expires_at,
    (SELECT status IN ('pending', 'running') FROM runs WHERE runs.id = leases.run_id)
