"""The SQLite backend's writes: claims, renewals, fenced commits and producers, each statement
named with its one-line purpose (its reads are in ``reads_sql``, its operators' in
``ops_sql``). A name of ``store.dialect.STATEMENTS`` is a statement of the protocol's
vocabulary; the others are parts
that ``steps`` composes into one logical step (``FINISH`` is ``CAS_FINISH`` then
``TASK_DONE``).

Fenced statements match task id AND owner AND attempt AND a live lease (R2); zero rows changed
means the caller's lease is lost. ``:now`` is always read after ``BEGIN IMMEDIATE`` succeeded.
"""

from __future__ import annotations

from ..types import SYSTEM_RUNS
from .schema import _HEAD_LINE_AND_READY

ALIVE = "('pending', 'running')"  # a run that may still change ('running': before schema v9)

# The fence every write after a claim carries (R2, R5).
_FENCE = """id = :task_id AND lease_owner = :owner AND attempts = :attempt
    AND lease_expires_at > :now AND done_at IS NULL"""

# start_run: a new run and its first task. With a key, a run with that key already there
# makes the insert a no-op (and FIND_BY_KEY answers its id).
# A new run's id is one past the largest ever given (schema v8: ids are never reused), below
# the system's runs (v22: ``SYSTEM_RUNS`` up, a range of their own, B20): one index seek each.
_INSERT_RUN = """INSERT INTO runs (id, state, task, queue, priority, key, created_at, updated_at,
        traceparent)
    VALUES ({id}, :state, :name, :queue, :priority, :key, :now, :now, :traceparent)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING RETURNING id"""
INSERT_RUN = _INSERT_RUN.format(
    id=f"""max(coalesce(
        (SELECT max(id) FROM runs WHERE id < {SYSTEM_RUNS}), 0), (SELECT high FROM run_ids)) + 1"""
)
# a system run (a webhook's delivery run): one past the largest system id ever given
INSERT_SYSTEM_RUN = _INSERT_RUN.format(
    id=f"""max(coalesce((SELECT max(id) FROM runs), 0),
        (SELECT system_high FROM run_ids), {SYSTEM_RUNS}) + 1"""
)
FIND_BY_KEY = "SELECT id FROM runs WHERE key = :key"
# (a task with limits names its gates, its line and its reservation: ``store/limits.py``; the
# head trigger puts its run in the line instead of the claim index; its id is one past the
# largest ever given, so a pruned task's id never comes back: migration 24)
INSERT_TASK = """INSERT INTO tasks (id, run_id, name, payload, available_at, created_at, line,
        gate_a, gate_b, gate_c, tokens)
    VALUES (max(coalesce((SELECT max(id) FROM tasks), 0), (SELECT task_high FROM run_ids)) + 1,
            :run_id, :name, :payload, :now + :delay, :now, :line, :gate_a, :gate_b, :gate_c,
            :tokens)"""

# a claim that takes over a lease whose handler never began spends no attempt (B3): its
# attempt_base moves with attempts, as a hand-back's does; and the claim records whether its
# own lease begins at once (``:start``) or waits (its start recorded by RENEW_MANY). A lease
# the claimer takes over from itself waits: its older handler may still run in that worker,
# and the new one begins only once it ended (SET reads the row as it was)
_COUNTED = """attempt_base = attempt_base + (lease_owner IS NOT NULL AND NOT started),
    started = :start AND (lease_owner IS NULL OR lease_owner <> :owner)"""

