-- The PostgreSQL backend's flow control (``protocol/limits.py`` and
-- ``protocol/gates.py``): limits, their gates, the gated claim's statements and the settling of a
-- lease's gates. A claimer locks every gate it looks at ``FOR UPDATE SKIP LOCKED`` (another
-- claimer's gates are skipped, never waited for); a commit settles its gates one by one in name
-- order, after its runs (lock order: runs, then gates), so no two transactions wait in a cycle.

-- name: LIMIT_SPECS
-- Every limit's numbers (what a claim admits by).
SELECT name, per, rate, burst, concurrency, tokens, token_burst FROM limits

-- name: LIMIT_ROWS
-- Every limit as declared and as an operator set it, by name.
SELECT name, per, rate, burst, concurrency, tokens, token_burst, declared::text,
    declared_by, overrides::text, declared_at, set_at FROM limits ORDER BY name

-- name: DECLARE_LIMIT
-- an app's declaration replaces what was declared and what an operator set
INSERT INTO limits (name, per, rate, burst, concurrency, tokens, token_burst,
        declared, declared_by, declared_at)
    VALUES (%(name)s, %(per)s, %(rate)s, %(burst)s, %(concurrency)s, %(tokens)s,
            %(token_burst)s, %(declared)s::json, %(by)s,
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    ON CONFLICT (name) DO UPDATE SET per = excluded.per, rate = excluded.rate,
        burst = excluded.burst, concurrency = excluded.concurrency, tokens = excluded.tokens,
        token_burst = excluded.token_burst, declared = excluded.declared,
        declared_by = excluded.declared_by, declared_at = excluded.declared_at,
        overrides = NULL, set_at = NULL

-- name: SET_LIMIT
-- an operator's numbers (``limits set``), and its gates may have room now (and the lines its
-- gates kept closed: a task's other limits' lines)
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
set AS (UPDATE limits SET rate = %(rate)s, burst = %(burst)s, concurrency = %(concurrency)s,
        tokens = %(tokens)s, token_burst = %(token_burst)s, overrides = %(overrides)s::json,
        set_at = clock.now FROM clock WHERE name = %(name)s RETURNING name),
reopened AS (UPDATE gates SET ready_at = least(ready_at, turn, clock.now),
        blocked_by = CASE WHEN gates.lim = set.name THEN gates.blocked_by END
    FROM clock, set WHERE gates.lim = set.name
       OR gates.blocked_by IN (SELECT b.gate FROM gates AS b WHERE b.lim = set.name))
SELECT name, pg_notify('leasekeeper.' || current_schema(), '') FROM set

-- name: LIMIT_KEYS
-- Each gate of a limit: its key, live leases, runs waiting behind it, pause and buckets, the
-- busiest first.
SELECT key, live, waiting, paused, level, level_at, tok_level, tok_at
    FROM (SELECT g.key, (SELECT n FROM (SELECT sum(x.n)::bigint AS n, min(x.first_end) AS first_end
    FROM (SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_a = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        UNION ALL SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_b = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        UNION ALL SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_c = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))) AS x) AS
                    live) AS live, coalesce(w.n, 0) AS waiting,
    CASE WHEN g.paused_until > (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
            THEN g.paused_until END AS paused, g.used_tokens AS used,
    g.level, g.level_at, g.tok_level, g.tok_at
    FROM gates AS g LEFT JOIN (SELECT x.gate, count(*) AS n FROM (
        SELECT unnest(ARRAY[t.gate_a, t.gate_b, t.gate_c]) AS gate FROM runs AS r
        JOIN tasks AS t ON t.id = r.head_id AND t.run_id = r.id
        WHERE r.line_at IS NOT NULL AND r.status IN ('pending')
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                          AND l.owner IS NOT NULL
                              AND l.expires_at > (SELECT
                                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)))) AS x
    WHERE x.gate IN (SELECT gate FROM gates
        WHERE lim = %(lim)s) GROUP BY x.gate) AS w ON w.gate = g.gate WHERE g.lim = %(lim)s) AS k
    ORDER BY waiting + live DESC, key LIMIT %(limit)s

