"""Every SQL statement of the PostgreSQL backend, each named with its one-line purpose.

Time: ``%(now)s`` is NULL in production, and then every statement reads the database clock
(``clock_timestamp()``) once, inside the statement; a test injects its clock through the same
parameter. Fenced statements lock the run row FIRST (the ``run`` CTE) and read "now" only after
that lock is held, so a write that waited behind another is judged at the instant it got its
turn. Fenced statements match task id AND owner AND attempt AND a live lease (R2); zero rows
means the caller's lease is lost. Statements whose row count matters return a row per row
changed (the store counts what it fetches).
"""

from __future__ import annotations

ALIVE = "('pending', 'running')"
_CLOCK = "coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
# "now", read once per statement, for statements that lock nothing first (``clock.now``)
_CLOCK_CTE = f"WITH clock AS MATERIALIZED (SELECT {_CLOCK} AS now)"
# the run row of the lease, locked first (lock order: run, then its tasks)
_LOCK_RUN = "run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE)"
# "now" read after the run lock is held (a row of the locked CTE must exist first)
_NOW_AFTER_LOCK = f"clock AS MATERIALIZED (SELECT {_CLOCK} AS now FROM run)"
_LOCKED = f"WITH {_LOCK_RUN}, {_NOW_AFTER_LOCK}"

# The fence every write after a claim carries (R2, R5), with ``clock`` in the FROM list.
_FENCE = """t.id = %(task_id)s AND t.lease_owner = %(owner)s AND t.attempts = %(attempt)s
    AND t.lease_expires_at > clock.now AND t.done_at IS NULL"""

NOTIFY_CHANNEL = "leasekeeper.{schema}"

# start_run: a new run and its first task, one statement (the trigger fills the claim columns)
START_RUN = f"""
{_CLOCK_CTE},
new_run AS (
    INSERT INTO runs (state, created_at, updated_at)
    SELECT %(state)s::json, now, now FROM clock RETURNING id)
INSERT INTO tasks (run_id, name, payload, available_at, created_at)
SELECT new_run.id, %(name)s, %(payload)s::json, clock.now + %(delay)s, clock.now
FROM new_run, clock
RETURNING run_id"""

# claim (R1): one statement. It walks runs in head order and locks the first run that is alive,
# has a ready head and no live lease, skipping runs other transactions hold (SKIP LOCKED). Under
# READ COMMITTED a run changed by a transaction that committed after this statement's snapshot
# is locked in its newest version and the WHERE clause re-checked on that version
# (EvalPlanQual): a lease another claimer committed meanwhile is seen in ``lease_until``. The
# run's head task is then leased (owner, expiry, attempt + 1). ``run_id`` comes back even when
# no task was updated (a head inserted after the snapshot): the caller then claims again.
# (A run is alive exactly when ``finished_at`` is NULL (a CHECK): that form keeps the planner on
# the ``runs_head`` index walk rather than the status index and a sort.)
CLAIM = f"""
{_CLOCK_CTE},
run AS MATERIALIZED (
    SELECT r.id, r.head_id, r.state, r.revision FROM runs AS r
    WHERE r.head_at <= (SELECT now FROM clock) AND r.finished_at IS NULL
      AND (r.lease_until IS NULL OR r.lease_until <= (SELECT now FROM clock))
    ORDER BY r.head_at, r.head_created, r.head_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
leased AS (
    UPDATE tasks AS t SET prev_owner = t.lease_owner, lease_owner = %(owner)s,
        lease_expires_at = clock.now + %(ttl)s, attempts = t.attempts + 1, claimed_at = clock.now
    FROM run, clock
    WHERE t.id = run.head_id AND t.run_id = run.id AND t.done_at IS NULL
      AND t.available_at <= clock.now
      AND (t.lease_owner IS NULL OR t.lease_expires_at <= clock.now)
    RETURNING t.id, t.name, t.payload, t.attempts, t.attempt_base, t.lease_expires_at,
        t.claimed_at, t.prev_owner IS NOT NULL AS takeover)
SELECT run.id, run.state, run.revision, leased.* FROM run LEFT JOIN leased ON true"""

# claim (R6): a claim past max_attempts hands nothing out: drop the lease, fail the run.
DROP_EXHAUSTED_LEASE = """UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = %(task_id)s RETURNING last_error"""
FAIL_RUN = f"""{_CLOCK_CTE} UPDATE runs SET status = 'failed', failure_reason = %(reason)s,
    last_error = coalesce(%(error)s, last_error), finished_at = now, updated_at = now
    FROM clock WHERE id = %(run_id)s AND status IN {ALIVE} RETURNING id"""

