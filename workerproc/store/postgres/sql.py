"""The PostgreSQL backend's writes: claims, renewals, fenced commits, producers and operators,
each statement named with its one-line purpose (its reads are in ``reads_sql``). A name of
``store.dialect.STATEMENTS`` is a statement of the protocol's vocabulary; the others are parts
that ``steps`` or the dialect run (``LOCK_RUNS``, ``WATCH_RUN``).

Time: ``%(now)s`` is NULL in production, and then every statement reads the database clock
(``clock_timestamp()``) once, inside the statement; a test injects its clock through the same
parameter. Fenced statements lock the run row FIRST (the ``run`` CTE) and read "now" only after
that lock is held, so a write that waited behind another is judged at the instant it got its
turn. Fenced statements match task id AND owner AND attempt AND a live lease (R2); zero rows
means the caller's lease is lost. Statements whose row count matters return a row per row
changed (the store counts what it fetches). JSON goes out as text: the store decodes it
(``codec.loads``), so a value no worker can decode fails its run instead of its claimer.
"""

from __future__ import annotations

from functools import cache

from .schema import VERSION_TABLE

ALIVE = "('pending', 'running')"
_CLOCK = "coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
# "now", read once per statement, for statements that lock nothing first
_CLOCK_CTE = f"WITH clock AS MATERIALIZED (SELECT {_CLOCK} AS now)"
# the run row of the lease, locked first (lock order: run, then its tasks)
_LOCK_RUN = "run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE)"
# "now" read after the run lock is held (a row of the locked CTE must exist first)
_NOW_AFTER_LOCK = f"clock AS MATERIALIZED (SELECT {_CLOCK} AS now FROM run)"
_LOCKED = f"WITH {_LOCK_RUN}, {_NOW_AFTER_LOCK}"

# The fence every write after a claim carries (R2, R5), with ``clock`` in the FROM list.
# (tests/unfenced.py rewrites these two constants to break the fence on purpose.)
_FENCE = """t.id = %(task_id)s AND t.lease_owner = %(owner)s AND t.attempts = %(attempt)s
    AND t.lease_expires_at > clock.now AND t.done_at IS NULL"""
# the same fence for each lease of a batch (``i``: one row per lease, of one owner)
_FENCE_EACH = """t.id = i.task_id AND t.attempts = i.attempt AND t.lease_owner = %(owner)s
    AND t.lease_expires_at > clock.now AND t.done_at IS NULL"""

NOTIFY_CHANNEL = "leasekeeper.{schema}"  # work: a run's ready_at appeared or moved earlier
END_CHANNEL = "leasekeeper.{schema}.end"  # a watched run ended (Store.wait)

# -- claims (R1) ----------------------------------------------------------------------------------
# One statement leases the head task of up to ``%(limit)s`` runs of the served queues, a higher
# priority first, then in head order (the head is a run's first pending task in R1 order,
# (available_at, created_at, id), kept on the run row by triggers).
#
# - ``levels``: the priority levels that have pending runs, found by a loose index scan (one
#   index probe per level: ``max(priority) < the last one``).
# - per level, highest first, a range scan of the claim index bounded by ``head_at <= now``
#   (delayed runs are never walked, however many there are) picks runs that are alive, due and
#   hold no live lease (``lease_until``), ``FOR UPDATE SKIP LOCKED``: a run another claimer holds
#   is skipped, never waited for. Rows are locked one by one as the ``LIMIT`` pulls them, so no
#   more runs are locked than are claimed. With several named queues each queue's walk of a
#   level locks up to the limit before the merge (a sort) picks the first ``limit`` of them:
#   PostgreSQL cannot merge locked walks lazily (a locked row's sort key may have changed), so
#   up to limit x (queues - 1) runs more stay locked, unclaimed, until the transaction ends
#   (other claimers skip them meanwhile, and take the next ones).
# - Under READ COMMITTED a run changed by a transaction that committed after this statement's
#   snapshot is locked in its newest version and the WHERE clause re-checked on that version
#   (EvalPlanQual): a lease another claimer committed meanwhile is seen in ``lease_until``.
#   Each picked row is a different run and gives one task, so not even one statement hands out
#   two leases in one run.
# - ``granted``: "now" read again once every picked run is locked (``count(*)`` pulls them all).
#   The walk's "now" was read before its locks: a run whose last lease ended while the walk was
#   on its way (EvalPlanQual saw the new version) would otherwise get a lease stamped before the
#   previous one ended. The lease starts, and its ttl counts, from the moment it was granted.
# - ``leased``: each picked run's head task gets the lease (owner, expiry, attempt + 1). A run
#   comes back without a task when its head was written after the snapshot: the store claims
#   again in the same transaction (it holds the run; the next snapshot sees the head).
# - The leases come back in claim order (priority, then head order), so a worker that claims
#   more than it can start at once starts them in that order too.
_CLAIMABLE = """r.priority = lv.p AND r.head_at <= (SELECT now FROM clock)
          AND r.finished_at IS NULL
          AND (r.lease_until IS NULL OR r.lease_until <= (SELECT now FROM clock))"""