-- name: LIMIT_USE
-- A limit's live leases, waiting runs and tokens used, over all its gates.
SELECT sum(live), sum(waiting), sum(used) FROM (SELECT g.key, (SELECT n
    FROM (SELECT sum(x.n)::bigint AS n, min(x.first_end) AS first_end
    FROM (SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_a = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        UNION ALL SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_b = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        UNION ALL SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_c = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))) AS x) AS
                    live) AS live, coalesce(w.n, 0) AS waiting,
    CASE WHEN g.paused_until > (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
            THEN g.paused_until END AS paused, g.used_tokens AS used,
    g.level, g.level_at, g.tok_level, g.tok_at
    FROM gates AS g LEFT JOIN (SELECT x.gate, count(*) AS n FROM (
        SELECT unnest(ARRAY[t.gate_a, t.gate_b, t.gate_c]) AS gate FROM runs AS r
        JOIN tasks AS t ON t.id = r.head_id AND t.run_id = r.id
        WHERE r.line_at IS NOT NULL AND r.status IN ('pending')
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                          AND l.owner IS NOT NULL
                              AND l.expires_at > (SELECT
                                  coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)))) AS x
    WHERE x.gate IN (SELECT gate FROM gates
        WHERE lim = %(lim)s) GROUP BY x.gate) AS w ON w.gate = g.gate WHERE g.lim = %(lim)s) AS k

-- name: OPEN_GATES
-- the gates whose line may admit a run now, the one served least recently first, locked
SELECT gate FROM gates
    WHERE ready_at <= (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) ORDER BY
            ready_at, gate
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED

-- name: OPEN_MARKED
-- OPEN_GATES for a claim whose transaction settled no gate: the open gates, locked, as one
-- array, also kept in the transaction's setting ``leasekeeper.opened`` (to its end) for the
-- statements sent with it (OPEN_STATES, OPEN_LINES), which read the first of them after
-- these locks, so the claim's first look costs no round trip of its own
SELECT o.gates, set_config('leasekeeper.opened', coalesce(o.gates, '{}')::text, true)
    FROM (SELECT array_agg(x.gate ORDER BY x.ready_at, x.gate) AS gates
        FROM (SELECT gate, ready_at FROM gates
            WHERE ready_at <= (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
            ORDER BY ready_at, gate
            LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS x) AS o

-- name: GATE_STATE
-- the gates named (each locked, unless another claimer holds it: then no row), their limits'
-- numbers, their buckets, their live leases and the first of them to end
-- (its live leases counted and their first end found in one walk of them: the leases table
-- keeps the rows of ended leases until a vacuum, and every claim walks them)
SELECT g.gate, l.rate, l.burst, l.concurrency, l.tokens, l.token_burst,
    g.level, g.level_at, g.tok_level, g.tok_at, g.paused_until, live.n, live.first_end
    FROM gates AS g JOIN limits AS l ON l.name = g.lim
    CROSS JOIN LATERAL (SELECT sum(x.n)::bigint AS n, min(x.first_end) AS first_end
    FROM (SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_a = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        UNION ALL SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_b = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        UNION ALL SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE gate_c = g.gate AND owner IS NOT NULL
            AND expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))) AS x) AS
                    live
    WHERE g.gate = ANY(%(gates)s::text[])
    ORDER BY g.gate FOR UPDATE OF g SKIP LOCKED