# renew (R3): never an expired lease; the new expiry is max(old, now + ttl).
RENEW = f"""{_LOCKED}
UPDATE tasks AS t SET lease_expires_at = greatest(t.lease_expires_at, clock.now + %(ttl)s)
FROM clock WHERE {_FENCE} RETURNING t.lease_expires_at"""

# every fenced commit first asks: is this lease still the live one? (and locks the run)
CHECK_FENCE = f"{_LOCKED} SELECT t.run_id FROM tasks AS t, clock WHERE {_FENCE}"

# ack / drop / advance / finish: the task is done; its lease is cleared.
TASK_DONE = f"""{_LOCKED}
UPDATE tasks AS t SET done_at = clock.now, done_attempt = %(attempt)s, lease_owner = NULL,
    lease_expires_at = NULL FROM clock WHERE {_FENCE} RETURNING t.id"""

# every refused fenced write is kept: evidence that a zombie tried and was turned away
INSERT_REJECTION = f"""INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    SELECT now, %(task_id)s, %(run_id)s, %(owner)s, %(attempt)s, %(op)s
    FROM (SELECT {_CLOCK} AS now) AS clock"""

# ack: a run whose last task is acknowledged has succeeded.
SUCCEED_IF_EMPTY = f"""{_CLOCK_CTE} UPDATE runs SET status = 'succeeded',
    finished_at = now, updated_at = now FROM clock
    WHERE id = %(run_id)s AND status IN {ALIVE}
      AND NOT EXISTS (SELECT 1 FROM tasks WHERE run_id = %(run_id)s AND done_at IS NULL)"""

# release: give the task back after a delay, keeping the error.
RELEASE = f"""{_LOCKED}
UPDATE tasks AS t SET lease_owner = NULL, lease_expires_at = NULL,
    available_at = clock.now + %(delay)s, last_error = coalesce(%(error)s, t.last_error)
    FROM clock WHERE {_FENCE}"""
RUN_ERROR = f"""{_CLOCK_CTE} UPDATE runs SET last_error = %(error)s, updated_at = now
    FROM clock WHERE id = %(run_id)s"""

# fail (fenced): the holder fails its run; the task keeps its place for retry_run.
TASK_FAILED = f"""{_LOCKED}
UPDATE tasks AS t SET lease_owner = NULL, lease_expires_at = NULL,
    last_error = coalesce(%(error)s, t.last_error) FROM clock WHERE {_FENCE}"""

# compare_and_set (R5): the state moves only at the expected revision of a live run; the fence
# rides along, so the happy path is one statement; the run row is locked before "now".
_CAS_WHERE = f"""r.id = %(run_id)s AND r.revision = %(revision)s AND r.status IN {ALIVE}
      AND EXISTS (SELECT 1 FROM tasks AS t WHERE {_FENCE} AND t.run_id = %(run_id)s)"""
CAS_STATE = f"""{_LOCKED}
UPDATE runs AS r SET state = %(state)s::json, revision = r.revision + 1,
    updated_at = clock.now FROM clock WHERE {_CAS_WHERE} RETURNING r.id"""

# finish / advance, the hot path, one statement: the CAS above (fence included), then, only if
# it matched, the task is done and (advance) the next task inserted. A row comes back only when
# the CAS matched; the triggers see the statement's outcome as a whole.
_TASK_DONE_AFTER_CAS = f"""done AS (
    UPDATE tasks AS t SET done_at = clock.now, done_attempt = %(attempt)s, lease_owner = NULL,
        lease_expires_at = NULL FROM clock, cas WHERE {_FENCE})"""
FINISH = f"""{_LOCKED},
cas AS (UPDATE runs AS r SET state = %(state)s::json, revision = r.revision + 1,
    status = 'succeeded', result = %(result)s::json, finished_at = clock.now,
    updated_at = clock.now FROM clock WHERE {_CAS_WHERE} RETURNING r.id),
{_TASK_DONE_AFTER_CAS}
SELECT id FROM cas"""
ADVANCE = f"""{_LOCKED},
cas AS (UPDATE runs AS r SET state = %(state)s::json, revision = r.revision + 1,
    updated_at = clock.now FROM clock WHERE {_CAS_WHERE} RETURNING r.id),
{_TASK_DONE_AFTER_CAS},
next_task AS (INSERT INTO tasks (run_id, name, payload, available_at, created_at)
    SELECT cas.id, %(name)s, %(payload)s::json, clock.now + %(delay)s, clock.now
    FROM cas, clock)
SELECT id FROM cas"""

