"""The PostgreSQL backend's flow control (``protocol/limits.py`` and
``protocol/gates.py``): limits, their gates, the gated claim's statements and the settling of a
lease's gates. A claimer locks every gate it looks at ``FOR UPDATE SKIP LOCKED`` (another
claimer's gates are skipped, never waited for); a commit settles its gates one by one in name
order, after its runs (lock order: runs, then gates), so no two transactions wait in a cycle.
"""

from __future__ import annotations

from .fragments import CLOCK
from .sql import ALIVE, NOTIFY, head_of

_NOW = f"(SELECT {CLOCK})"

# migration 9: ``OPEN_GATES`` reads the open gates in (ready_at, gate) order: an index of both
# serves it without sorting the thousands of gates a claim made ready at the same instant
GATES_READY_ORDER = """
    CREATE INDEX gates_ready_gate ON gates (ready_at, gate) WHERE ready_at IS NOT NULL;
    DROP INDEX gates_ready;
"""
# migration 13: a line closed only because none of its runs is due yet (``ready_at``:
# the first one's time) is ``idle``: a run that joins it due sooner opens it at once, while a
# line closed for want of room stays closed until its room comes (a settle reopens it)
# (and ``turn``: its place in the lines' round robin, the ``ready_at`` it was last open at: a
# line a full gate closed goes back to its place when it reopens, never after lines served
# since, and lines reopened together keep their order rather than their names')
GATES_IDLE = """
    ALTER TABLE gates ADD COLUMN idle boolean NOT NULL DEFAULT false;
    ALTER TABLE gates ADD COLUMN turn double precision;
"""
# the live leases that hold one of a gate's slots (``g``: gates), found through the index of
# each of the three columns a gate may stand in (a task's gates are distinct, so no lease is
# counted twice): one condition naming all three could only walk every live lease of every
# gate (bitmap scans are off in our sessions), once per gate a claim reads
_EACH = "\n        UNION ALL ".join(
    f"""SELECT count(*) AS n, min(expires_at) AS first_end FROM leases
        WHERE {c} = g.gate AND owner IS NOT NULL AND expires_at > {_NOW}"""
    for c in ("gate_a", "gate_b", "gate_c")
)
_LIVE_AND_FIRST_END = f"""(SELECT sum(x.n)::bigint AS n, min(x.first_end) AS first_end
    FROM ({_EACH}) AS x)"""
_LIVE = f"(SELECT n FROM {_LIVE_AND_FIRST_END} AS live)"

LIMIT_SPECS = "SELECT name, per, rate, burst, concurrency, tokens, token_burst FROM limits"
LIMIT_ROWS = """SELECT name, per, rate, burst, concurrency, tokens, token_burst, declared::text,
    declared_by, overrides::text, declared_at, set_at FROM limits ORDER BY name"""
# an app's declaration replaces what was declared and what an operator set
DECLARE_LIMIT = f"""INSERT INTO limits (name, per, rate, burst, concurrency, tokens, token_burst,
        declared, declared_by, declared_at)
    VALUES (%(name)s, %(per)s, %(rate)s, %(burst)s, %(concurrency)s, %(tokens)s,
            %(token_burst)s, %(declared)s::json, %(by)s, {CLOCK})
    ON CONFLICT (name) DO UPDATE SET per = excluded.per, rate = excluded.rate,
        burst = excluded.burst, concurrency = excluded.concurrency, tokens = excluded.tokens,
        token_burst = excluded.token_burst, declared = excluded.declared,
        declared_by = excluded.declared_by, declared_at = excluded.declared_at,
        overrides = NULL, set_at = NULL"""
# an operator's numbers (``limits set``), and its gates may have room now (and the lines its
# gates kept closed: a task's other limits' lines)
SET_LIMIT = f"""WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now),
set AS (UPDATE limits SET rate = %(rate)s, burst = %(burst)s, concurrency = %(concurrency)s,
        tokens = %(tokens)s, token_burst = %(token_burst)s, overrides = %(overrides)s::json,
        set_at = clock.now FROM clock WHERE name = %(name)s RETURNING name),
reopened AS (UPDATE gates SET ready_at = least(ready_at, turn, clock.now),
        blocked_by = CASE WHEN gates.lim = set.name THEN gates.blocked_by END
    FROM clock, set WHERE gates.lim = set.name
       OR gates.blocked_by IN (SELECT b.gate FROM gates AS b WHERE b.lim = set.name))
SELECT name, {NOTIFY} FROM set"""
# the runs waiting behind each gate: in a line, not leased, counted under every gate of their
# head task (a task of several limits waits in one line, behind all of its gates)
_WAITING = f"""SELECT x.gate, count(*) AS n FROM (
        SELECT unnest(ARRAY[t.gate_a, t.gate_b, t.gate_c]) AS gate FROM runs AS r
        JOIN tasks AS t ON t.id = r.head_id AND t.run_id = r.id
        WHERE r.line_at IS NOT NULL AND r.status IN {ALIVE}
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                          AND l.owner IS NOT NULL AND l.expires_at > {_NOW})) AS x
    WHERE x.gate IN (SELECT gate FROM gates WHERE lim = %(lim)s) GROUP BY x.gate"""