# claim (R1): one statement picks the first ``:limit`` claimable runs of the served queues, a
# higher priority first, then in head order (the head is a run's first pending task in
# (available_at, created_at, id) order, kept by triggers), and claims each one's first task:
# writes owner and expiry and counts the attempt. A run is claimable when its head is due, it
# is alive, and none of its tasks holds a live lease; each picked run gives one task, so not
# even one statement can hand out two leases in one run.
# Priority levels are found by a loose index scan (a max() below the last one), so every walk
# of the claim index is bounded by ``head_at <= :now``: delayed runs are never walked, however
# many there are, and a run with 100,000 tasks behind one live lease costs one index entry.
_CLAIM = f"""
WITH RECURSIVE
  served(q) AS ({{served}}),
  levels(q, p) AS (
    SELECT q, (SELECT max(priority) FROM runs WHERE queue = served.q AND head_at IS NOT NULL)
    FROM served WHERE q IS NOT NULL{{skip}}
    UNION ALL
    SELECT q, (SELECT max(priority) FROM runs
               WHERE queue = levels.q AND head_at IS NOT NULL AND priority < levels.p)
    FROM levels WHERE p IS NOT NULL),
  picked(run_id) AS (
    SELECT r.id FROM levels JOIN runs AS r ON r.id IN (
        SELECT x.id FROM runs AS x
        WHERE x.queue = levels.q AND x.priority = levels.p AND x.head_at <= :now
          AND +x.status IN {ALIVE}
          AND NOT EXISTS (SELECT 1 FROM tasks AS a
                          WHERE a.run_id = x.id AND a.lease_owner IS NOT NULL
                            AND a.lease_expires_at > :now)
        ORDER BY x.head_at, x.head_created, x.head_id LIMIT :limit)
    WHERE levels.p IS NOT NULL
    ORDER BY r.priority DESC, r.head_at, r.head_created, r.head_id LIMIT :limit)
UPDATE tasks SET prev_owner = lease_owner, lease_owner = :owner, lease_expires_at = :now + :ttl,
    attempts = attempts + 1, claimed_at = :now, {_COUNTED}
WHERE id IN (
    SELECT (SELECT t.id FROM tasks AS t
            WHERE t.run_id = picked.run_id AND t.done_at IS NULL AND t.available_at <= :now
              AND (t.lease_owner IS NULL OR t.lease_expires_at <= :now)
            ORDER BY t.available_at, t.created_at, t.id LIMIT 1)
    FROM picked)
RETURNING id, run_id, name, payload, attempts, attempt_base, lease_expires_at,
    prev_owner IS NOT NULL
"""
# the queues a claim serves: those named (a JSON array), or every queue with pending work,
# found by a loose index scan of the claim index (one seek per queue)
_NAMED_QUEUES = "SELECT value FROM json_each(:queues)"
_EVERY_QUEUE = """SELECT min(queue) FROM runs WHERE head_at IS NOT NULL
    UNION ALL
    SELECT (SELECT min(queue) FROM runs WHERE head_at IS NOT NULL AND queue > served.q)
    FROM served WHERE q IS NOT NULL"""
CLAIM = _CLAIM.format(served=_EVERY_QUEUE, skip="")
CLAIM_QUEUES = _CLAIM.format(served=_NAMED_QUEUES, skip="")
# every queue but those of :skip (a JSON array): a worker's claim for its users' slots, which
# leaves the webhooks' queue to its delivery lane (B20)
CLAIM_OTHERS = _CLAIM.format(
    served=_EVERY_QUEUE, skip=" AND q NOT IN (SELECT value FROM json_each(:skip))"
)

# claim: hand the run's state and its queue to the handler, and the claimed task's declared
# options (B11; NULL: none)
# and the signal that resumed it, if it waited for one, the run's parent and its join task (B14),
# and its trace context (tracing)
RUN_STATE = """SELECT state, revision, queue,
    (SELECT options FROM task_options WHERE name = :name),
    (SELECT signal_id FROM tasks WHERE id = :task_id), parent_id, join_task, traceparent
    FROM runs WHERE id = :run_id"""

# claim (R6): a claim past max_attempts hands nothing out: drop the lease, fail the run.
DROP_EXHAUSTED_LEASE = """UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = :task_id RETURNING last_error"""
FAIL_RUN = f"""UPDATE runs SET status = 'failed', failure_reason = :reason,
    last_error = coalesce(:error, last_error), finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN {ALIVE}"""

# renew (R3): a live lease's new expiry (``steps.renew_many`` renews each lease of the batch in
# turn). Each renewed lease also says whether its run is still alive (B15): a cancelled run's
# holder hears it at its next renewal, and stops its handler. A lease whose handler begins on
# this renewal (``:start``) is recorded as begun (B3).
RENEW = f"""UPDATE tasks SET lease_expires_at = max(lease_expires_at, :now + :ttl),
    started = started OR :start
    WHERE {_FENCE} RETURNING id, attempts, lease_expires_at,
    (SELECT status IN {ALIVE} FROM runs WHERE runs.id = tasks.run_id)"""

# every fenced commit first asks: is this lease still the live one?
CHECK_FENCE = f"SELECT run_id FROM tasks WHERE {_FENCE}"