_PICK = f"""SELECT r.id, r.head_id, r.state::text AS state, r.revision, r.head_at,
            r.head_created
        FROM runs AS r
        WHERE {{queue}}{_CLAIMABLE}
        ORDER BY r.head_at, r.head_created, r.head_id
        LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED"""
# every queue: the levels and the walks use runs_prio (priority DESC, head order)
_EVERY_LEVEL = """levels(p) AS (
    SELECT (SELECT max(priority) FROM runs WHERE head_at IS NOT NULL)
    UNION ALL
    SELECT (SELECT max(priority) FROM runs WHERE head_at IS NOT NULL AND priority < levels.p)
    FROM levels WHERE levels.p IS NOT NULL)"""
# named queues: each queue's levels and walks use runs_claim (queue, priority DESC, head order)
_NAMED_LEVELS = """served(q) AS (SELECT unnest(%(queues)s::text[])),
levels(q, p) AS (
    SELECT q, (SELECT max(priority) FROM runs WHERE queue = served.q AND head_at IS NOT NULL)
    FROM served
    UNION ALL
    SELECT q, (SELECT max(priority) FROM runs
               WHERE queue = levels.q AND head_at IS NOT NULL AND priority < levels.p)
    FROM levels WHERE levels.p IS NOT NULL)"""
_CLAIM = f"""
WITH RECURSIVE clock AS MATERIALIZED (SELECT {_CLOCK} AS now),
{{levels}},
picked AS MATERIALIZED (
    SELECT c.id, c.head_id, c.state, c.revision, lv.p, c.head_at, c.head_created
    FROM (SELECT DISTINCT p FROM levels WHERE p IS NOT NULL ORDER BY p DESC) AS lv
    CROSS JOIN LATERAL ({{level}}) AS c
    LIMIT %(limit)s),
granted AS MATERIALIZED (SELECT {_CLOCK} AS now FROM (SELECT count(*) FROM picked) AS locked),
leased AS (
    UPDATE tasks AS t SET prev_owner = t.lease_owner, lease_owner = %(owner)s,
        lease_expires_at = granted.now + %(ttl)s, attempts = t.attempts + 1,
        claimed_at = granted.now
    FROM picked, granted
    WHERE t.id = picked.head_id AND t.run_id = picked.id AND t.done_at IS NULL
      AND t.available_at <= granted.now
      AND (t.lease_owner IS NULL OR t.lease_expires_at <= granted.now)
    RETURNING t.run_id, t.id, t.name, t.payload::text AS payload, t.attempts, t.attempt_base,
        t.lease_expires_at, t.claimed_at, t.prev_owner IS NOT NULL AS takeover)
SELECT leased.id, picked.id, leased.name, leased.payload, leased.attempts, leased.attempt_base,
    leased.lease_expires_at, leased.takeover, leased.claimed_at, picked.state, picked.revision,
    (SELECT o.options::text FROM task_options AS o WHERE o.name = leased.name)
FROM picked LEFT JOIN leased ON leased.run_id = picked.id
ORDER BY picked.p DESC, picked.head_at, picked.head_created, picked.head_id"""


