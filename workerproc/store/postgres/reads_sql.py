"""The PostgreSQL backend's reads: runs, tasks, the evidence, counts, the idle workers' cheap
reads, the dashboard's pages and the engine's storage check (amcheck), each statement named with
its purpose.

Every list is a bounded index walk, so a page costs the same over a thousand runs or a million.
JSON goes out as text and is decoded by the store (``codec.loads``).
"""

from __future__ import annotations

from .fragments import CLOCK
from .sql import _EVERY_LEVEL, _NAMED_LEVELS

# a live lease holds the run: ``running`` (the row says ``pending``: schema v3)
_HELD = f"""EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL
        AND l.expires_at > {CLOCK})"""
# a pending run that no lease holds waits while its wait's deadline is ahead (B14)
_WAITING = f"coalesce(r.wait_until > {CLOCK}, false)"
_RUN_COLUMNS = f"""r.id, CASE WHEN r.status = 'pending' AND {_HELD} THEN 'running'
        WHEN r.status = 'pending' AND {_WAITING} THEN 'waiting' ELSE r.status END,
    r.state::text, r.revision, r.result::text, r.failure_reason, r.last_error, r.created_at,
    r.updated_at, r.finished_at, r.queue, r.priority, r.key, r.task,
    CASE WHEN r.status = 'pending' AND {_WAITING} AND NOT {_HELD} THEN r.wait_for END,
    r.parent_id"""
GET_RUN = f"SELECT {_RUN_COLUMNS} FROM runs AS r WHERE r.id = %(run_id)s"
# a status filter: the stored status (``%(stored)s``: running is stored as pending), and
# whether a live lease holds the run (``%(held)s``: NULL when the status says nothing of it)
_STATUS = f"""r.status = %(stored)s AND (%(held)s::bool IS NULL OR {_HELD} = %(held)s)
    AND (%(waiting)s::bool IS NULL OR {_WAITING} = %(waiting)s)"""
# newest first; a filter by status walks runs_status (succeeded: the primary key), by queue
# alone the primary key; ids below %(below)s (``SYSTEM_RUNS``: the users' runs only; above
# every id: the system's too, B20)
LIST_RUNS = f"""SELECT {_RUN_COLUMNS} FROM runs AS r WHERE r.id < %(below)s
    ORDER BY r.id DESC LIMIT %(limit)s"""
LIST_RUNS_BY_STATUS = f"""SELECT {_RUN_COLUMNS} FROM runs AS r
    WHERE {_STATUS} AND (%(queue)s::text IS NULL OR r.queue = %(queue)s) AND r.id < %(below)s
    ORDER BY r.id DESC LIMIT %(limit)s"""
LIST_RUNS_BY_QUEUE = f"""SELECT {_RUN_COLUMNS} FROM runs AS r WHERE r.queue = %(queue)s
    AND r.id < %(below)s ORDER BY r.id DESC LIMIT %(limit)s"""
# a task's lease is its run's lease row, while that row names it (a free one: no holder);
# while it has one, its counts are the lease's
_TASK_COLUMNS = """t.id, t.run_id, t.name, t.payload::text, t.available_at, t.created_at,
    l.owner, CASE WHEN l.owner IS NOT NULL THEN l.expires_at END,
    coalesce(l.attempts, t.attempts), coalesce(l.attempt_base, t.attempt_base), t.last_error,
    t.done_at, coalesce(l.claimed_at, t.claimed_at), t.done_attempt, t.done_owner"""
_TASKS = """tasks AS t LEFT JOIN leases AS l ON l.run_id = t.run_id AND l.task_id = t.id"""
GET_TASKS = f"SELECT {_TASK_COLUMNS} FROM {_TASKS} WHERE t.run_id = %(run_id)s ORDER BY t.id"
GET_TASK = f"SELECT {_TASK_COLUMNS} FROM {_TASKS} WHERE t.id = %(task_id)s"
LIST_REJECTIONS = """SELECT id, at, task_id, run_id, owner, attempt, op FROM fence_rejections
    WHERE id > %(after)s ORDER BY id LIMIT %(limit)s"""

# integrity (chaos verifier): a finished task committed by an attempt that was superseded
SUPERSEDED_COMMITS = """SELECT id, run_id, done_attempt, attempts FROM tasks
    WHERE done_at IS NOT NULL AND done_attempt IS NOT NULL AND done_attempt != attempts"""
# integrity: a run holding two live leases at once (R1 forbids it; since v3 the lease table's
# primary key cannot hold two, and this finds what a broken claim could still leave: a live
# lease on a task that is done or belongs to another run)
OVERLAPPING_LEASES = f"""SELECT l.run_id, 2 FROM leases AS l
    LEFT JOIN tasks AS t ON t.id = l.task_id AND t.run_id = l.run_id AND t.done_at IS NULL
    WHERE l.owner IS NOT NULL AND l.expires_at > (SELECT {CLOCK}) AND t.id IS NULL"""

# stats, in one snapshot, never reading a finished run: the live runs by queue and status
# (runs_status), the finished ones from their totals, pending tasks by queue and state, leases
RUN_COUNTS = f"""SELECT r.queue, CASE WHEN {_HELD} THEN 'running'
        WHEN {_WAITING} THEN 'waiting' ELSE 'pending' END, count(*)
    FROM runs AS r WHERE r.status = 'pending' GROUP BY 1, 2"""
RUN_TOTALS = """SELECT queue, status, sum(n)::bigint FROM run_totals GROUP BY queue, status
    HAVING sum(n) <> 0"""