# ack / drop / advance / finish: the task is done; its lease is cleared (who held it stays).
TASK_DONE = f"""UPDATE tasks SET done_at = :now, done_attempt = :attempt, done_owner = lease_owner,
    lease_owner = NULL, lease_expires_at = NULL WHERE {_FENCE}"""

# every refused fenced write is kept: evidence that a zombie tried and was turned away
INSERT_REJECTION = """INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    VALUES (:now, :task_id, :run_id, :owner, :attempt, :op)"""

# ack: a run whose last task is acknowledged has succeeded.
SUCCEED_IF_EMPTY = f"""UPDATE runs SET status = 'succeeded', finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN {ALIVE}
      AND NOT EXISTS (SELECT 1 FROM tasks WHERE run_id = :run_id AND done_at IS NULL)"""

# handback: a claimed task that never started goes back at once, and its claim does not count
# against max_attempts (attempt_base moves with attempts); the fencing token still moved on.
HANDBACK_TASK = f"""UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,
    attempt_base = attempt_base + 1 WHERE {_FENCE}"""

# release: give the task back after a delay, keeping the error (``steps.release`` first checks
# the fence and keeps the attempt's end in the history, ATTEMPT_ENDED).
RELEASE_TASK = f"""UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,
    available_at = :now + :delay, last_error = coalesce(:error, last_error)
    WHERE {_FENCE}"""
# the error goes onto a live run only: a run that is over (cancelled under its holder, B15)
# is never written again
RUN_ERROR = f"""UPDATE runs SET last_error = :error, updated_at = :now
    WHERE id = :run_id AND status IN {ALIVE}"""

# fail (fenced): the holder fails its run; the task keeps its place for retry_run.
TASK_FAILED = f"""UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,
    last_error = coalesce(:error, last_error) WHERE {_FENCE}"""

# compare_and_set (R5): the state moves only at the expected revision of a live run.
# The fence rides along (EXISTS): one statement on the happy path; only when it changes nothing
# does CHECK_FENCE tell a lost lease from a conflict.
CAS_STATE = f"""UPDATE runs SET state = :state, revision = revision + 1, updated_at = :now
    WHERE id = :run_id AND revision = :revision AND status IN {ALIVE}
      AND EXISTS (SELECT 1 FROM tasks WHERE {_FENCE} AND run_id = :run_id)"""
# (a finished run leaves the claim indexes at once: its claim columns are cleared here, so the
# status trigger has nothing to recompute)
CAS_FINISH = f"""UPDATE runs SET state = :state, revision = revision + 1, status = 'succeeded',
    result = :result, finished_at = :now, updated_at = :now,
    head_at = NULL, head_created = NULL, head_id = NULL, ready_at = NULL, line_at = NULL,
    line = NULL
    WHERE id = :run_id AND revision = :revision AND status IN {ALIVE}
      AND EXISTS (SELECT 1 FROM tasks WHERE {_FENCE} AND run_id = :run_id)"""
CAS_NEXT_TASK = INSERT_TASK
# advance to another queue: the run (and so its next task) moves there
MOVE_RUN = "UPDATE runs SET queue = :queue WHERE id = :run_id"

# a line that may admit now goes back to its place in the lines' round robin (``turn``): never
# behind lines served since it closed, and lines reopened together keep their order
_IN_TURN = "min(coalesce(ready_at, :now), coalesce(turn, :now), :now)"
# release_owner: the supervisor reaped this owner; its leases expire now, and the gates whose
# slots they held may admit again (``steps.release_owner``)
EXPIRE_OWNER = """UPDATE tasks SET lease_expires_at = :now
    WHERE lease_owner = :owner AND lease_expires_at > :now AND done_at IS NULL"""
# (and the lines they kept closed: a task's other limits' lines)
REOPEN_OWNER_GATES = f"""WITH g(gate) AS (
        SELECT gate_a FROM tasks WHERE lease_owner = :owner AND done_at IS NULL
        UNION SELECT gate_b FROM tasks WHERE lease_owner = :owner AND done_at IS NULL
        UNION SELECT gate_c FROM tasks WHERE lease_owner = :owner AND done_at IS NULL)
    UPDATE gates SET ready_at = {_IN_TURN},
        blocked_by = CASE WHEN gate IN (SELECT gate FROM g) THEN blocked_by END
    WHERE gate IN (SELECT gate FROM g) OR blocked_by IN (SELECT gate FROM g)"""

