"""The SQLite backend's reads: runs, tasks, the evidence, counts, the idle workers' cheap reads
and the dashboard's pages, each statement named with its purpose. Reads are plain SELECTs (a
WAL reader never takes the write lock); every list is a bounded index walk, so a page costs the
same over a thousand runs or a million.
"""

from __future__ import annotations

from .sql import _EVERY_QUEUE, _NAMED_QUEUES, ALIVE

# a live lease holds the run: ``running`` (the row says ``pending``: schema v9)
_HELD = """EXISTS (SELECT 1 FROM tasks AS l WHERE l.run_id = runs.id
        AND l.lease_owner IS NOT NULL AND l.lease_expires_at > :now AND l.done_at IS NULL)"""
# a pending run that no lease holds waits while its wait's deadline is ahead (B14)
_WAITING = "coalesce(wait_until > :now, 0)"
_RUN_COLUMNS = f"""id, CASE WHEN status = 'pending' AND {_HELD} THEN 'running'
        WHEN status = 'pending' AND {_WAITING} THEN 'waiting' ELSE status END,
    state, revision, result, failure_reason, last_error, created_at, updated_at, finished_at,
    queue, priority, key, task,
    CASE WHEN status = 'pending' AND {_WAITING} AND NOT {_HELD} THEN wait_for END, parent_id"""
GET_RUN = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = :run_id"
# a status filter: the stored status (``:stored``: running is stored as pending), and whether a
# live lease holds the run (``:held``: NULL when the status says nothing of it)
_STATUS = f"""status = :stored AND (:held IS NULL OR {_HELD} = :held)
    AND (:waiting IS NULL OR {_WAITING} = :waiting)"""
# newest first; a filter by status walks runs_status, by queue alone the rowid order; ids
# below :below (``SYSTEM_RUNS``: the users' runs only; above every id: the system's too, B20)
LIST_RUNS = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id < :below ORDER BY id DESC LIMIT :limit"
LIST_RUNS_BY_STATUS = f"""SELECT {_RUN_COLUMNS} FROM runs
    WHERE {_STATUS} AND (:queue IS NULL OR queue = :queue) AND id < :below
    ORDER BY id DESC LIMIT :limit"""
LIST_RUNS_BY_QUEUE = f"""SELECT {_RUN_COLUMNS} FROM runs WHERE queue = :queue AND id < :below
    ORDER BY id DESC LIMIT :limit"""
_TASK_COLUMNS = """id, run_id, name, payload, available_at, created_at, lease_owner,
    lease_expires_at, attempts, attempt_base, last_error, done_at, claimed_at, done_attempt,
    done_owner"""
GET_TASKS = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE run_id = :run_id ORDER BY id"
GET_TASK = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE id = :task_id"
LIST_REJECTIONS = """SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE id > :after ORDER BY id LIMIT :limit"""
# integrity (chaos verifier): a finished task committed by an attempt that was superseded
SUPERSEDED_COMMITS = """SELECT id, run_id, done_attempt, attempts FROM tasks
    WHERE done_at IS NOT NULL AND done_attempt IS NOT NULL AND done_attempt != attempts"""
# integrity: a run holding two live leases at once (R1 forbids it)
OVERLAPPING_LEASES = """SELECT run_id, count(*) FROM tasks
    WHERE lease_owner IS NOT NULL AND lease_expires_at > :now AND done_at IS NULL
    GROUP BY run_id HAVING count(*) > 1"""
# stats never read a finished run: the live runs by queue and status (runs_status), the
# finished ones from their totals
RUN_COUNTS = f"""SELECT queue, CASE WHEN {_HELD} THEN 'running'
        WHEN {_WAITING} THEN 'waiting' ELSE 'pending' END, count(*)
    FROM runs WHERE status IN {ALIVE} GROUP BY 1, 2"""
RUN_TOTALS = """SELECT queue, status, sum(n) FROM run_totals GROUP BY queue, status
    HAVING sum(n) <> 0"""
TASK_COUNTS = f"""SELECT r.queue,
    coalesce(sum(t.lease_owner IS NULL AND t.available_at <= :now), 0),
    coalesce(sum(t.lease_owner IS NULL AND t.available_at > :now), 0),
    coalesce(sum(t.lease_owner IS NOT NULL AND t.lease_expires_at > :now), 0),
    coalesce(sum(t.lease_owner IS NOT NULL AND t.lease_expires_at <= :now), 0)
    FROM tasks AS t JOIN runs AS r ON r.id = t.run_id
    WHERE t.done_at IS NULL AND r.status IN {ALIVE} GROUP BY r.queue"""
LIVE_LEASES = """SELECT lease_owner, id, run_id, name, attempts, lease_expires_at FROM tasks
    WHERE lease_owner IS NOT NULL AND done_at IS NULL ORDER BY lease_owner"""
