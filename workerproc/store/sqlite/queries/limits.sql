-- SQLite's flow control (``protocol/limits.py``, ``protocol/gates.py``): the limits an app
-- declares and an operator sets, the gates of each limit's keys, their lines of waiting
-- runs, and the claims that admit runs from those lines.

-- name: LIMIT_SPECS
-- flow control: every limit's numbers, what a claim judges its gates by.
SELECT name, per, rate, burst, concurrency, tokens, token_burst FROM limits

-- name: LIMIT_ROWS
-- flow control: every limit, as declared and as an operator set it, by name (limits list).
SELECT name, per, rate, burst, concurrency, tokens, token_burst, declared,
    declared_by, overrides, declared_at, set_at FROM limits ORDER BY name

-- name: DECLARE_LIMIT
-- an app's declaration replaces what was declared and what an operator set
INSERT INTO limits (name, per, rate, burst, concurrency, tokens, token_burst,
        declared, declared_by, declared_at)
    VALUES (:name, :per, :rate, :burst, :concurrency, :tokens, :token_burst, :declared, :by, :now)
    ON CONFLICT (name) DO UPDATE SET per = excluded.per, rate = excluded.rate,
        burst = excluded.burst, concurrency = excluded.concurrency, tokens = excluded.tokens,
        token_burst = excluded.token_burst, declared = excluded.declared,
        declared_by = excluded.declared_by, declared_at = excluded.declared_at,
        overrides = NULL, set_at = NULL

-- name: SET_LIMIT_NUMBERS
-- an operator's numbers (``limits set``); its gates may have room now (steps: REOPEN_LIMIT)
UPDATE limits SET rate = :rate, burst = :burst, concurrency = :concurrency,
    tokens = :tokens, token_burst = :token_burst, overrides = :overrides, set_at = :now
    WHERE name = :name

-- name: REOPEN_LIMIT
-- limits set: the gates of limit :name may have room now, and so may the lines they kept closed
-- (a task's other limits' lines); each goes back to its place in the lines' round robin (turn):
-- never behind lines served since it closed, and lines reopened together keep their order.
UPDATE gates SET ready_at = min(coalesce(ready_at, :now), coalesce(turn, :now), :now),
    blocked_by = CASE WHEN lim = :name THEN blocked_by END
    WHERE lim = :name OR blocked_by IN (SELECT gate FROM gates WHERE lim = :name)

-- name: LIMIT_KEYS
-- each gate of a limit (:lim), the busiest first, :limit of them: its key, its live leases (the
-- slots of its concurrency cap that are held), the runs waiting behind it (in a line, not leased,
-- counted under every gate of their head task: a task of several limits waits in one line, behind
-- all of its gates), its pause and its buckets.
SELECT key, live, waiting, paused, level, level_at, tok_level, tok_at
    FROM (SELECT g.key AS key,
            (SELECT count(*) FROM leases WHERE gate_a = g.gate AND expires_at > :now)
            + (SELECT count(*) FROM leases WHERE gate_b = g.gate AND expires_at > :now)
            + (SELECT count(*) FROM leases WHERE gate_c = g.gate AND expires_at > :now) AS live,
            coalesce(w.n, 0) AS waiting,
            CASE WHEN g.paused_until > :now THEN g.paused_until END AS paused,
            g.used_tokens AS used, g.level AS level, g.level_at AS level_at,
            g.tok_level AS tok_level, g.tok_at AS tok_at
        FROM gates AS g LEFT JOIN (
            SELECT x.gate AS gate, count(*) AS n FROM (
                SELECT CASE k.i WHEN 1 THEN t.gate_a WHEN 2 THEN t.gate_b ELSE t.gate_c END
                    AS gate
                FROM runs AS r JOIN tasks AS t ON t.id = r.head_id,
                     (SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3) AS k
                WHERE r.line_at IS NOT NULL AND r.status IN ('pending', 'running')
                  AND NOT EXISTS (SELECT 1 FROM leases AS a WHERE a.run_id = r.id
                                  AND a.expires_at > :now)) AS x
            WHERE x.gate IN (SELECT gate FROM gates WHERE lim = :lim) GROUP BY x.gate) AS w
            ON w.gate = g.gate
        WHERE g.lim = :lim)
    ORDER BY waiting + live DESC, key LIMIT :limit

