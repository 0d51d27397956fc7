"""SQL of what operators read (the dashboard) and of the attempt history, each named with its
purpose. Reads are plain SELECTs (a WAL reader never takes the write lock); every list is a
bounded index walk, so a page costs the same over a thousand runs or a million.
"""

from __future__ import annotations

from .sql import _RUN_COLUMNS

# runs_page: one keyset page. Each filter walks its own index newest first (no filter: the
# primary key; status: runs_status; task: runs_task; both: SQLite picks one of the two and
# checks the other column per row). The parameter is always bound: ``before`` defaults to the
# largest id, so there is one statement per (filter, direction).
_FILTERS = {
    (False, False): "",
    (True, False): "status = :status AND ",
    (False, True): "task = :task AND ",
    (True, True): "status = :status AND task = :task AND ",
}
RUNS_BEFORE = {
    key: f"SELECT {_RUN_COLUMNS} FROM runs WHERE {where}id < :before ORDER BY id DESC LIMIT :limit"
    for key, where in _FILTERS.items()
}
RUNS_AFTER = {  # the newer page, read upwards (the caller reverses it)
    key: f"SELECT {_RUN_COLUMNS} FROM runs WHERE {where}id > :after ORDER BY id ASC LIMIT :limit"
    for key, where in _FILTERS.items()
}

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

# -- writes on the unhappy paths only (never on claim -> commit) ---------------------------------
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
