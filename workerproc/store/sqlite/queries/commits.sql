-- SQLite's fenced commits (docs/protocol.md R2, R5): each matches the run's lease (its row of
-- ``leases``) by task id AND owner AND attempt AND a live expiry; zero rows changed means the
-- caller's lease is lost. ``:now`` is
-- always read after ``BEGIN IMMEDIATE`` succeeded. Also the owner's release by the supervisor
-- and the attempt history, written on the unhappy paths only (never on claim -> commit).

-- name: CHECK_FENCE
-- every fenced commit first asks: is this lease still the live one?
SELECT run_id FROM leases WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now

-- name: SET_VERSION
-- migrate (B25): the claimed task moves to the version its run's state was migrated to, in the
-- transaction whose fenced compare-and-set (CAS_STATE) wrote that state: written only once the
-- fence held. What the step was entered with (B24) becomes the migrated state, so that a fork
-- from this step gets a state and a version that go together.
UPDATE tasks SET version = :version,
        input_state = CASE WHEN input_state IS NULL THEN NULL ELSE :state END
    WHERE id = :task_id AND run_id = :run_id

-- name: TASK_DONE
-- ack / drop / advance / finish: the task is done (who held it stays); its lease goes with it
-- (the trigger tasks_done_lease).
UPDATE tasks SET done_at = :now, done_attempt = :attempt, done_owner = :owner
    WHERE id = :task_id AND done_at IS NULL AND EXISTS (SELECT 1 FROM leases
        WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now)

-- name: INSERT_REJECTION
-- every refused fenced write is kept: evidence that a zombie tried and was turned away
INSERT INTO fence_rejections (at, task_id, run_id, owner, attempt, op)
    VALUES (:now, :task_id, :run_id, :owner, :attempt, :op)

-- name: SUCCEED_IF_EMPTY
-- ack: a run whose last task is acknowledged has succeeded.
UPDATE runs SET status = 'succeeded', finished_at = :now, updated_at = :now
    WHERE id = :run_id AND status IN ('pending', 'running')
      AND NOT EXISTS (SELECT 1 FROM tasks WHERE run_id = :run_id AND done_at IS NULL)

-- name: HANDBACK_TASK
-- handback: a claimed task that never started goes back at once, and its claim does not count
-- against max_attempts (attempt_base moves with attempts); the fencing token still moved on.
-- (``steps.handback``: then LEASE_GIVEN_BACK)
UPDATE tasks SET attempt_base = attempt_base + 1
    WHERE id = :task_id AND done_at IS NULL AND EXISTS (SELECT 1 FROM leases
        WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now)