# (each live run's own tasks, looked up by the run: a nested loop by construction, so a plan
# made while the live runs were few never rescans them per task)
TASK_COUNTS = f"""SELECT r.queue, sum(x.ready)::bigint, sum(x.delayed)::bigint,
    sum(x.leased)::bigint, sum(x.expired)::bigint
    FROM (SELECT {CLOCK} AS now) AS c, runs AS r CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE l.owner IS NULL AND t.available_at <= c.now) AS ready,
            count(*) FILTER (WHERE l.owner IS NULL AND t.available_at > c.now) AS delayed,
            count(*) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at > c.now) AS leased,
            count(*) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at <= c.now) AS expired
        FROM {_TASKS} WHERE t.run_id = r.id AND t.done_at IS NULL) AS x
    WHERE r.status = 'pending' GROUP BY r.queue"""
LIVE_LEASES = """SELECT l.owner, l.task_id, l.run_id, t.name, l.attempts, l.expires_at
    FROM leases AS l JOIN tasks AS t ON t.id = l.task_id
    WHERE l.owner IS NOT NULL ORDER BY l.owner"""

# the worker processes of every host, each with whether it beat within three of its periods
LIST_WORKERS = f"""SELECT owner, host, pid, started_at, beat_every, slots, queues, version,
    state, heartbeat_at, heartbeat_at > {CLOCK} - 3 * beat_every FROM workers
    ORDER BY host, started_at, pid"""
# idle workers: the earliest moment a claim could succeed in the queues they serve: the first
# due run of each queue and priority level that no live lease holds (the claim index, walked
# past the few held runs at its front), or the end of the first live lease on a run of theirs
# (if its head is due by then), or the first gate whose line may admit a run (gates are not
# kept per queue: a worker may wake once for another queue's line). A past value only says
# "claimable now"
_NEXT_READY = f"""WITH RECURSIVE clock AS MATERIALIZED (SELECT {CLOCK} AS now),
{{levels}}
SELECT least(
    (SELECT min(x.head_at) FROM levels AS lv CROSS JOIN LATERAL (
        SELECT r.head_at FROM runs AS r
        WHERE {{queue}}r.priority = lv.p AND r.head_at IS NOT NULL AND r.status = 'pending'
          AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id
                          AND l.expires_at > (SELECT now FROM clock))
        ORDER BY r.head_at LIMIT 1) AS x WHERE lv.p IS NOT NULL),
    (SELECT min(greatest(r.head_at, l.expires_at)) FROM leases AS l JOIN runs AS r
     ON r.id = l.run_id
     WHERE l.expires_at > (SELECT now FROM clock) AND r.head_at IS NOT NULL{{served}}),
    (SELECT min(ready_at) FROM gates WHERE ready_at IS NOT NULL))"""
NEXT_READY = _NEXT_READY.format(levels=_EVERY_LEVEL, queue="", served="")
NEXT_READY_QUEUES = _NEXT_READY.format(
    levels=_NAMED_LEVELS, queue="r.queue = lv.q AND ",
    served=" AND r.queue = ANY(%(queues)s::text[])",
)  # fmt: skip

# -- the dashboard ------------------------------------------------------------------------------
# runs_page: one keyset page; each filter walks its own index newest first (no filter: the
# primary key; status: runs_status; task: runs_task; both: one of the two). ``before`` is
# always bound (the largest id by default): one statement per (filter, direction).
_BEFORE = f"""SELECT {_RUN_COLUMNS} FROM runs AS r WHERE {{where}}r.id < %(before)s
        ORDER BY r.id DESC LIMIT %(limit)s"""
# the newer page, read upwards (the caller reverses it), below %(below)s (as LIST_RUNS)
_AFTER = f"""SELECT {_RUN_COLUMNS} FROM runs AS r WHERE {{where}}r.id > %(after)s
        AND r.id < %(below)s ORDER BY r.id ASC LIMIT %(limit)s"""
_BY_TASK, _BY_STATUS = "r.task = %(task)s AND ", f"{_STATUS} AND "
RUNS_BEFORE = _BEFORE.format(where="")
RUNS_BEFORE_STATUS = _BEFORE.format(where=_BY_STATUS)
RUNS_BEFORE_TASK = _BEFORE.format(where=_BY_TASK)
RUNS_BEFORE_STATUS_TASK = _BEFORE.format(where=_BY_STATUS + _BY_TASK)
RUNS_AFTER = _AFTER.format(where="")
RUNS_AFTER_STATUS = _AFTER.format(where=_BY_STATUS)
RUNS_AFTER_TASK = _AFTER.format(where=_BY_TASK)
RUNS_AFTER_STATUS_TASK = _AFTER.format(where=_BY_STATUS + _BY_TASK)
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
# finished_since: runs finished per bucket since ``since``, at most the ``newest`` of them: a
# backward walk of runs_finished from now, so the chart costs what finished in its window,
# however long the history
FINISHED_SINCE = """SELECT floor((finished_at - %(since)s) / %(bucket)s)::bigint AS slot,
        count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed'),
        count(*) FILTER (WHERE status = 'cancelled')
    FROM (SELECT status, finished_at FROM runs WHERE finished_at >= %(since)s
          ORDER BY finished_at DESC LIMIT %(newest)s) AS newest
    GROUP BY slot ORDER BY slot"""

# failed_since: the runs that failed since a moment (``--drain --fail-on-failed``), per queue
FAILED_SINCE = """SELECT queue, count(*) FROM runs WHERE status = 'failed'
    AND finished_at >= %(since)s GROUP BY queue ORDER BY queue"""

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