@cache
def claim_sql(queues: int | None) -> str:
    """The claim for every queue (None) or for ``queues`` named queues (``%(queues)s``, no
    name twice)."""
    if queues is None:
        return _CLAIM.format(levels=_EVERY_LEVEL, level=_PICK.format(queue=""))
    if queues < 1:
        raise ValueError("a claim serves at least one queue")
    walks = [
        _PICK.format(queue=f"r.queue = (%(queues)s::text[])[{i}] AND ")
        for i in range(1, queues + 1)
    ]
    level = walks[0]
    if queues > 1:  # each walk locks up to the limit; the sort picks the first of them
        union = "\n        UNION ALL ".join(
            f"SELECT * FROM ({w}) AS w{i}" for i, w in enumerate(walks)
        )
        level = f"""SELECT * FROM ({union}) AS merged
        ORDER BY head_at, head_created, head_id LIMIT %(limit)s"""
    return _CLAIM.format(levels=_NAMED_LEVELS, level=level)


CLAIM = claim_sql(None)  # every queue (CLAIM_QUEUES: ``steps.claim_queues``)


# claim (R6): a claim past max_attempts hands nothing out: drop the lease, fail the run.
DROP_EXHAUSTED_LEASE = """UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = %(task_id)s RETURNING last_error"""
FAIL_RUN = f"""{_CLOCK_CTE} UPDATE runs SET status = 'failed', failure_reason = %(reason)s,
    last_error = coalesce(%(error)s, last_error), finished_at = now, updated_at = now
    FROM clock WHERE id = %(run_id)s AND status IN {ALIVE} RETURNING id"""

# -- renewals (R3) --------------------------------------------------------------------------------
# every lease of one owner in one statement: the runs are locked in id order first (no cycle
# with a batched commit), "now" is read after; each lease matches its own (task id, attempt)
# and the new expiry is max(old, now + ttl); a lease refused is recorded as evidence
RENEW_MANY = f"""
WITH run AS MATERIALIZED (
    SELECT id FROM runs WHERE id = ANY(%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE),
clock AS MATERIALIZED (SELECT {_CLOCK} AS now FROM (SELECT count(*) FROM run) AS locked),
i AS (SELECT * FROM unnest(%(task_ids)s::bigint[], %(attempts)s::int[], %(runs)s::bigint[])
      AS i(task_id, attempt, run_id)),
renewed AS (
    UPDATE tasks AS t SET lease_expires_at = greatest(t.lease_expires_at, clock.now + %(ttl)s)
    FROM i, clock WHERE {_FENCE_EACH}
    RETURNING t.id, i.attempt, t.lease_expires_at),
refused AS (
    INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    SELECT clock.now, i.task_id, i.run_id, %(owner)s, i.attempt, 'renew' FROM i, clock
    WHERE (i.task_id, i.attempt) NOT IN (SELECT id, attempt FROM renewed))
SELECT id, attempt, lease_expires_at FROM renewed"""

# -- fenced writes (R2, R5) -------------------------------------------------------------------
# a batch locks its runs in id order before its first write (two batches never wait on each
# other in a cycle); each statement's own lock of its run is then a no-op
LOCK_RUNS = "SELECT id FROM runs WHERE id = ANY(%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE"

# every fenced commit that is not one statement first asks: is this lease still the live one?
CHECK_FENCE = f"{_LOCKED} SELECT t.run_id FROM tasks AS t, clock WHERE {_FENCE}"

# ack / drop: the task is done; its lease is cleared (who held it stays)
TASK_DONE = f"""{_LOCKED}
UPDATE tasks AS t SET done_at = clock.now, done_attempt = %(attempt)s, done_owner = t.lease_owner,
    lease_owner = NULL, lease_expires_at = NULL FROM clock WHERE {_FENCE} RETURNING t.id"""