-- name: RELEASE_TASK
-- release: give the task back after a delay, keeping the error (``steps.release`` first checks
-- the fence and keeps the attempt's end in the history, ATTEMPT_ENDED; then LEASE_GIVEN_BACK).
UPDATE tasks SET available_at = :now + :delay, last_error = coalesce(:error, last_error)
    WHERE id = :task_id AND done_at IS NULL AND EXISTS (SELECT 1 FROM leases
        WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now)

-- name: LEASE_GIVEN_BACK
-- release / hand-back / failure: the lease goes (the fence was checked by the statement before)
DELETE FROM leases WHERE run_id = :run_id AND task_id = :task_id

-- name: RUN_ERROR
-- release: the error goes onto a live run only: a run that is over (cancelled under its holder,
-- B15) is never written again.
UPDATE runs SET last_error = :error, updated_at = :now
    WHERE id = :run_id AND status IN ('pending', 'running')

-- name: TASK_FAILED
-- fail (fenced): the holder fails its run; the task keeps its place for retry_run
-- (``steps.task_failed``: then LEASE_GIVEN_BACK).
UPDATE tasks SET last_error = coalesce(:error, last_error)
    WHERE id = :task_id AND done_at IS NULL AND EXISTS (SELECT 1 FROM leases
        WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now)

-- name: CAS_STATE
-- compare_and_set (R5): the state moves only at the expected revision of a live run.
-- The fence rides along (EXISTS): one statement on the happy path; only when it changes nothing
-- does CHECK_FENCE tell a lost lease from a conflict.
UPDATE runs SET state = :state, revision = revision + 1, updated_at = :now
    WHERE id = :run_id AND revision = :revision AND status IN ('pending', 'running')
      AND EXISTS (SELECT 1 FROM leases WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now)

-- name: CAS_FINISH
-- finish (R5): as CAS_STATE, and the run succeeds with its result. A finished run leaves the
-- claim indexes at once: its claim columns are cleared here, so the status trigger has nothing to
-- recompute.
UPDATE runs SET state = :state, revision = revision + 1, status = 'succeeded',
    result = :result, finished_at = :now, updated_at = :now,
    head_at = NULL, head_created = NULL, head_id = NULL, ready_at = NULL, line_at = NULL,
    line = NULL
    WHERE id = :run_id AND revision = :revision AND status IN ('pending', 'running')
      AND EXISTS (SELECT 1 FROM leases WHERE run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now)

-- name: CAS_NEXT_TASK
-- advance: the run's next task, due after :delay (as INSERT_TASK: its id one past the largest
-- ever given, its gates and line if it has limits; :version its version, B25). It keeps what
-- the step is entered with (B24): the state this advance writes, and the run's queue (MOVE_RUN
-- went first).
INSERT INTO tasks (id, run_id, name, payload, available_at, created_at, line,
        gate_a, gate_b, gate_c, tokens, input_state, input_queue, version)
    VALUES (max(coalesce((SELECT max(id) FROM tasks), 0), (SELECT task_high FROM run_ids)) + 1,
            :run_id, :name, :payload, :now + :delay, :now, :line, :gate_a, :gate_b, :gate_c,
            :tokens, :state, (SELECT queue FROM runs WHERE id = :run_id), :version)

-- name: MOVE_RUN
-- advance to another queue: the run (and so its next task) moves there
UPDATE runs SET queue = :queue WHERE id = :run_id

-- name: EXPIRE_OWNER
-- release_owner: the supervisor reaped this owner; its leases expire now, and the gates whose
-- slots they held may admit again (``steps.release_owner``)
UPDATE leases SET expires_at = :now WHERE owner = :owner AND expires_at > :now

-- name: REOPEN_OWNER_GATES
-- release_owner: the gates whose slots the reaped owner's leases held may admit again, and so may
-- the lines they kept closed (a task's other limits' lines); each line goes back to its place in
-- the lines' round robin (turn): never behind lines served since it closed, and lines reopened
-- together keep their order.
WITH g(gate) AS (
        SELECT gate_a FROM leases WHERE owner = :owner
        UNION SELECT gate_b FROM leases WHERE owner = :owner
        UNION SELECT gate_c FROM leases WHERE owner = :owner)
    UPDATE gates SET ready_at = min(coalesce(ready_at, :now), coalesce(turn, :now), :now),
        blocked_by = CASE WHEN gate IN (SELECT gate FROM g) THEN blocked_by END
    WHERE gate IN (SELECT gate FROM g) OR blocked_by IN (SELECT gate FROM g)

-- name: ATTEMPT_ENDED
-- the attempt history, written on the unhappy paths only (never on claim -> commit): a release, a
-- failure or an exhausted claim ends the task's current attempt without a commit; read from the
-- row before the statement that clears its lease (the fence was checked already).
INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at,
        ended_at, outcome, error)
    SELECT run_id, task_id, attempts, owner, claimed_at, :now, :outcome, :error FROM leases
    WHERE run_id = :run_id AND task_id = :task_id AND owner IS NOT NULL

-- name: ATTEMPTS_DROPPED_BY_RETRY
-- the attempt history: retry_run drops the leases still held on the run's pending tasks (a
-- cancelled run's holder); each one's attempt ends, released.
INSERT INTO task_attempts (run_id, task_id, attempt, owner,
        claimed_at, ended_at, outcome, error)
    SELECT run_id, task_id, attempts, owner, claimed_at, :now, 'released',
        'the run was retried: this lease was dropped' FROM leases
    WHERE run_id = :run_id AND owner IS NOT NULL