# the worker processes of every host, each with whether it beat within three of its periods
LIST_WORKERS = """SELECT owner, host, pid, started_at, beat_every, slots, queues, version, state,
    heartbeat_at, heartbeat_at > :now - 3 * beat_every FROM workers
    ORDER BY host, started_at, pid"""
# idle workers: the earliest moment a claim could succeed in the queues they serve (one index
# seek per queue; never a scan of the pending runs)
# (and the first gate whose line may admit a run: gates are not kept per queue, so a worker
# may wake for a line of another queue once, and find nothing)
_NEXT_READY = """WITH RECURSIVE served(q) AS ({served})
    SELECT min(at) FROM (
        SELECT (SELECT min(ready_at) FROM runs WHERE queue = served.q AND ready_at IS NOT NULL)
            AS at FROM served WHERE q IS NOT NULL
        UNION ALL SELECT min(ready_at) FROM gates WHERE ready_at IS NOT NULL)"""
NEXT_READY = _NEXT_READY.format(served=_EVERY_QUEUE)
NEXT_READY_QUEUES = _NEXT_READY.format(served=_NAMED_QUEUES)

# runs_page: one keyset page. Each filter walks its own index newest first (no filter: the
# primary key; status: runs_status; task: runs_task; both: SQLite picks one of the two and
# checks the other column per row). The parameter is always bound: ``before`` defaults to the
# largest id, so there is one statement per filter and direction.
_BEFORE = f"""SELECT {_RUN_COLUMNS} FROM runs
    WHERE {{where}}id < :before ORDER BY id DESC LIMIT :limit"""
# the newer page, read upwards (the caller reverses it), below :below (as LIST_RUNS)
_AFTER = f"""SELECT {_RUN_COLUMNS} FROM runs
    WHERE {{where}}id > :after AND id < :below ORDER BY id ASC LIMIT :limit"""
_BY_STATUS, _BY_TASK = f"{_STATUS} AND ", "task = :task AND "
RUNS_BEFORE = _BEFORE.format(where="")
RUNS_BEFORE_STATUS = _BEFORE.format(where=_BY_STATUS)
RUNS_BEFORE_TASK = _BEFORE.format(where=_BY_TASK)
RUNS_BEFORE_STATUS_TASK = _BEFORE.format(where=_BY_STATUS + _BY_TASK)
RUNS_AFTER = _AFTER.format(where="")
RUNS_AFTER_STATUS = _AFTER.format(where=_BY_STATUS)
RUNS_AFTER_TASK = _AFTER.format(where=_BY_TASK)
RUNS_AFTER_STATUS_TASK = _AFTER.format(where=_BY_STATUS + _BY_TASK)

# task_names: the distinct first-task names by skipping through runs_task (one seek per name,
# never a scan of the runs).
TASK_NAMES = """WITH RECURSIVE names(name) AS (
        SELECT (SELECT min(task) FROM runs)
        UNION ALL
        SELECT (SELECT min(task) FROM runs WHERE task > names.name) FROM names
        WHERE names.name IS NOT NULL LIMIT :limit)
    SELECT name FROM names WHERE name IS NOT NULL"""

# the attempt history: attempts that ended without a commit
ATTEMPT_HISTORY = """SELECT task_id, attempt, owner, claimed_at, ended_at, outcome, error,
    taken_by FROM task_attempts WHERE run_id = :run_id ORDER BY task_id, attempt, id"""
RUN_REJECTIONS = """SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE task_id IN (SELECT id FROM tasks WHERE run_id = :run_id) ORDER BY id"""

# finished_since: runs finished per bucket among the newest runs (a primary-key walk from the
# end: bounded, no index on finished_at, so finishing a run writes no extra index entry).
FINISHED_SINCE = """SELECT CAST((finished_at - :since) / :bucket AS INTEGER) AS slot,
        coalesce(sum(status = 'succeeded'), 0), coalesce(sum(status = 'failed'), 0),
        coalesce(sum(status = 'cancelled'), 0)
    FROM (SELECT status, finished_at FROM runs ORDER BY id DESC LIMIT :newest)
    WHERE finished_at >= :since GROUP BY slot ORDER BY slot"""

# failed_since: the runs that failed since a moment (``--drain --fail-on-failed``), per queue:
# a walk of the failed runs (runs_status), few where it matters
FAILED_SINCE = """SELECT queue, count(*) FROM runs WHERE status = 'failed'
    AND finished_at >= :since GROUP BY queue ORDER BY queue"""

# per-task options (B11): every task that declares some (a few rows)
TASK_OPTIONS = "SELECT name, options FROM task_options ORDER BY name"
