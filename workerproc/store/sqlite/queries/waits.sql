-- SQLite's statements for runs that wait (docs/protocol.md B14): a wait is the run's
-- next task stored pending but not due (``available_at`` at its deadline), so the claim index
-- never walks it before then; the run row says what it waits for. A signal is kept in
-- ``signals`` until a wait of its name takes it: the signal's task is then due at once (the
-- head triggers put the run back in the claim index).

-- name: MARK_WAIT
-- the wait commit (after ADVANCE wrote the next task, not due before the deadline): the run
-- waits for ``:wait_for`` on that task (its newest) until then
UPDATE runs SET wait_for = :wait_for, wait_until = :now + :delay,
    wait_task = (SELECT max(id) FROM tasks WHERE run_id = :run_id AND done_at IS NULL)
    WHERE id = :run_id

-- name: INSERT_SIGNAL
-- a signal to a live run is kept (a finished or unknown run: nothing, and the caller is told)
INSERT INTO signals (run_id, name, payload, sent_at)
    SELECT :run_id, :name, :payload, :now WHERE EXISTS (
        SELECT 1 FROM runs WHERE id = :run_id AND status IN ('pending', 'running'))
    RETURNING id

-- name: WAITING_SIGNAL
-- the oldest kept signal of the name the run waits for now (its deadline ahead, or the wait
-- being committed: ``:fresh``, even with timeout 0; its task not claimed), and the task that
-- waits for it (``steps.deliver_signal`` then delivers it)
SELECT r.wait_task, s.id FROM runs AS r
    JOIN signals AS s ON s.run_id = r.id AND s.task_id IS NULL AND 'signal:' || s.name = r.wait_for
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.task_id = t.id)
    WHERE r.id = :run_id AND r.status IN ('pending', 'running') AND (r.wait_until > :now OR :fresh)
    ORDER BY s.id LIMIT 1

-- name: SIGNAL_TAKEN
-- The signal is taken by the task it resumes.
UPDATE signals SET task_id = :task_id WHERE id = :signal_id

-- name: SIGNAL_TASK_DUE
-- the waiting task is due now and knows its signal; the run waits no more
UPDATE tasks SET available_at = :now, signal_id = :signal_id
    WHERE id = :task_id

-- name: WAIT_OVER
-- The run waits no more.
UPDATE runs SET wait_for = NULL, wait_until = NULL, wait_task = NULL
    WHERE id = :run_id

-- name: GET_SIGNAL
-- the claim hands the handler the signal that resumed its task (``ctx.signal``)
SELECT name, payload, sent_at FROM signals WHERE id = :signal_id

-- name: RUN_SIGNALS
-- a run's signals, newest first (``show``)
SELECT id, name, payload, sent_at, task_id FROM signals WHERE run_id = :run_id
    ORDER BY id DESC LIMIT :limit

-- name: LINK_CHILD
-- the spawn commit (after ADVANCE wrote the join task, not due, and INSERT_RUNS the children):
-- each child knows its parent, the join task and its place; the parent how many it waits for
-- (``steps.link_children``: the children as a JSON array of ids)
UPDATE runs SET parent_id = :parent, parent_join = :join_task, spawn_ord = :ord
    WHERE id = :child

-- name: LINK_PARENT
-- The spawn commit: the parent waits for :n children at its join task (its wait's task).
UPDATE runs SET children_left = :n, join_task = wait_task WHERE id = :parent
    RETURNING wait_task

-- name: PARENT_OF
-- a run ended: its parent waits for one child less (``steps.child_ended``) ...
SELECT parent_id, parent_join FROM runs
    WHERE id = :run_id AND parent_id IS NOT NULL

-- name: CHILD_LEFT
-- A child ended: its parent waits for one child less (``steps.child_ended``; at zero its join is
-- due).
UPDATE runs SET children_left = children_left - 1
    WHERE id = :parent AND join_task = :join_task AND children_left > 0 AND status IN ('pending',
        'running')
    RETURNING children_left

-- name: JOIN_TASK_DUE
-- ... and the last one makes the join task due (the head triggers put the parent back in the
-- claim index); a spawn of no children, at once
UPDATE tasks SET available_at = :now WHERE id = :join_task
    AND done_at IS NULL

-- name: JOIN_DUE
-- The join task is due now: the last child's end, or a spawn of no children.
UPDATE tasks SET available_at = :now WHERE id = (
    SELECT join_task FROM runs WHERE id = :run_id) AND done_at IS NULL

-- name: CHILD_RETRIED
-- a failed or cancelled child retried while its parent still waits for it: one more to wait for
UPDATE runs SET children_left = children_left + 1
    WHERE id = (SELECT parent_id FROM runs WHERE id = :run_id)
      AND join_task = (SELECT parent_join FROM runs WHERE id = :run_id)
      AND wait_for = 'children' AND status IN ('pending', 'running')

-- name: CHILDREN_OF
-- the join's children, in spawn order (``ctx.children``)
SELECT id, status, result, last_error FROM runs
    WHERE parent_id = :run_id AND parent_join = :task_id ORDER BY spawn_ord

-- name: CANCEL_DESCENDANTS
-- a cancelled run's live descendants are cancelled with it
WITH RECURSIVE kin(id) AS (
        SELECT id FROM runs WHERE parent_id = :run_id
        UNION SELECT r.id FROM runs AS r JOIN kin ON r.parent_id = kin.id)
    UPDATE runs SET status = 'cancelled', finished_at = :now, updated_at = :now
    WHERE id IN (SELECT id FROM kin) AND status IN ('pending', 'running') RETURNING queue, id

-- name: RUN_CHILDREN
-- a run's children, oldest first, for the dashboard's tree (every spawn of the run)
SELECT id, status, task FROM runs WHERE parent_id = :run_id
    ORDER BY id LIMIT :limit
