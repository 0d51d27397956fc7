"""The PostgreSQL backend's reads: runs, tasks, the evidence, counts, the idle workers' cheap
reads, the dashboard's pages and the engine's storage check (amcheck), each statement named with
its purpose.

Every list is a bounded index walk, so a page costs the same over a thousand runs or a million.
JSON goes out as text and is decoded by the store (``codec.loads``).
"""

from __future__ import annotations

from .sql import _CLOCK, ALIVE

_RUN_COLUMNS = """id, status, state::text, revision, result::text, failure_reason, last_error,
    created_at, updated_at, finished_at, queue, priority, key, task"""
GET_RUN = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %(run_id)s"
# newest first; a filter by status walks runs_status, by queue alone the primary key
LIST_RUNS = f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id DESC LIMIT %(limit)s"
LIST_RUNS_BY_STATUS = f"""SELECT {_RUN_COLUMNS} FROM runs
    WHERE status = %(status)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    ORDER BY id DESC LIMIT %(limit)s"""
LIST_RUNS_BY_QUEUE = f"""SELECT {_RUN_COLUMNS} FROM runs WHERE queue = %(queue)s
    ORDER BY id DESC LIMIT %(limit)s"""
_TASK_COLUMNS = """id, run_id, name, payload::text, available_at, created_at, lease_owner,
    lease_expires_at, attempts, attempt_base, last_error, done_at, claimed_at, done_attempt,
    done_owner"""
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

# stats, in one snapshot: runs by queue and status, pending tasks by queue and state, leases
RUN_COUNTS = "SELECT queue, status, count(*) FROM runs GROUP BY queue, status"
TASK_COUNTS = f"""SELECT r.queue,
    count(*) FILTER (WHERE t.lease_owner IS NULL AND t.available_at <= c.now),
    count(*) FILTER (WHERE t.lease_owner IS NULL AND t.available_at > c.now),
    count(*) FILTER (WHERE t.lease_owner IS NOT NULL AND t.lease_expires_at > c.now),
    count(*) FILTER (WHERE t.lease_owner IS NOT NULL AND t.lease_expires_at <= c.now)
    FROM (SELECT {_CLOCK} AS now) AS c, tasks AS t JOIN runs AS r ON r.id = t.run_id
    WHERE t.done_at IS NULL AND r.status IN {ALIVE} GROUP BY r.queue"""
LIVE_LEASES = """SELECT lease_owner, id, run_id, name, attempts, lease_expires_at FROM tasks
    WHERE lease_owner IS NOT NULL AND done_at IS NULL ORDER BY lease_owner"""

# idle workers: the earliest moment a claim could succeed in the queues they serve: one index
# probe per queue (runs_ready leads with the queue), the queues with pending work found by a
# loose index scan when every queue is served
_NEXT_READY = """WITH RECURSIVE served(q) AS ({served})
    SELECT min((SELECT min(ready_at) FROM runs WHERE queue = served.q AND ready_at IS NOT NULL))
    FROM served WHERE q IS NOT NULL"""
_EVERY_QUEUE = """SELECT min(queue) FROM runs WHERE ready_at IS NOT NULL
    UNION ALL
    SELECT (SELECT min(queue) FROM runs WHERE ready_at IS NOT NULL AND queue > served.q)
    FROM served WHERE q IS NOT NULL"""
NEXT_READY = _NEXT_READY.format(served=_EVERY_QUEUE)
NEXT_READY_QUEUES = _NEXT_READY.format(served="SELECT unnest(%(queues)s::text[])")

# -- the dashboard ------------------------------------------------------------------------------
# runs_page: one keyset page; each filter walks its own index newest first (no filter: the
# primary key; status: runs_status; task: runs_task; both: one of the two). ``before`` is
# always bound (the largest id by default): one statement per (filter, direction).
_BEFORE = f"""SELECT {_RUN_COLUMNS} FROM runs WHERE {{where}}id < %(before)s
        ORDER BY id DESC LIMIT %(limit)s"""
# the newer page, read upwards (the caller reverses it)
_AFTER = f"""SELECT {_RUN_COLUMNS} FROM runs WHERE {{where}}id > %(after)s
        ORDER BY id ASC LIMIT %(limit)s"""
_STATUS, _TASK = "status = %(status)s AND ", "task = %(task)s AND "
RUNS_BEFORE = _BEFORE.format(where="")
RUNS_BEFORE_STATUS = _BEFORE.format(where=_STATUS)
RUNS_BEFORE_TASK = _BEFORE.format(where=_TASK)
RUNS_BEFORE_STATUS_TASK = _BEFORE.format(where=_STATUS + _TASK)
RUNS_AFTER = _AFTER.format(where="")
RUNS_AFTER_STATUS = _AFTER.format(where=_STATUS)
RUNS_AFTER_TASK = _AFTER.format(where=_TASK)
RUNS_AFTER_STATUS_TASK = _AFTER.format(where=_STATUS + _TASK)
# task_names: the distinct first-task names, skipping through runs_task (one probe per name)
TASK_NAMES = """WITH RECURSIVE names(name) AS (
        SELECT (SELECT min(task) FROM runs)
        UNION ALL
        SELECT (SELECT min(task) FROM runs WHERE task > names.name) FROM names
        WHERE names.name IS NOT NULL)
    SELECT name FROM names WHERE name IS NOT NULL LIMIT %(limit)s"""
# the attempt history: attempts that ended without a commit
ATTEMPT_HISTORY = """SELECT task_id, attempt, owner, claimed_at, ended_at, outcome, error,
    taken_by FROM task_attempts WHERE run_id = %(run_id)s ORDER BY task_id, attempt, id"""
RUN_REJECTIONS = """SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE task_id IN (SELECT id FROM tasks WHERE run_id = %(run_id)s) ORDER BY id"""
# finished_since: runs finished per bucket among the newest runs (a primary-key walk from the
# end: bounded, whatever the table's size)
FINISHED_SINCE = """SELECT floor((finished_at - %(since)s) / %(bucket)s)::bigint AS slot,
        count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed'),
        count(*) FILTER (WHERE status = 'cancelled')
    FROM (SELECT status, finished_at FROM runs ORDER BY id DESC LIMIT %(newest)s) AS newest
    WHERE finished_at >= %(since)s GROUP BY slot ORDER BY slot"""

# -- the engine's own check of its storage (amcheck) --------------------------------------------
AMCHECK = """SELECT n.nspname, e.extversion FROM pg_extension AS e
    JOIN pg_namespace AS n ON n.oid = e.extnamespace WHERE e.extname = 'amcheck'"""
OUR_INDEXES = """SELECT c.oid::regclass::text FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_am AS am ON am.oid = c.relam
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND am.amname = 'btree' ORDER BY c.relname"""
OUR_TABLES = """SELECT c.oid::regclass::text FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relkind = 'r' ORDER BY c.relname"""

# per-task options (B11): every task that declares some (a few rows)
TASK_OPTIONS = "SELECT name, options::text FROM task_options ORDER BY name"