-- name: LINE_RUNS
-- the first ``limit`` claimable runs of each line named, in the served queues (NULL: all)
-- and of the served tasks (NULL: any, B22), locked, in one statement (a batched claim asks one
-- run of each of many lines at once): the line, the run, its head task, its reservation, what
-- an expired lease on it still holds (a takeover gives it back), and its gates; in the order
-- of the lines, then each line's order. Its status test is one no index serves (``IS TRUE``):
-- runs_status keeps a dead 'pending' entry for every run that ended since the oldest snapshot,
-- which the statistics do not count (docs/how-to/postgresql.md, "When vacuum cannot run"); its
-- lease probe is a scalar subquery, one descent of the primary key a run (as the claim's)
SELECT x.line, f.run_id, f.task_id, f.tokens, f.held, f.gate_a, f.gate_b, f.gate_c
    FROM unnest(%(lines)s::text[]) WITH ORDINALITY AS x(line, ord)
    CROSS JOIN LATERAL (SELECT r.id AS run_id, t.id AS task_id, t.tokens,
        (SELECT l.reserved FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL) AS held,
        t.gate_a, t.gate_b, t.gate_c, r.queue, r.priority, r.line_at, r.head_created, r.head_id
        FROM runs AS r JOIN tasks AS t ON t.id = r.head_id AND t.run_id = r.id
        WHERE r.line = x.line
            AND r.line_at <= (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
                    AND (r.status = 'pending') IS TRUE
          AND (%(queues)s::text[] IS NULL OR r.queue = ANY(%(queues)s::text[]))
          AND (%(tasks)s::text[] IS NULL
               OR coalesce(t.name || '@' || t.version, t.name) = ANY(%(tasks)s::text[]))
          AND coalesce((SELECT l.expires_at FROM leases AS l WHERE l.run_id = r.id), '-infinity')
              <= (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
        ORDER BY r.queue, r.priority DESC, r.line_at, r.head_created, r.head_id
        LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED) AS f
    ORDER BY x.ord, f.queue, f.priority DESC, f.line_at, f.head_created, f.head_id

-- name: LINE_NEXT
-- when a line may next have a claimable run: its first due run, or its first lease to end
-- (its status test served by no index, as LINE_RUNS's)
SELECT min(coalesce((SELECT l.expires_at FROM leases AS l WHERE l.run_id = r.id
        AND l.owner IS NOT NULL
            AND l.expires_at > (SELECT
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))),
                    r.line_at))
    FROM runs AS r WHERE r.line = %(line)s AND r.line_at IS NOT NULL
      AND (r.status IN ('pending')) IS TRUE

-- name: GATE_WRITE
-- what a claim made of its gates (one array per column, a gate's values at its index: one
-- statement for them all; the claim holds every one of them, locked when it read it): their
-- buckets, their starts, when each line may next admit a run
UPDATE gates AS g SET level = w.level, level_at = w.level_at,
    tok_level = w.tok_level, tok_at = w.tok_at, starts = g.starts + w.starts,
    ready_at = CASE WHEN w.keep THEN g.ready_at ELSE w.ready_at END,
    blocked_by = CASE WHEN w.keep THEN g.blocked_by ELSE w.blocked_by END,
    idle = CASE WHEN w.keep THEN g.idle ELSE w.idle END,
    turn = coalesce(w.turn, g.turn)
    FROM unnest(%(gate)s::text[], %(level)s::float8[], %(level_at)s::float8[],
                %(tok_level)s::float8[], %(tok_at)s::float8[], %(starts)s::bigint[],
                %(ready_at)s::float8[], %(blocked_by)s::text[], %(idle)s::boolean[],
                %(keep)s::boolean[], %(turn)s::float8[])
        AS w(gate, level, level_at, tok_level, tok_at, starts, ready_at, blocked_by, idle,
             keep, turn)
    WHERE g.gate = w.gate RETURNING g.gate

-- name: GATE_SETTLE
-- a lease ended: its reservation back (less what it cost), a hand-back's rate token back, a
-- RetryAfter's pause; its line and the lines it kept closed may admit again (and idle workers
-- are told)
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
settled AS (UPDATE gates SET
    tok_level = tok_level + %(back)s, level = level + %(unstart)s,
    starts = starts - %(unstart)s, used_tokens = used_tokens + %(charged)s,
    paused_until = CASE WHEN %(pause)s::float8 IS NULL THEN paused_until
                        ELSE greatest(paused_until, clock.now + %(pause)s) END,
    ready_at = CASE WHEN %(pause)s::float8 IS NULL
                    THEN least(ready_at, turn, clock.now)
                    ELSE greatest(paused_until, clock.now + %(pause)s) END
    FROM clock WHERE gate = %(gate)s RETURNING gate),
reopened AS (UPDATE gates SET ready_at = least(ready_at, turn, clock.now),
    blocked_by = NULL FROM clock WHERE blocked_by = %(gate)s)
SELECT gate, pg_notify('leasekeeper.' || current_schema(), '') FROM settled

-- name: PLACE_GATES
-- gated runs joined their lines: each gate exists; each line may admit now (unless it is
-- closed for want of room: its ready_at stays; one closed only until its next due run is idle)
INSERT INTO gates AS g (gate, lim, key, ready_at, turn)
    SELECT i.gate, i.lim, i.key, CASE WHEN i.gate = ANY(%(lines)s::text[])
        THEN (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)) END,
        (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    FROM unnest(%(gates)s::text[], %(lims)s::text[], %(keys)s::text[]) AS i(gate, lim, key)
    ORDER BY 1
    ON CONFLICT (gate) DO UPDATE SET ready_at = least(g.turn, excluded.ready_at)
    WHERE excluded.ready_at IS NOT NULL
      AND (g.ready_at IS NULL OR g.idle AND g.ready_at > excluded.ready_at) RETURNING g.gate

-- name: REOPEN_RUN
-- a run back in its line by a retry, a signal or its children's end: the gates of
-- its head task may admit now (a retry dropped its lease), and the lines they kept closed
WITH g AS MATERIALIZED (
    SELECT x.gate FROM runs AS r JOIN tasks AS t ON t.id = r.head_id,
        unnest(ARRAY[t.gate_a, t.gate_b, t.gate_c]) AS x(gate)
    WHERE r.id = %(run_id)s AND r.line_at IS NOT NULL AND x.gate IS NOT NULL)
UPDATE gates SET ready_at = least(ready_at, turn,
    (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))),
    blocked_by = CASE WHEN gate IN (SELECT gate FROM g) THEN blocked_by END
    WHERE gate IN (SELECT gate FROM g) OR blocked_by IN (SELECT gate FROM g) RETURNING gate

-- name: LINES_WAITING
-- ``check``'s recount: every line with runs in it, its gate's state and how many
-- wait there (in the line, alive, no live lease); a line whose gate has no row
SELECT r.line, g.ready_at, g.idle, g.blocked_by, g.gate IS NULL, count(*)
    FROM runs AS r LEFT JOIN gates AS g ON g.gate = r.line
    WHERE r.line IS NOT NULL AND r.line_at IS NOT NULL AND r.status = 'pending'
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                      AND l.owner IS NOT NULL
                          AND l.expires_at > (SELECT
                              coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)))
    GROUP BY r.line, g.gate ORDER BY r.line