# every refused fenced write is kept: evidence that a zombie tried and was turned away
INSERT_REJECTION = f"""INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    SELECT now, %(task_id)s, %(run_id)s, %(owner)s, %(attempt)s, %(op)s
    FROM (SELECT {_CLOCK} AS now) AS clock"""

# ack: a run whose last task is acknowledged has succeeded
SUCCEED_IF_EMPTY = f"""{_CLOCK_CTE} UPDATE runs SET status = 'succeeded',
    finished_at = now, updated_at = now FROM clock
    WHERE id = %(run_id)s AND status IN {ALIVE}
      AND NOT EXISTS (SELECT 1 FROM tasks WHERE run_id = %(run_id)s AND done_at IS NULL)"""

# handback: a claimed task that never started goes back at once; its claim does not count
# against max_attempts (attempt_base moves with attempts); the fencing token still moved on
HANDBACK = f"""{_LOCKED}
UPDATE tasks AS t SET lease_owner = NULL, lease_expires_at = NULL,
    attempt_base = t.attempt_base + 1 FROM clock WHERE {_FENCE} RETURNING t.id"""

# release, one statement: give the task back after a delay, keeping the error (on the task and
# the run) and the attempt's end in the history (read before the lease is cleared)
RELEASE = f"""{_LOCKED},
fenced AS MATERIALIZED (
    SELECT t.id, t.run_id, t.attempts, t.lease_owner, t.claimed_at FROM tasks AS t, clock
    WHERE {_FENCE}),
history AS (
    INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at, ended_at, outcome,
                               error)
    SELECT run_id, id, attempts, lease_owner, claimed_at, clock.now, 'released', %(error)s
    FROM fenced, clock),
released AS (
    UPDATE tasks AS t SET lease_owner = NULL, lease_expires_at = NULL,
        available_at = clock.now + %(delay)s, last_error = coalesce(%(error)s, t.last_error)
    FROM fenced, clock WHERE t.id = fenced.id),
run_error AS (
    UPDATE runs AS r SET last_error = %(error)s, updated_at = clock.now FROM fenced, clock
    WHERE r.id = fenced.run_id AND %(error)s::text IS NOT NULL)
SELECT id FROM fenced"""

# fail (fenced): the holder fails its run; the task keeps its place for retry_run
TASK_FAILED = f"""{_LOCKED}
UPDATE tasks AS t SET lease_owner = NULL, lease_expires_at = NULL,
    last_error = coalesce(%(error)s, t.last_error) FROM clock WHERE {_FENCE}"""

# compare_and_set (R5): the state moves only at the expected revision of a live run; the fence
# rides along, so the happy path is one statement; the run row is locked before "now"
_CAS_WHERE = f"""r.id = %(run_id)s AND r.revision = %(revision)s AND r.status IN {ALIVE}
      AND EXISTS (SELECT 1 FROM tasks AS t WHERE {_FENCE} AND t.run_id = %(run_id)s)"""
CAS_STATE = f"""{_LOCKED}
UPDATE runs AS r SET state = %(state)s::json, revision = r.revision + 1,
    updated_at = clock.now FROM clock WHERE {_CAS_WHERE} RETURNING r.id"""

# finish / advance, the hot path, one statement each: the CAS above (fence included), then,
# only if it matched, the task is done and (advance) the next task inserted, the run moved to
# ``%(queue)s`` if one is given. A row comes back only when the CAS matched. Finish clears the
# run's claim columns itself (a finished run has none), so no trigger rewrites the run.
_TASK_DONE_AFTER_CAS = f"""done AS (
    UPDATE tasks AS t SET done_at = clock.now, done_attempt = %(attempt)s,
        done_owner = t.lease_owner, lease_owner = NULL, lease_expires_at = NULL
    FROM clock, cas WHERE {_FENCE})"""