# -- the attempt history, written on the unhappy paths only (never on claim -> commit) --------
# a release, a failure or an exhausted claim ends the task's current attempt without a commit;
# read from the row before the statement that clears its lease (the fence was checked already)
ATTEMPT_ENDED = """INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at,
        ended_at, outcome, error)
    SELECT run_id, id, attempts, lease_owner, claimed_at, :now, :outcome, :error FROM tasks
    WHERE id = :task_id AND lease_owner IS NOT NULL"""
# retry_run drops the leases still held on the run's pending tasks (a cancelled run's holder)
ATTEMPTS_DROPPED_BY_RETRY = """INSERT INTO task_attempts (run_id, task_id, attempt, owner,
        claimed_at, ended_at, outcome, error)
    SELECT run_id, id, attempts, lease_owner, claimed_at, :now, 'released',
        'the run was retried: this lease was dropped' FROM tasks
    WHERE run_id = :run_id AND done_at IS NULL AND lease_owner IS NOT NULL"""

# -- per-task options (B11) -----------------------------------------------------------------
SET_TASK_OPTIONS = """INSERT INTO task_options (name, options, updated_at)
    VALUES (:name, :options, :now)
    ON CONFLICT (name) DO UPDATE SET options = excluded.options, updated_at = excluded.updated_at"""
DROP_TASK_OPTIONS = "DELETE FROM task_options WHERE name = :name"


# -- flow control (``protocol/limits.py``, ``protocol/gates.py``) ---------------------
# a task's live leases on a gate: the slots of its concurrency cap that are held (``g``: gates)
_LIVE_ON = """(SELECT count(*) FROM tasks WHERE {col} = g.gate AND lease_owner IS NOT NULL
        AND lease_expires_at > :now AND done_at IS NULL)"""
_FIRST_END_ON = """SELECT min(lease_expires_at) AS e FROM tasks WHERE {col} = g.gate
        AND lease_owner IS NOT NULL AND lease_expires_at > :now AND done_at IS NULL"""
_LIVE = " + ".join(_LIVE_ON.format(col=c) for c in ("gate_a", "gate_b", "gate_c"))
_FIRST_END = " UNION ALL ".join(_FIRST_END_ON.format(col=c) for c in ("gate_a", "gate_b",
                                                                      "gate_c"))  # fmt: skip
LIMIT_SPECS = "SELECT name, per, rate, burst, concurrency, tokens, token_burst FROM limits"
LIMIT_ROWS = """SELECT name, per, rate, burst, concurrency, tokens, token_burst, declared,
    declared_by, overrides, declared_at, set_at FROM limits ORDER BY name"""
# an app's declaration replaces what was declared and what an operator set
DECLARE_LIMIT = """INSERT INTO limits (name, per, rate, burst, concurrency, tokens, token_burst,
        declared, declared_by, declared_at)
    VALUES (:name, :per, :rate, :burst, :concurrency, :tokens, :token_burst, :declared, :by, :now)
    ON CONFLICT (name) DO UPDATE SET per = excluded.per, rate = excluded.rate,
        burst = excluded.burst, concurrency = excluded.concurrency, tokens = excluded.tokens,
        token_burst = excluded.token_burst, declared = excluded.declared,
        declared_by = excluded.declared_by, declared_at = excluded.declared_at,
        overrides = NULL, set_at = NULL"""
# an operator's numbers (``limits set``); its gates may have room now (steps: REOPEN_LIMIT)
SET_LIMIT_NUMBERS = """UPDATE limits SET rate = :rate, burst = :burst, concurrency = :concurrency,
    tokens = :tokens, token_burst = :token_burst, overrides = :overrides, set_at = :now
    WHERE name = :name"""
# (and the lines its gates kept closed: a task's other limits' lines)
REOPEN_LIMIT = f"""UPDATE gates SET ready_at = {_IN_TURN},
    blocked_by = CASE WHEN lim = :name THEN blocked_by END
    WHERE lim = :name OR blocked_by IN (SELECT gate FROM gates WHERE lim = :name)"""
# the runs waiting behind each gate: in a line, not leased, counted under every gate of their
# head task (a task of several limits waits in one line, behind all of its gates)
_WAITING = f"""SELECT x.gate AS gate, count(*) AS n FROM (
        SELECT CASE k.i WHEN 1 THEN t.gate_a WHEN 2 THEN t.gate_b ELSE t.gate_c END AS gate
        FROM runs AS r JOIN tasks AS t ON t.id = r.head_id,
             (SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3) AS k
        WHERE r.line_at IS NOT NULL AND r.status IN {ALIVE}
          AND NOT EXISTS (SELECT 1 FROM tasks AS a WHERE a.run_id = r.id
                          AND a.lease_owner IS NOT NULL AND a.lease_expires_at > :now)) AS x
    WHERE x.gate IN (SELECT gate FROM gates WHERE lim = :lim) GROUP BY x.gate"""