-- name: LIMIT_USE
-- a limit's (:lim) totals over its gates: live leases, runs waiting behind them (counted as
-- LIMIT_KEYS counts them), tokens used.
SELECT sum(live), sum(waiting), sum(used)
    FROM (SELECT g.key AS key,
            (SELECT count(*) FROM leases WHERE gate_a = g.gate AND expires_at > :now)
            + (SELECT count(*) FROM leases WHERE gate_b = g.gate AND expires_at > :now)
            + (SELECT count(*) FROM leases WHERE gate_c = g.gate AND expires_at > :now) AS live,
            coalesce(w.n, 0) AS waiting,
            CASE WHEN g.paused_until > :now THEN g.paused_until END AS paused,
            g.used_tokens AS used, g.level AS level, g.level_at AS level_at,
            g.tok_level AS tok_level, g.tok_at AS tok_at
        FROM gates AS g LEFT JOIN (
            SELECT x.gate AS gate, count(*) AS n FROM (
                SELECT CASE k.i WHEN 1 THEN t.gate_a WHEN 2 THEN t.gate_b ELSE t.gate_c END
                    AS gate
                FROM runs AS r JOIN tasks AS t ON t.id = r.head_id,
                     (SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3) AS k
                WHERE r.line_at IS NOT NULL AND r.status IN ('pending', 'running')
                  AND NOT EXISTS (SELECT 1 FROM leases AS a WHERE a.run_id = r.id
                                  AND a.expires_at > :now)) AS x
            WHERE x.gate IN (SELECT gate FROM gates WHERE lim = :lim) GROUP BY x.gate) AS w
            ON w.gate = g.gate
        WHERE g.lim = :lim)

-- name: OPEN_GATES
-- the gates whose line may admit a run now, the one served least recently first
SELECT gate FROM gates WHERE ready_at <= :now ORDER BY ready_at, gate
    LIMIT :limit