FINISH = f"""{_LOCKED},
cas AS (UPDATE runs AS r SET state = %(state)s::json, revision = r.revision + 1,
    status = 'succeeded', result = %(result)s::json, finished_at = clock.now,
    updated_at = clock.now, head_at = NULL, head_created = NULL, head_id = NULL,
    lease_until = NULL FROM clock WHERE {_CAS_WHERE} RETURNING r.id),
{_TASK_DONE_AFTER_CAS}
SELECT id FROM cas"""
ADVANCE = f"""{_LOCKED},
cas AS (UPDATE runs AS r SET state = %(state)s::json, revision = r.revision + 1,
    queue = coalesce(%(queue)s::text, r.queue), updated_at = clock.now
    FROM clock WHERE {_CAS_WHERE} RETURNING r.id),
{_TASK_DONE_AFTER_CAS},
next_task AS (INSERT INTO tasks (run_id, name, payload, available_at, created_at)
    SELECT cas.id, %(name)s, %(payload)s::json, clock.now + %(delay)s, clock.now
    FROM cas, clock)
SELECT id FROM cas"""

# -- the attempt history, written on the unhappy paths only (never on claim -> commit) ------------
# an exhausted claim or a failure ends the task's current attempt without a commit; read from
# the row before the statement that clears its lease (the fence was checked already)
ATTEMPT_ENDED = f"""INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at,
        ended_at, outcome, error)
    SELECT run_id, id, attempts, lease_owner, claimed_at, clock.now, %(outcome)s, %(error)s
    FROM tasks, (SELECT {_CLOCK} AS now) AS clock
    WHERE id = %(task_id)s AND lease_owner IS NOT NULL"""
# retry_run drops the leases still held on the run's pending tasks (a cancelled run's holder)
ATTEMPTS_DROPPED_BY_RETRY = f"""INSERT INTO task_attempts (run_id, task_id, attempt, owner,
        claimed_at, ended_at, outcome, error)
    SELECT run_id, id, attempts, lease_owner, claimed_at, clock.now, 'released',
        'the run was retried: this lease was dropped'
    FROM tasks, (SELECT {_CLOCK} AS now) AS clock
    WHERE run_id = %(run_id)s AND done_at IS NULL AND lease_owner IS NOT NULL"""

# -- operators: the run row first, then its tasks -------------------------------------------
RUN_STATUS = "SELECT status FROM runs WHERE id = %(run_id)s FOR UPDATE"
CANCEL_RUN = f"""{_CLOCK_CTE} UPDATE runs SET status = 'cancelled', finished_at = now,
    updated_at = now FROM clock WHERE id = %(run_id)s AND status IN {ALIVE} RETURNING id"""
PENDING_TASKS = "SELECT count(*) FROM tasks WHERE run_id = %(run_id)s AND done_at IS NULL"
# retry_run: a new attempt generation. attempts keeps counting (the fencing token never
# repeats); attempt_base restarts what max_attempts bounds; old leases are dropped.
RETRY_RUN = f"""{_CLOCK_CTE} UPDATE runs SET status = 'pending', failure_reason = NULL,
    finished_at = NULL, updated_at = now FROM clock WHERE id = %(run_id)s"""
RETRY_TASKS = f"""{_CLOCK_CTE} UPDATE tasks SET attempt_base = attempts, available_at = now,
    lease_owner = NULL, lease_expires_at = NULL
    FROM clock WHERE run_id = %(run_id)s AND done_at IS NULL"""
# release_owner: the supervisor reaped this owner; its leases expire now. Runs first, in id
# order (two releases never wait on each other in a cycle), then their tasks (``steps``).
LOCK_OWNER_RUNS = """SELECT id FROM runs WHERE id IN (
    SELECT run_id FROM tasks WHERE lease_owner = %(owner)s AND done_at IS NULL)
    ORDER BY id FOR UPDATE"""