# each gate of a limit: its key, live leases, runs waiting behind it, pause, tokens used, buckets
_KEYS = f"""SELECT g.key, {_LIVE} AS live, coalesce(w.n, 0) AS waiting,
    CASE WHEN g.paused_until > {_NOW} THEN g.paused_until END AS paused, g.used_tokens AS used,
    g.level, g.level_at, g.tok_level, g.tok_at
    FROM gates AS g LEFT JOIN ({_WAITING}) AS w ON w.gate = g.gate WHERE g.lim = %(lim)s"""
LIMIT_KEYS = f"""SELECT key, live, waiting, paused, level, level_at, tok_level, tok_at
    FROM ({_KEYS}) AS k
    ORDER BY waiting + live DESC, key LIMIT %(limit)s"""
LIMIT_USE = f"SELECT sum(live), sum(waiting), sum(used) FROM ({_KEYS}) AS k"
# the gates whose line may admit a run now, the one served least recently first, locked
OPEN_GATES = f"""SELECT gate FROM gates WHERE ready_at <= {_NOW} ORDER BY ready_at, gate
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED"""
# the gates named (each locked, unless another claimer holds it: then no row), their limits'
# numbers, their buckets, their live leases and the first of them to end
# (its live leases counted and their first end found in one walk of them: the leases table
# keeps the rows of ended leases until a vacuum, and every claim walks them)
GATE_STATE = f"""SELECT g.gate, l.rate, l.burst, l.concurrency, l.tokens, l.token_burst,
    g.level, g.level_at, g.tok_level, g.tok_at, g.paused_until, live.n, live.first_end
    FROM gates AS g JOIN limits AS l ON l.name = g.lim
    CROSS JOIN LATERAL {_LIVE_AND_FIRST_END} AS live
    WHERE g.gate = ANY(%(gates)s::text[])
    ORDER BY g.gate FOR UPDATE OF g SKIP LOCKED"""
# the first ``limit`` claimable runs of each line named, in the served queues (NULL: all),
# locked, in one statement (a batched claim asks one run of each of many lines at once): the
# line, the run, its head task, its reservation, what an expired lease on it still holds (a
# takeover gives it back), and its gates; in the order of the lines, then each line's order
LINE_RUNS = f"""SELECT x.line, f.run_id, f.task_id, f.tokens, f.held, f.gate_a, f.gate_b, f.gate_c
    FROM unnest(%(lines)s::text[]) WITH ORDINALITY AS x(line, ord)
    CROSS JOIN LATERAL (SELECT r.id AS run_id, t.id AS task_id, t.tokens,
        (SELECT l.reserved FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL) AS held,
        t.gate_a, t.gate_b, t.gate_c, r.queue, r.priority, r.line_at, r.head_created, r.head_id
        FROM runs AS r JOIN tasks AS t ON t.id = r.head_id AND t.run_id = r.id
        WHERE r.line = x.line AND r.line_at <= {_NOW} AND r.status = 'pending'
          AND (%(queues)s::text[] IS NULL OR r.queue = ANY(%(queues)s::text[]))
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                          AND l.expires_at > {_NOW})
        ORDER BY r.queue, r.priority DESC, r.line_at, r.head_created, r.head_id
        LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED) AS f
    ORDER BY x.ord, f.queue, f.priority DESC, f.line_at, f.head_created, f.head_id"""
# when a line may next have a claimable run: its first due run, or its first lease to end
LINE_NEXT = f"""SELECT min(coalesce((SELECT l.expires_at FROM leases AS l WHERE l.run_id = r.id
        AND l.owner IS NOT NULL AND l.expires_at > {_NOW}), r.line_at))
    FROM runs AS r WHERE r.line = %(line)s AND r.line_at IS NOT NULL AND r.status IN {ALIVE}"""