-- name: GATE_STATE
-- the gates of :gates (a JSON array) that exist, one row each: its limit's numbers, its buckets,
-- its live leases and the first of them to end (one statement for all of a claim's gates)
SELECT g.gate, l.rate, l.burst, l.concurrency, l.tokens, l.token_burst, g.level,
    g.level_at, g.tok_level, g.tok_at, g.paused_until,
    (SELECT count(*) FROM leases WHERE gate_a = g.gate AND expires_at > :now)
    + (SELECT count(*) FROM leases WHERE gate_b = g.gate AND expires_at > :now)
    + (SELECT count(*) FROM leases WHERE gate_c = g.gate AND expires_at > :now),
    (SELECT min(e) FROM (
        SELECT min(expires_at) AS e FROM leases WHERE gate_a = g.gate AND expires_at > :now
        UNION ALL SELECT min(expires_at) AS e FROM leases WHERE gate_b = g.gate
            AND expires_at > :now
        UNION ALL SELECT min(expires_at) AS e FROM leases WHERE gate_c = g.gate
            AND expires_at > :now))
    FROM json_each(:gates) AS j CROSS JOIN gates AS g JOIN limits AS l ON l.name = g.lim
    WHERE g.gate = j.value

-- name: LINE_RUNS
-- the first :limit claimable runs of each line of :lines (a JSON array), the line first, in the
-- served queues (a JSON array; NULL: all) whose head task is a served one (:tasks, likewise:
-- B22): their head task, its reservation, what an expired lease on it still holds (a takeover
-- gives it back), and its gates; one statement for all the lines (each line's runs in its order)
SELECT j.value, r.id, t.id, t.tokens,
        (SELECT p.reserved FROM leases AS p WHERE p.run_id = r.id AND p.owner IS NOT NULL),
        t.gate_a, t.gate_b, t.gate_c
    FROM json_each(:lines) AS j CROSS JOIN runs AS r CROSS JOIN tasks AS t
    WHERE r.id IN (
        SELECT f.id FROM runs AS f JOIN tasks AS h ON h.id = f.head_id
        WHERE f.line = j.value AND f.line_at <= :now AND +f.status IN ('pending', 'running')
          AND (:queues IS NULL OR f.queue IN (SELECT value FROM json_each(:queues)))
          AND (:tasks IS NULL OR coalesce(h.name || '@' || h.version, h.name)
                                 IN (SELECT value FROM json_each(:tasks)))
          AND NOT EXISTS (SELECT 1 FROM leases AS a WHERE a.run_id = f.id
                          AND a.expires_at > :now)
        ORDER BY f.queue, f.priority DESC, f.line_at, f.head_created, f.head_id LIMIT :limit)
      AND t.id = r.head_id
    ORDER BY j.key, r.queue, r.priority DESC, r.line_at, r.head_created, r.head_id

-- name: LINE_NEXT
-- when a line may next have a claimable run: its first due run, or its first lease to end
SELECT min(coalesce((SELECT a.expires_at FROM leases AS a
        WHERE a.run_id = r.id AND a.expires_at > :now), r.line_at))
    FROM runs AS r
        WHERE r.line = :line AND r.line_at IS NOT NULL AND r.status IN ('pending', 'running')

-- name: CLAIM_RUNS
-- lease the head task of each admitted run (R1-R3 as in CLAIM); a takeover's predecessor held
-- the task's reservation until its lease expired: it is given back (the last column)
{lease}
    FROM tasks AS t
    WHERE t.id IN (SELECT head_id FROM runs WHERE id IN (SELECT value FROM json_each(:run_ids))
                   AND line_at <= :now AND status IN ('pending', 'running'))
      AND t.done_at IS NULL
{takeover}
RETURNING task_id, run_id, NULL, NULL, attempts, attempt_base, expires_at,
    typeof(prev_owner) <> 'null', gate_a, gate_b, gate_c, reserved,
    CASE WHEN typeof(prev_owner) <> 'null' THEN prev_reserved END

-- name: WRITE_GATE
-- what a claim made of a gate: its buckets, its starts, when its line may next admit a run
-- (step GATE_WRITE: every gate the claim changed, one ``executemany``)
UPDATE gates SET level = :level, level_at = :level_at, tok_level = :tok_level,
    tok_at = :tok_at, starts = starts + :starts,
    ready_at = CASE WHEN :keep THEN ready_at ELSE :ready_at END,
    blocked_by = CASE WHEN :keep THEN blocked_by ELSE :blocked_by END,
    idle = CASE WHEN :keep THEN idle ELSE :idle END,
    turn = coalesce(:turn, turn)
    WHERE gate = :gate

-- name: SETTLE_GATE
-- a lease ended: its reservation back (less what it cost), a hand-back's rate token back, a
-- RetryAfter's pause; its line and the lines it kept closed may admit again (steps)
UPDATE gates SET
    tok_level = CASE WHEN tok_level IS NULL THEN NULL ELSE tok_level + :back END,
    level = CASE WHEN level IS NULL THEN NULL ELSE level + :unstart END,
    starts = starts - :unstart, used_tokens = used_tokens + :charged,
    paused_until = CASE WHEN :pause IS NULL THEN paused_until
                        ELSE max(paused_until, :now + :pause) END,
    ready_at = CASE WHEN :pause IS NULL THEN min(coalesce(ready_at, :now), coalesce(turn, :now),
        :now)
                    ELSE max(paused_until, :now + :pause) END
    WHERE gate = :gate

-- name: REOPEN_BLOCKED
-- a lease ended on gate :gate: the lines it kept closed may admit again, each back at its place
-- in the lines' round robin (turn).
UPDATE gates SET ready_at = min(coalesce(ready_at, :now), coalesce(turn, :now), :now),
    blocked_by = NULL WHERE blocked_by = :gate

-- name: NEW_GATE
-- gated runs joined their lines: each gate exists (LINE_JOINED then opens its line).
INSERT OR IGNORE INTO gates (gate, lim, key, turn)
    VALUES (:gate, :lim, :key, :now)

-- name: LINE_JOINED
-- gated runs joined their lines: each line may admit now (unless it is closed for want of room:
-- its ready_at stays; one closed only until its next due run is idle), at its place in the lines'
-- round robin (turn).
UPDATE gates SET ready_at = min(coalesce(turn, :now), :now) WHERE gate = :gate
    AND (ready_at IS NULL OR idle AND ready_at > :now)

-- name: REOPEN_RUN
-- a run back in its line by a retry, a signal or its children's end: the gates of
-- its head task may admit now (a retry dropped its lease), and the lines they kept closed
WITH g(gate) AS (
        SELECT t.gate_a FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
        WHERE r.id = :run_id AND r.line_at IS NOT NULL
        UNION SELECT t.gate_b FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
        WHERE r.id = :run_id AND r.line_at IS NOT NULL
        UNION SELECT t.gate_c FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
        WHERE r.id = :run_id AND r.line_at IS NOT NULL)
    UPDATE gates SET ready_at = min(coalesce(ready_at, :now), coalesce(turn, :now), :now),
        blocked_by = CASE WHEN gate IN (SELECT gate FROM g) THEN blocked_by END
    WHERE gate IN (SELECT gate FROM g) OR blocked_by IN (SELECT gate FROM g)

-- name: LINES_WAITING
-- ``check``'s recount: every line with runs in it, its gate's state and how many
-- wait there (in the line, alive, no live lease); a line whose gate has no row
SELECT r.line, g.ready_at, g.idle, g.blocked_by, g.gate IS NULL, count(*)
    FROM runs AS r LEFT JOIN gates AS g ON g.gate = r.line
    WHERE r.line IS NOT NULL AND r.line_at IS NOT NULL AND r.status IN ('pending', 'running')
      AND NOT EXISTS (SELECT 1 FROM leases AS a WHERE a.run_id = r.id
                      AND a.expires_at > :now)
    GROUP BY r.line ORDER BY r.line

-- name: REOPEN_GATES
-- ``check``'s repair: lines that must admit now
UPDATE gates SET ready_at = min(coalesce(turn, :now), :now), blocked_by = NULL,
    idle = 0 WHERE gate = :gate

-- name: UNSPEND
-- RetryAfter: the release spent no attempt
UPDATE tasks SET attempt_base = attempt_base + 1 WHERE id = :task_id

-- name: REGATE_TASK
-- a run enqueued before its task had limits, handed back at its first claim: its task names
-- its gates now, and its run moves to its line (``steps.regate``: then the head, again)
UPDATE tasks SET line = :line, gate_a = :gate_a, gate_b = :gate_b,
    gate_c = :gate_c, tokens = :tokens WHERE id = :task_id

-- name: PLACE_RUN
-- regate: the run moves to its line, its head columns (and its line and ready time) recomputed
-- from its first pending task: the head trigger's own statement (``leases_sql.PLACED``),
-- put in here when ``sql`` is imported
{placed}