RELEASE_OWNER = f"""{_CLOCK_CTE}
UPDATE tasks AS t SET lease_expires_at = clock.now FROM clock
    WHERE t.lease_owner = %(owner)s AND t.lease_expires_at > clock.now AND t.done_at IS NULL
    RETURNING t.id"""

# prune: finished runs older than the cutoff, a bounded batch per transaction (their tasks and
# attempt history go with them, ON DELETE CASCADE); refused-write evidence likewise
PRUNE_RUNS = f"""DELETE FROM runs WHERE id IN (
    SELECT id FROM runs WHERE finished_at < (SELECT {_CLOCK}) - %(age)s
    ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING id"""
PRUNE_REJECTIONS = f"""DELETE FROM fence_rejections WHERE id IN (
    SELECT id FROM fence_rejections WHERE at < (SELECT {_CLOCK}) - %(age)s
    ORDER BY at LIMIT %(limit)s) RETURNING id"""

# the store's clock: the database's (or the injected one, handed back)
NOW = f"SELECT {_CLOCK}"

# -- producers (B7) ---------------------------------------------------------------------------
# Every run of the batch in one statement. Ids are drawn from the runs' sequence in the items'
# order first, so run (and first-task) ids follow the items; a key already taken (by a run
# that exists, or by an earlier item of the same batch) inserts nothing and FIND_BY_KEYS,
# a second statement with a fresh snapshot, answers the first run's id. ``{s}``: the schema
# prefix (empty on our own connections, whose search path is the schema; the caller's
# connection gets qualified names).
_INSERT_RUNS = f"""
WITH clock AS MATERIALIZED (SELECT {_CLOCK} AS now),
i AS MATERIALIZED (
    SELECT i.*, nextval(pg_get_serial_sequence('{{s}}runs', 'id')) AS id
    FROM unnest(%(states)s::text[], %(tasks)s::text[], %(payloads)s::text[],
                %(delays)s::float8[], %(keys)s::text[], %(queues)s::text[],
                %(priorities)s::int[])
         WITH ORDINALITY AS i(state, task, payload, delay, key, queue, priority, n)
    ORDER BY i.n),
new_runs AS (
    INSERT INTO {{s}}runs (id, state, task, queue, priority, key, created_at, updated_at)
    SELECT i.id, i.state::json, i.task, i.queue, i.priority, i.key, clock.now, clock.now
    FROM i, clock ORDER BY i.n
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING RETURNING id),
first_tasks AS (
    INSERT INTO {{s}}tasks (run_id, name, payload, available_at, created_at)
    SELECT i.id, i.task, i.payload::json, clock.now + i.delay, clock.now
    FROM i JOIN new_runs USING (id), clock ORDER BY i.n)
SELECT i.id, new_runs.id IS NOT NULL FROM i LEFT JOIN new_runs USING (id) ORDER BY i.n"""
_FIND_BY_KEYS = "SELECT key, id FROM {s}runs WHERE key = ANY(%(keys)s::text[])"
INSERT_RUNS = _INSERT_RUNS.format(s="")
FIND_BY_KEYS = _FIND_BY_KEYS.format(s="")

# wait(): from now on, this run's end sends a NOTIFY on the end channel
WATCH_RUN = "UPDATE runs SET watched = true WHERE id = %(run_id)s AND NOT watched"
# transactional enqueue: the caller's connection reaches our schema, at our version, in our
# database
CALLERS_DATABASE = f"""SELECT current_database(),
    (SELECT max(version) FROM {{s}}{VERSION_TABLE})"""

# -- per-task options (B11) -----------------------------------------------------------------
SET_TASK_OPTIONS = f"""INSERT INTO task_options (name, options, updated_at)
    VALUES (%(name)s, %(options)s::json, {_CLOCK})
    ON CONFLICT (name) DO UPDATE SET options = excluded.options, updated_at = excluded.updated_at"""
DROP_TASK_OPTIONS = "DELETE FROM task_options WHERE name = %(name)s"