-- name: REOPEN_GATES
-- ``check``'s repair: lines that must admit now
UPDATE gates SET ready_at = least(turn,
    (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))),
        blocked_by = NULL, idle = false
    WHERE gate = %(gate)s RETURNING gate

-- name: UNSPEND
-- RetryAfter: the release spent no attempt
UPDATE tasks SET attempt_base = attempt_base + 1 WHERE id = %(task_id)s RETURNING id

-- name: REGATE
-- A run enqueued before its task had limits, handed back at its first claim: its task names its
-- gates now, and the run moves to its line.
WITH t AS (UPDATE tasks SET line = %(line)s, gate_a = %(gate_a)s, gate_b = %(gate_b)s,
        gate_c = %(gate_c)s, tokens = %(tokens)s WHERE id = %(task_id)s
        RETURNING id, available_at, created_at, line)
UPDATE runs AS r SET (head_at, line_at, head_created, head_id, line) = (
        SELECT CASE WHEN f.line IS NULL THEN f.a END, CASE WHEN f.line IS NOT NULL THEN f.a END,
            f.c, f.i, f.line
        FROM (SELECT h.available_at AS a, h.created_at AS c, h.id AS i, h.line AS line
              FROM tasks AS h WHERE h.run_id = r.id AND h.done_at IS NULL
                  AND h.id <> t.id UNION ALL SELECT t.available_at, t.created_at, t.id, t.line) AS f
        ORDER BY f.a, f.c, f.i LIMIT 1) FROM t WHERE r.id = %(run_id)s AND r.status IN ('pending')
RETURNING r.id