# operators: the run row first, then its tasks
LOCK_RUN = "SELECT status FROM runs WHERE id = %(run_id)s FOR UPDATE"
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
# order (two releases never wait on each other in a cycle), then their tasks.
LOCK_OWNER_RUNS = """SELECT id FROM runs WHERE id IN (
    SELECT run_id FROM tasks WHERE lease_owner = %(owner)s AND done_at IS NULL)
    ORDER BY id FOR UPDATE"""
RELEASE_OWNER = f"""{_CLOCK_CTE}
UPDATE tasks AS t SET lease_expires_at = clock.now FROM clock
    WHERE t.lease_owner = %(owner)s AND t.lease_expires_at > clock.now AND t.done_at IS NULL
    RETURNING t.id"""

# prune: finished runs older than the cutoff, a bounded batch per transaction (their tasks go
# with them, ON DELETE CASCADE); refused-write evidence older than the cutoff likewise
PRUNE_RUNS = f"""DELETE FROM runs WHERE id IN (
    SELECT id FROM runs WHERE finished_at < (SELECT {_CLOCK}) - %(age)s
    ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING id"""
PRUNE_REJECTIONS = f"""DELETE FROM fence_rejections WHERE id IN (
    SELECT id FROM fence_rejections WHERE at < (SELECT {_CLOCK}) - %(age)s
    ORDER BY at LIMIT %(limit)s) RETURNING id"""

# reads
_RUN_COLUMNS = """id, status, state, revision, result, failure_reason, last_error,
    created_at, updated_at, finished_at"""
GET_RUN = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %(run_id)s"
LIST_RUNS = f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id DESC LIMIT %(limit)s"
LIST_RUNS_BY_STATUS = f"""SELECT {_RUN_COLUMNS} FROM runs WHERE status = %(status)s
    ORDER BY id DESC LIMIT %(limit)s"""
_TASK_COLUMNS = """id, run_id, name, payload, available_at, created_at, lease_owner,
    lease_expires_at, attempts, attempt_base, last_error, done_at, claimed_at, done_attempt"""
GET_TASKS = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE run_id = %(run_id)s ORDER BY id"
GET_TASK = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE id = %(task_id)s"
LIST_REJECTIONS = """SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE id > %(after)s ORDER BY id LIMIT %(limit)s"""
# integrity (chaos verifier): a finished task committed by an attempt that was superseded
SUPERSEDED_COMMITS = """SELECT id, run_id, done_attempt, attempts FROM tasks
    WHERE done_at IS NOT NULL AND done_attempt IS NOT NULL AND done_attempt != attempts"""
# integrity: a run holding two live leases at once (R1 forbids it)
OVERLAPPING_LEASES = f"""SELECT run_id, count(*) FROM tasks
    WHERE lease_owner IS NOT NULL AND lease_expires_at > (SELECT {_CLOCK}) AND done_at IS NULL
    GROUP BY run_id HAVING count(*) > 1"""
RUN_COUNTS = "SELECT status, count(*) FROM runs GROUP BY status"
TASK_COUNTS = f"""SELECT
    count(*) FILTER (WHERE t.lease_owner IS NULL AND t.available_at <= c.now),
    count(*) FILTER (WHERE t.lease_owner IS NULL AND t.available_at > c.now),
    count(*) FILTER (WHERE t.lease_owner IS NOT NULL AND t.lease_expires_at > c.now),
    count(*) FILTER (WHERE t.lease_owner IS NOT NULL AND t.lease_expires_at <= c.now),
    min(c.now)
    FROM (SELECT {_CLOCK} AS now) AS c
    LEFT JOIN (tasks AS t JOIN runs AS r ON r.id = t.run_id AND r.status IN {ALIVE})
        ON t.done_at IS NULL"""
LIVE_LEASES = """SELECT lease_owner, id, run_id, name, attempts, lease_expires_at FROM tasks
    WHERE lease_owner IS NOT NULL AND done_at IS NULL ORDER BY lease_owner"""
NEXT_READY = "SELECT min(ready_at) FROM runs WHERE ready_at IS NOT NULL"
NOW_QUERY = f"SELECT {_CLOCK}"