# each gate of a limit: its key, live leases, runs waiting behind it, pause, tokens used, buckets
_KEYS = f"""SELECT g.key AS key, {_LIVE} AS live, coalesce(w.n, 0) AS waiting,
    CASE WHEN g.paused_until > :now THEN g.paused_until END AS paused, g.used_tokens AS used,
    g.level AS level, g.level_at AS level_at, g.tok_level AS tok_level, g.tok_at AS tok_at
    FROM gates AS g LEFT JOIN ({_WAITING}) AS w ON w.gate = g.gate WHERE g.lim = :lim"""
LIMIT_KEYS = f"""SELECT key, live, waiting, paused, level, level_at, tok_level, tok_at
    FROM ({_KEYS})
    ORDER BY waiting + live DESC, key LIMIT :limit"""
LIMIT_USE = f"SELECT sum(live), sum(waiting), sum(used) FROM ({_KEYS})"
# the gates whose line may admit a run now, the one served least recently first
OPEN_GATES = """SELECT gate FROM gates WHERE ready_at <= :now ORDER BY ready_at, gate
    LIMIT :limit"""
# one gate, its limit's numbers, its buckets, its live leases and the first of them to end
GATE_STATE = f"""SELECT g.gate, l.rate, l.burst, l.concurrency, l.tokens, l.token_burst, g.level,
    g.level_at, g.tok_level, g.tok_at, g.paused_until, {_LIVE},
    (SELECT min(e) FROM ({_FIRST_END}))
    FROM gates AS g JOIN limits AS l ON l.name = g.lim WHERE g.gate = :gate"""
# the first claimable runs of a line in the served queues (a JSON array; NULL: all): their head
# task, its reservation, what an expired lease on it still holds (a takeover gives it back),
# and its gates
LINE_RUNS = f"""SELECT r.id, t.id, t.tokens,
        CASE WHEN t.lease_owner IS NOT NULL THEN t.tokens END, t.gate_a, t.gate_b, t.gate_c
    FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
    WHERE r.line = :line AND r.line_at <= :now AND +r.status IN {ALIVE}
      AND (:queues IS NULL OR r.queue IN (SELECT value FROM json_each(:queues)))
      AND NOT EXISTS (SELECT 1 FROM tasks AS a WHERE a.run_id = r.id
                      AND a.lease_owner IS NOT NULL AND a.lease_expires_at > :now)
    ORDER BY r.queue, r.priority DESC, r.line_at, r.head_created, r.head_id LIMIT :limit"""
# when a line may next have a claimable run: its first due run, or its first lease to end
LINE_NEXT = f"""SELECT min(coalesce((SELECT max(a.lease_expires_at) FROM tasks AS a
        WHERE a.run_id = r.id AND a.lease_owner IS NOT NULL AND a.lease_expires_at > :now),
        r.line_at))
    FROM runs AS r WHERE r.line = :line AND r.line_at IS NOT NULL AND r.status IN {ALIVE}"""
# lease the head task of each admitted run (R1-R3 as in CLAIM); a takeover's predecessor held
# the task's reservation until its lease expired: it is given back (the last column)
CLAIM_RUNS = f"""UPDATE tasks SET prev_owner = lease_owner, lease_owner = :owner,
    lease_expires_at = :now + :ttl, attempts = attempts + 1, claimed_at = :now, {_COUNTED}
    WHERE id IN (SELECT head_id FROM runs WHERE id IN (SELECT value FROM json_each(:run_ids))
                 AND line_at <= :now AND status IN {ALIVE})
      AND done_at IS NULL AND (lease_owner IS NULL OR lease_expires_at <= :now)
    RETURNING id, run_id, name, payload, attempts, attempt_base, lease_expires_at,
        prev_owner IS NOT NULL, gate_a, gate_b, gate_c, tokens,
        CASE WHEN prev_owner IS NOT NULL THEN tokens END"""
