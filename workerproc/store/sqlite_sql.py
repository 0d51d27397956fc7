"""Every SQL statement of the SQLite backend, each named with its one-line purpose.

Fenced statements match task id AND owner AND attempt AND a live lease (R2); zero rows changed
means the caller's lease is lost. ``:now`` is always read after ``BEGIN IMMEDIATE`` succeeded.
"""

from __future__ import annotations

import os

ALIVE = "('pending', 'running')"

# The fence every write after a claim carries (R2, R5).
_FENCE = """id = :task_id AND lease_owner = :owner AND attempts = :attempt
    AND lease_expires_at > :now AND done_at IS NULL"""

# TEST ONLY: chaos mode's verifier must be able to fail, so its test turns fencing off and
# expects a violation. Never set this anywhere else: every zombie write would be accepted.
UNSAFE_NO_FENCING = os.environ.get("LEASEKEEPER_UNSAFE_DISABLE_FENCING_FOR_TESTS") == "1"
if UNSAFE_NO_FENCING:
    _FENCE = "id = :task_id AND done_at IS NULL"

# start_run: a new run and its first task.
INSERT_RUN = """INSERT INTO runs (state, created_at, updated_at) VALUES (:state, :now, :now)"""
INSERT_TASK = """INSERT INTO tasks (run_id, name, payload, available_at, created_at)
    VALUES (:run_id, :name, :payload, :now + :delay, :now)"""

# claim (R1): one statement picks the first task in (available_at, created_at, id) order whose
# run is alive and holds no live lease, writes owner and expiry, and counts the attempt. The
# runs' head columns (kept by triggers) make the pick an index walk that skips only runs with a
# live lease (at most one per busy worker); a takeover keeps its place by available_at.
CLAIM = f"""
UPDATE tasks SET prev_owner = lease_owner, lease_owner = :owner, lease_expires_at = :now + :ttl,
    attempts = attempts + 1, claimed_at = :now
WHERE id = (
    SELECT (SELECT t.id FROM tasks AS t
            WHERE t.run_id = r.id AND t.done_at IS NULL AND t.available_at <= :now
              AND (t.lease_owner IS NULL OR t.lease_expires_at <= :now)
            ORDER BY t.available_at, t.created_at, t.id LIMIT 1)
    FROM runs AS r
    WHERE r.head_at <= :now AND +r.status IN {ALIVE}
      AND NOT EXISTS (SELECT 1 FROM tasks AS a
                      WHERE a.run_id = r.id AND a.lease_owner IS NOT NULL
                        AND a.lease_expires_at > :now)
    ORDER BY r.head_at, r.head_created, r.head_id
    LIMIT 1)
RETURNING id, run_id, name, payload, attempts, attempt_base, lease_expires_at,
    prev_owner IS NOT NULL
"""

# claim: hand the run's state to the handler (the claim's trigger marked the run running).
RUN_STATE = "SELECT state, revision FROM runs WHERE id = :run_id"  # the trigger marked it running

# claim (R6): a claim past max_attempts hands nothing out: drop the lease, fail the run.
DROP_EXHAUSTED_LEASE = """UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = :task_id RETURNING last_error"""
FAIL_RUN = f"""UPDATE runs SET status = 'failed', failure_reason = :reason,
    last_error = coalesce(:error, last_error), finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN {ALIVE}"""

# renew (R3): never an expired lease; the new expiry is max(old, now + ttl).
RENEW = f"""UPDATE tasks SET lease_expires_at = max(lease_expires_at, :now + :ttl)
    WHERE {_FENCE} RETURNING lease_expires_at"""

# every fenced commit first asks: is this lease still the live one?
CHECK_FENCE = f"SELECT run_id FROM tasks WHERE {_FENCE}"

# ack / drop / advance / finish: the task is done; its lease is cleared.
TASK_DONE = f"""UPDATE tasks SET done_at = :now, done_attempt = :attempt, lease_owner = NULL,
    lease_expires_at = NULL WHERE {_FENCE}"""

# every refused fenced write is kept: evidence that a zombie tried and was turned away
INSERT_REJECTION = """INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    VALUES (:now, :task_id, :run_id, :owner, :attempt, :op)"""

# ack: a run whose last task is acknowledged has succeeded.
SUCCEED_IF_EMPTY = f"""UPDATE runs SET status = 'succeeded', finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN {ALIVE}
      AND NOT EXISTS (SELECT 1 FROM tasks WHERE run_id = :run_id AND done_at IS NULL)"""

# release: give the task back after a delay, keeping the error.
RELEASE = f"""UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,
    available_at = :now + :delay, last_error = coalesce(:error, last_error)
    WHERE {_FENCE}"""
