-- PostgreSQL's statements for runs that wait (docs/protocol.md B14): a wait is the
-- run's next task stored pending but not due (``available_at`` at its deadline, and so the run's
-- ``head_at``), so the claim never walks it before then; the run row says what it waits for. A
-- signal is kept in ``signals`` until a wait of its name takes it: its task is then due at once
-- and the run's head follows. Every statement that writes a run's wait or its signals locks the
-- run row first (the schema's lock order).

-- name: MARK_WAIT
-- the wait commit (after ADVANCE wrote the next task, not due before the deadline, under the
-- run's lock): the run waits for ``wait_for`` on that task (its newest) until then
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
    clock AS MATERIALIZED (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now FROM run)
UPDATE runs AS r SET wait_for = %(wait_for)s, wait_until = clock.now + %(delay)s,
    wait_task = (SELECT max(t.id) FROM tasks AS t WHERE t.run_id = r.id AND t.done_at IS NULL)
    FROM clock WHERE r.id = %(run_id)s RETURNING r.id

-- name: INSERT_SIGNAL
-- a signal to a live run is kept, the run locked first (a finished or unknown run: nothing,
-- and the caller is told)
WITH run AS MATERIALIZED (
    SELECT id FROM runs WHERE id = %(run_id)s AND status = 'pending' FOR UPDATE),
clock AS MATERIALIZED (SELECT
    coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now FROM run)
INSERT INTO signals (run_id, name, payload, sent_at)
    SELECT run.id, %(name)s, %(payload)s::json, clock.now FROM run, clock RETURNING id

-- name: DELIVER_SIGNAL
-- The oldest kept signal of the name the run waits for now (its deadline ahead, or the wait being
-- committed: ``fresh``, even with timeout 0; its task not done), delivered: the signal is taken,
-- its task is due now and knows it, the run waits no more, its head is that task (due now, unless
-- one comes before it), and idle workers are told.
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
    clock AS MATERIALIZED (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now FROM run),
found AS MATERIALIZED (
    SELECT r.wait_task AS task_id, s.id AS signal_id, t.created_at, t.line FROM runs AS r
    JOIN signals AS s ON s.run_id = r.id AND s.task_id IS NULL
        AND 'signal:' || s.name = r.wait_for
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL, clock
    WHERE r.id = %(run_id)s AND r.status = 'pending'
        AND (r.wait_until > clock.now OR %(fresh)s::boolean)
    ORDER BY s.id LIMIT 1),
taken AS (UPDATE signals AS s SET task_id = f.task_id FROM found AS f WHERE s.id = f.signal_id),
due AS (UPDATE tasks AS t SET available_at = clock.now, signal_id = f.signal_id
    FROM found AS f, clock WHERE t.id = f.task_id),
over AS (UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL, (head_at,
    line_at, head_created, head_id, line) = (
        SELECT CASE WHEN f.line IS NULL THEN f.a END, CASE WHEN f.line IS NOT NULL THEN f.a END,
            f.c, f.i, f.line
        FROM (SELECT h.available_at AS a, h.created_at AS c, h.id AS i, h.line AS line
              FROM tasks AS h WHERE h.run_id = r.id AND h.done_at IS NULL
                  AND h.id <> f.task_id UNION ALL SELECT clock.now, f.created_at, f.task_id,
                      f.line) AS f
        ORDER BY f.a, f.c, f.i LIMIT 1)
    FROM found AS f, clock WHERE r.id = %(run_id)s RETURNING r.id)
SELECT task_id, signal_id, (SELECT pg_notify('leasekeeper.' || current_schema(), '') FROM over)
    FROM found

-- name: GET_SIGNAL
-- the claim hands the handler the signal that resumed its task (``ctx.signal``)
SELECT name, payload::text, sent_at FROM signals WHERE id = %(signal_id)s

-- name: RUN_SIGNALS
-- a run's signals, newest first (``show``)
SELECT id, name, payload::text, sent_at, task_id FROM signals
    WHERE run_id = %(run_id)s ORDER BY id DESC LIMIT %(limit)s

-- name: LINK_CHILDREN
-- the spawn commit (after ADVANCE wrote the join task, not due, and INSERT_RUNS the children,
-- under the parent's lock): each child knows its parent, the join task and its place; the
-- parent how many it waits for
WITH parent AS MATERIALIZED (
    UPDATE runs SET children_left = cardinality(%(children)s::bigint[]), join_task = wait_task
    WHERE id = %(parent)s RETURNING wait_task)
UPDATE runs AS r SET parent_id = %(parent)s, parent_join = parent.wait_task,
    spawn_ord = c.ord - 1
    FROM parent, unnest(%(children)s::bigint[]) WITH ORDINALITY AS c(id, ord)
    WHERE r.id = c.id RETURNING r.id

-- name: CHILD_LEFT
-- a run ended: its parent (locked after the child: a cancel that locks the parent first and
-- then its children may meet it in a deadlock, which the dialect retries) waits for one child
-- less (``steps.child_ended``: the last one makes the join due, JOIN_DUE)
WITH child AS MATERIALIZED (
    SELECT parent_id, parent_join FROM runs WHERE id = %(run_id)s AND parent_id IS NOT NULL)
UPDATE runs AS r SET children_left = r.children_left - 1 FROM child
    WHERE r.id = child.parent_id AND r.join_task = child.parent_join AND r.children_left > 0
      AND r.status = 'pending' RETURNING r.id, r.children_left

-- name: JOIN_DUE
-- the join task due now (its wait over, its head with it): the last child's end, or a spawn of
-- no children
WITH run AS MATERIALIZED (SELECT id FROM runs WHERE id = %(run_id)s FOR UPDATE),
    clock AS MATERIALIZED (SELECT
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now FROM run),
due AS MATERIALIZED (
    UPDATE tasks AS t SET available_at = clock.now FROM runs AS r, clock
    WHERE r.id = %(run_id)s AND t.id = r.join_task AND t.done_at IS NULL
    RETURNING t.id, t.created_at, t.line)
UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL,
    children_left = 0, (head_at, line_at, head_created, head_id, line) = (
        SELECT CASE WHEN f.line IS NULL THEN f.a END, CASE WHEN f.line IS NOT NULL THEN f.a END,
            f.c, f.i, f.line
        FROM (SELECT h.available_at AS a, h.created_at AS c, h.id AS i, h.line AS line
              FROM tasks AS h WHERE h.run_id = r.id AND h.done_at IS NULL
                  AND h.id <> d.id UNION ALL SELECT clock.now, d.created_at, d.id, d.line) AS f
        ORDER BY f.a, f.c, f.i LIMIT 1)
    FROM due AS d, clock WHERE r.id = %(run_id)s RETURNING r.id,
        pg_notify('leasekeeper.' || current_schema(), '')

-- name: CHILD_RETRIED
-- a failed or cancelled child retried while its parent still waits for it: one more to wait for
WITH child AS MATERIALIZED (
    SELECT parent_id, parent_join FROM runs WHERE id = %(run_id)s AND parent_id IS NOT NULL)
UPDATE runs AS r SET children_left = r.children_left + 1 FROM child
    WHERE r.id = child.parent_id AND r.join_task = child.parent_join
      AND r.wait_for = 'children' AND r.status = 'pending' RETURNING r.id

-- name: CHILDREN_OF
-- the join's children, in spawn order (``ctx.children``)
SELECT id, status, result::text, last_error FROM runs
    WHERE parent_id = %(run_id)s AND parent_join = %(task_id)s ORDER BY spawn_ord

-- name: CANCEL_DESCENDANTS
-- a cancelled run's live descendants are cancelled with it, locked in id order
WITH RECURSIVE kin(id) AS (
        SELECT id FROM runs WHERE parent_id = %(run_id)s
        UNION SELECT r.id FROM runs AS r JOIN kin ON r.parent_id = kin.id),
locked AS MATERIALIZED (
    SELECT r.id FROM runs AS r WHERE r.id IN (SELECT id FROM kin) AND r.status = 'pending'
    ORDER BY r.id FOR UPDATE),
clock AS MATERIALIZED (SELECT
    coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now
        FROM (SELECT count(*) FROM locked) AS n)
UPDATE runs AS r SET status = 'cancelled', finished_at = clock.now, updated_at = clock.now,
    head_at = NULL, head_created = NULL, head_id = NULL, line_at = NULL, line = NULL FROM locked,
        clock WHERE r.id = locked.id AND r.status = 'pending'
    RETURNING r.queue, r.id

-- name: RUN_CHILDREN
-- a run's children, oldest first, for the dashboard's tree (every spawn of the run)
SELECT id, status, task FROM runs WHERE parent_id = %(run_id)s
    ORDER BY id LIMIT %(limit)s