# what a claim made of a gate: its buckets, its starts, when its line may next admit a run
GATE_WRITE = """UPDATE gates SET level = :level, level_at = :level_at, tok_level = :tok_level,
    tok_at = :tok_at, starts = starts + :starts,
    ready_at = CASE WHEN :keep THEN ready_at ELSE :ready_at END,
    blocked_by = CASE WHEN :keep THEN blocked_by ELSE :blocked_by END,
    idle = CASE WHEN :keep THEN idle ELSE :idle END,
    turn = coalesce(:turn, turn)
    WHERE gate = :gate"""
# a lease ended: its reservation back (less what it cost), a hand-back's rate token back, a
# RetryAfter's pause; its line and the lines it kept closed may admit again (steps)
SETTLE_GATE = f"""UPDATE gates SET
    tok_level = CASE WHEN tok_level IS NULL THEN NULL ELSE tok_level + :back END,
    level = CASE WHEN level IS NULL THEN NULL ELSE level + :unstart END,
    starts = starts - :unstart, used_tokens = used_tokens + :charged,
    paused_until = CASE WHEN :pause IS NULL THEN paused_until
                        ELSE max(paused_until, :now + :pause) END,
    ready_at = CASE WHEN :pause IS NULL THEN {_IN_TURN}
                    ELSE max(paused_until, :now + :pause) END
    WHERE gate = :gate"""
REOPEN_BLOCKED = f"""UPDATE gates SET ready_at = {_IN_TURN},
    blocked_by = NULL WHERE blocked_by = :gate"""
# gated runs joined their lines: each gate exists; each line may admit now (unless it is
# closed for want of room: its ready_at stays; one closed only until its next due run is idle)
NEW_GATE = """INSERT OR IGNORE INTO gates (gate, lim, key, turn)
    VALUES (:gate, :lim, :key, :now)"""
LINE_JOINED = """UPDATE gates SET ready_at = min(coalesce(turn, :now), :now) WHERE gate = :gate
    AND (ready_at IS NULL OR idle AND ready_at > :now)"""
# a run back in its line by a retry, a signal or its children's end: the gates of
# its head task may admit now (a retry dropped its lease), and the lines they kept closed
REOPEN_RUN = f"""WITH g(gate) AS (
        SELECT t.gate_a FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
        WHERE r.id = :run_id AND r.line_at IS NOT NULL
        UNION SELECT t.gate_b FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
        WHERE r.id = :run_id AND r.line_at IS NOT NULL
        UNION SELECT t.gate_c FROM runs AS r JOIN tasks AS t ON t.id = r.head_id
        WHERE r.id = :run_id AND r.line_at IS NOT NULL)
    UPDATE gates SET ready_at = {_IN_TURN},
        blocked_by = CASE WHEN gate IN (SELECT gate FROM g) THEN blocked_by END
    WHERE gate IN (SELECT gate FROM g) OR blocked_by IN (SELECT gate FROM g)"""
# ``check``'s recount: every line with runs in it, its gate's state and how many
# wait there (in the line, alive, no live lease); a line whose gate has no row
LINES_WAITING = f"""SELECT r.line, g.ready_at, g.idle, g.blocked_by, g.gate IS NULL, count(*)
    FROM runs AS r LEFT JOIN gates AS g ON g.gate = r.line
    WHERE r.line IS NOT NULL AND r.line_at IS NOT NULL AND r.status IN {ALIVE}
      AND NOT EXISTS (SELECT 1 FROM tasks AS a WHERE a.run_id = r.id
                      AND a.lease_owner IS NOT NULL AND a.lease_expires_at > :now)
    GROUP BY r.line ORDER BY r.line"""
# ``check``'s repair: lines that must admit now
REOPEN_GATES = """UPDATE gates SET ready_at = min(coalesce(turn, :now), :now), blocked_by = NULL,
    idle = 0 WHERE gate = :gate"""
# RetryAfter: the release spent no attempt
UNSPEND = "UPDATE tasks SET attempt_base = attempt_base + 1 WHERE id = :task_id"
# a run enqueued before its task had limits, handed back at its first claim: its task names
# its gates now, and its run moves to its line (``steps.regate``: then the head, again)
REGATE_TASK = """UPDATE tasks SET line = :line, gate_a = :gate_a, gate_b = :gate_b,
    gate_c = :gate_c, tokens = :tokens WHERE id = :task_id"""
PLACE_RUN = f"UPDATE runs SET {_HEAD_LINE_AND_READY} WHERE id = :run_id"