RUN_ERROR = "UPDATE runs SET last_error = :error, updated_at = :now WHERE id = :run_id"

# fail (fenced): the holder fails its run; the task keeps its place for retry_run.
TASK_FAILED = f"""UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,
    last_error = coalesce(:error, last_error) WHERE {_FENCE}"""

# compare_and_set (R5): the state moves only at the expected revision of a live run.
# The fence rides along (EXISTS): one statement on the happy path; only when it changes nothing
# does CHECK_FENCE tell a lost lease from a conflict.
CAS_STATE = f"""UPDATE runs SET state = :state, revision = revision + 1, updated_at = :now
    WHERE id = :run_id AND revision = :revision AND status IN {ALIVE}
      AND EXISTS (SELECT 1 FROM tasks WHERE {_FENCE} AND run_id = :run_id)"""
CAS_FINISH = f"""UPDATE runs SET state = :state, revision = revision + 1, status = 'succeeded',
    result = :result, finished_at = :now, updated_at = :now
    WHERE id = :run_id AND revision = :revision AND status IN {ALIVE}
      AND EXISTS (SELECT 1 FROM tasks WHERE {_FENCE} AND run_id = :run_id)"""
CAS_NEXT_TASK = """INSERT INTO tasks (run_id, name, payload, available_at, created_at)
    VALUES (:run_id, :name, :payload, :now + :delay, :now)"""

# operators
CANCEL_RUN = f"""UPDATE runs SET status = 'cancelled', finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN {ALIVE}"""
RUN_STATUS = "SELECT status FROM runs WHERE id = :run_id"
PENDING_TASKS = "SELECT count(*) FROM tasks WHERE run_id = :run_id AND done_at IS NULL"
# retry_run: a new attempt generation. attempts keeps counting (the fencing token never
# repeats); attempt_base restarts what max_attempts bounds; old leases are dropped.
RETRY_TASKS = """UPDATE tasks SET attempt_base = attempts, available_at = :now,
    lease_owner = NULL, lease_expires_at = NULL WHERE run_id = :run_id AND done_at IS NULL"""
RETRY_RUN = """UPDATE runs SET status = 'pending', failure_reason = NULL, finished_at = NULL,
    updated_at = :now WHERE id = :run_id"""
# release_owner: the supervisor reaped this owner; its leases expire now.
RELEASE_OWNER = """UPDATE tasks SET lease_expires_at = :now
    WHERE lease_owner = :owner AND lease_expires_at > :now AND done_at IS NULL"""

# prune: finished runs older than the cutoff, a bounded batch per transaction (their tasks go
# with them, ON DELETE CASCADE); refused-write evidence older than the cutoff likewise
PRUNE_RUNS = """DELETE FROM runs WHERE id IN (
    SELECT id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < :now - :age LIMIT :limit)"""
PRUNE_REJECTIONS = """DELETE FROM fence_rejections WHERE id IN (
    SELECT id FROM fence_rejections WHERE at < :now - :age ORDER BY id LIMIT :limit)"""

# reads
_RUN_COLUMNS = """id, status, state, revision, result, failure_reason, last_error,
    created_at, updated_at, finished_at"""
GET_RUN = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = :run_id"
LIST_RUNS = f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id DESC LIMIT :limit"
LIST_RUNS_BY_STATUS = f"""SELECT {_RUN_COLUMNS} FROM runs WHERE status = :status
    ORDER BY id DESC LIMIT :limit"""
_TASK_COLUMNS = """id, run_id, name, payload, available_at, created_at, lease_owner,
    lease_expires_at, attempts, attempt_base, last_error, done_at, claimed_at, done_attempt"""
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
RUN_COUNTS = "SELECT status, count(*) FROM runs GROUP BY status"
TASK_COUNTS = f"""SELECT
    coalesce(sum(t.lease_owner IS NULL AND t.available_at <= :now), 0),
    coalesce(sum(t.lease_owner IS NULL AND t.available_at > :now), 0),
    coalesce(sum(t.lease_owner IS NOT NULL AND t.lease_expires_at > :now), 0),
    coalesce(sum(t.lease_owner IS NOT NULL AND t.lease_expires_at <= :now), 0)
    FROM tasks AS t JOIN runs AS r ON r.id = t.run_id
    WHERE t.done_at IS NULL AND r.status IN {ALIVE}"""
LIVE_LEASES = """SELECT lease_owner, id, run_id, name, attempts, lease_expires_at FROM tasks
    WHERE lease_owner IS NOT NULL AND done_at IS NULL ORDER BY lease_owner"""
NEXT_READY = "SELECT min(ready_at) FROM runs WHERE ready_at IS NOT NULL"