# what a claim made of a gate: its buckets, its starts, when its line may next admit a run
GATE_WRITE = """UPDATE gates SET level = %(level)s, level_at = %(level_at)s,
    tok_level = %(tok_level)s, tok_at = %(tok_at)s, starts = starts + %(starts)s,
    ready_at = CASE WHEN %(keep)s THEN ready_at ELSE %(ready_at)s END,
    blocked_by = CASE WHEN %(keep)s THEN blocked_by ELSE %(blocked_by)s END,
    idle = CASE WHEN %(keep)s THEN idle ELSE %(idle)s END,
    turn = coalesce(%(turn)s::float8, turn)
    WHERE gate = %(gate)s RETURNING gate"""
# a lease ended: its reservation back (less what it cost), a hand-back's rate token back, a
# RetryAfter's pause; its line and the lines it kept closed may admit again (and idle workers
# are told)
GATE_SETTLE = f"""WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now),
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
SELECT gate, {NOTIFY} FROM settled"""
# gated runs joined their lines: each gate exists; each line may admit now (unless it is
# closed for want of room: its ready_at stays; one closed only until its next due run is idle)
PLACE_GATES = f"""INSERT INTO gates AS g (gate, lim, key, ready_at, turn)
    SELECT i.gate, i.lim, i.key, CASE WHEN i.gate = ANY(%(lines)s::text[]) THEN {_NOW} END,
        {_NOW}
    FROM unnest(%(gates)s::text[], %(lims)s::text[], %(keys)s::text[]) AS i(gate, lim, key)
    ORDER BY 1
    ON CONFLICT (gate) DO UPDATE SET ready_at = least(g.turn, excluded.ready_at)
    WHERE excluded.ready_at IS NOT NULL
      AND (g.ready_at IS NULL OR g.idle AND g.ready_at > excluded.ready_at) RETURNING g.gate"""
# a run back in its line by a retry, a signal or its children's end: the gates of
# its head task may admit now (a retry dropped its lease), and the lines they kept closed
REOPEN_RUN = f"""WITH g AS MATERIALIZED (
    SELECT x.gate FROM runs AS r JOIN tasks AS t ON t.id = r.head_id,
        unnest(ARRAY[t.gate_a, t.gate_b, t.gate_c]) AS x(gate)
    WHERE r.id = %(run_id)s AND r.line_at IS NOT NULL AND x.gate IS NOT NULL)
UPDATE gates SET ready_at = least(ready_at, turn, {_NOW}),
    blocked_by = CASE WHEN gate IN (SELECT gate FROM g) THEN blocked_by END
    WHERE gate IN (SELECT gate FROM g) OR blocked_by IN (SELECT gate FROM g) RETURNING gate"""
# ``check``'s recount: every line with runs in it, its gate's state and how many
# wait there (in the line, alive, no live lease); a line whose gate has no row
LINES_WAITING = f"""SELECT r.line, g.ready_at, g.idle, g.blocked_by, g.gate IS NULL, count(*)
    FROM runs AS r LEFT JOIN gates AS g ON g.gate = r.line
    WHERE r.line IS NOT NULL AND r.line_at IS NOT NULL AND r.status = 'pending'
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                      AND l.owner IS NOT NULL AND l.expires_at > {_NOW})
    GROUP BY r.line, g.gate ORDER BY r.line"""
# ``check``'s repair: lines that must admit now
REOPEN_GATES = f"""UPDATE gates SET ready_at = least(turn, {_NOW}), blocked_by = NULL, idle = false
    WHERE gate = %(gate)s RETURNING gate"""
# RetryAfter: the release spent no attempt
UNSPEND = "UPDATE tasks SET attempt_base = attempt_base + 1 WHERE id = %(task_id)s RETURNING id"
# a run enqueued before its task had limits, handed back at its first claim: its task names
# its gates now, and its run moves to its line
_REGATED_HEAD = head_of("r.id", without="t.id", extra="t.available_at, t.created_at, t.id, t.line")
REGATE = f"""WITH t AS (UPDATE tasks SET line = %(line)s, gate_a = %(gate_a)s, gate_b = %(gate_b)s,
        gate_c = %(gate_c)s, tokens = %(tokens)s WHERE id = %(task_id)s
        RETURNING id, available_at, created_at, line)
UPDATE runs AS r SET {_REGATED_HEAD} FROM t WHERE r.id = %(run_id)s AND r.status IN {ALIVE}
RETURNING r.id"""
