"""PostgreSQL's statements for runs that wait (docs/protocol.md B14): a wait is the
run's next task stored pending but not due (``available_at`` at its deadline, and so the run's
``head_at``), so the claim never walks it before then; the run row says what it waits for. A
signal is kept in ``signals`` until a wait of its name takes it: its task is then due at once
and the run's head follows. Every statement that writes a run's wait or its signals locks the
run row first (the schema's lock order)."""

from __future__ import annotations

from .fragments import CLOCK, NO_HEAD
from .sql import _LOCKED, NOTIFY, head_of

# migration 7: what a run waits for, until when, on which task; the signals; which signal a
# task was resumed by; a child run's parent, the parent's join task and its place in the spawn;
# how many children a parent still waits for
MIGRATION_WAITS = """
    ALTER TABLE runs ADD COLUMN wait_for text;
    ALTER TABLE runs ADD COLUMN wait_until double precision;
    ALTER TABLE runs ADD COLUMN wait_task bigint;
    ALTER TABLE tasks ADD COLUMN signal_id bigint;
    CREATE TABLE signals (
        id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id  bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name    text   NOT NULL,
        payload json   NOT NULL DEFAULT 'null',
        sent_at double precision NOT NULL,
        task_id bigint
    );
    CREATE INDEX signals_kept ON signals (run_id, name, id) WHERE task_id IS NULL;
    CREATE INDEX signals_run ON signals (run_id);
    ALTER TABLE runs ADD COLUMN parent_id bigint;
    ALTER TABLE runs ADD COLUMN join_task bigint;
    ALTER TABLE runs ADD COLUMN spawn_ord bigint;
    ALTER TABLE runs ADD COLUMN children_left bigint;
    CREATE INDEX runs_parent ON runs (parent_id, join_task, spawn_ord)
        WHERE parent_id IS NOT NULL;
"""

# the wait commit (after ADVANCE wrote the next task, not due before the deadline, under the
# run's lock): the run waits for ``wait_for`` on that task (its newest) until then
MARK_WAIT = f"""{_LOCKED}
UPDATE runs AS r SET wait_for = %(wait_for)s, wait_until = clock.now + %(delay)s,
    wait_task = (SELECT max(t.id) FROM tasks AS t WHERE t.run_id = r.id AND t.done_at IS NULL)
    FROM clock WHERE r.id = %(run_id)s RETURNING r.id"""

# a signal to a live run is kept, the run locked first (a finished or unknown run: nothing,
# and the caller is told)
INSERT_SIGNAL = f"""WITH run AS MATERIALIZED (
    SELECT id FROM runs WHERE id = %(run_id)s AND status = 'pending' FOR UPDATE),
clock AS MATERIALIZED (SELECT {CLOCK} AS now FROM run)
INSERT INTO signals (run_id, name, payload, sent_at)
    SELECT run.id, %(name)s, %(payload)s::json, clock.now FROM run, clock RETURNING id"""

# the oldest kept signal of the name the run waits for now (its deadline ahead, or the wait
# being committed: ``fresh``, even with timeout 0; its task not done), delivered: the signal
# is taken, its task is due now and knows it, the run waits no more, its head is that task
# (due now, unless one comes before it), and idle workers are told
DUE_HEAD = head_of("r.id", without="f.task_id", extra="clock.now, f.created_at, f.task_id, f.line")
DELIVER_SIGNAL = f"""{_LOCKED},
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
over AS (UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL, {DUE_HEAD}
    FROM found AS f, clock WHERE r.id = %(run_id)s RETURNING r.id)
SELECT task_id, signal_id, (SELECT {NOTIFY} FROM over) FROM found"""

# the claim hands the handler the signal that resumed its task (``ctx.signal``)
GET_SIGNAL = "SELECT name, payload::text, sent_at FROM signals WHERE id = %(signal_id)s"
# a run's signals, newest first (``show``)
RUN_SIGNALS = """SELECT id, name, payload::text, sent_at, task_id FROM signals
    WHERE run_id = %(run_id)s ORDER BY id DESC LIMIT %(limit)s"""

# migration 14: a child's place in its parent's join has a column of its own,
# ``parent_join``; ``join_task`` is only a run's own join. One column for both lost a child's
# parent as soon as the child spawned children of its own: its end never reached that join.
# Children linked before keep what can be recovered: their own column's value, or (a child
# that spawned since) its parent's join.
MIGRATION_PARENT_JOIN = """
    ALTER TABLE runs ADD COLUMN parent_join bigint;
    UPDATE runs SET parent_join = join_task WHERE parent_id IS NOT NULL;
    UPDATE runs SET join_task = NULL WHERE parent_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM tasks WHERE tasks.id = runs.join_task AND tasks.run_id = runs.id);
    UPDATE runs SET parent_join = (SELECT p.join_task FROM runs AS p WHERE p.id = runs.parent_id)
        WHERE parent_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM tasks WHERE tasks.id = runs.parent_join AND tasks.run_id = runs.id);
    DROP INDEX runs_parent;
    CREATE INDEX runs_parent ON runs (parent_id, parent_join, spawn_ord)
        WHERE parent_id IS NOT NULL;
"""

# -- child runs (B14) -------------------------------------------------------------------------
# the spawn commit (after ADVANCE wrote the join task, not due, and INSERT_RUNS the children,
# under the parent's lock): each child knows its parent, the join task and its place; the
# parent how many it waits for
LINK_CHILDREN = """WITH parent AS MATERIALIZED (
    UPDATE runs SET children_left = cardinality(%(children)s::bigint[]), join_task = wait_task
    WHERE id = %(parent)s RETURNING wait_task)
UPDATE runs AS r SET parent_id = %(parent)s, parent_join = parent.wait_task,
    spawn_ord = c.ord - 1
    FROM parent, unnest(%(children)s::bigint[]) WITH ORDINALITY AS c(id, ord)
    WHERE r.id = c.id RETURNING r.id"""
# a run ended: its parent (locked after the child: a cancel that locks the parent first and
# then its children may meet it in a deadlock, which the dialect retries) waits for one child
# less (``steps.child_ended``: the last one makes the join due, JOIN_DUE)
CHILD_LEFT = """WITH child AS MATERIALIZED (
    SELECT parent_id, parent_join FROM runs WHERE id = %(run_id)s AND parent_id IS NOT NULL)
UPDATE runs AS r SET children_left = r.children_left - 1 FROM child
    WHERE r.id = child.parent_id AND r.join_task = child.parent_join AND r.children_left > 0
      AND r.status = 'pending' RETURNING r.id, r.children_left"""
_JOIN_HEAD = head_of("r.id", without="d.id", extra="clock.now, d.created_at, d.id, d.line")
# the join task due now (its wait over, its head with it): the last child's end, or a spawn of
# no children
JOIN_DUE = f"""{_LOCKED},
due AS MATERIALIZED (
    UPDATE tasks AS t SET available_at = clock.now FROM runs AS r, clock
    WHERE r.id = %(run_id)s AND t.id = r.join_task AND t.done_at IS NULL
    RETURNING t.id, t.created_at, t.line)
UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL,
    children_left = 0, {_JOIN_HEAD}
    FROM due AS d, clock WHERE r.id = %(run_id)s RETURNING r.id, {NOTIFY}"""
# a failed or cancelled child retried while its parent still waits for it: one more to wait for
CHILD_RETRIED = """WITH child AS MATERIALIZED (
    SELECT parent_id, parent_join FROM runs WHERE id = %(run_id)s AND parent_id IS NOT NULL)
UPDATE runs AS r SET children_left = r.children_left + 1 FROM child
    WHERE r.id = child.parent_id AND r.join_task = child.parent_join
      AND r.wait_for = 'children' AND r.status = 'pending' RETURNING r.id"""
# the join's children, in spawn order (``ctx.children``)
CHILDREN_OF = """SELECT id, status, result::text, last_error FROM runs
    WHERE parent_id = %(run_id)s AND parent_join = %(task_id)s ORDER BY spawn_ord"""
# a cancelled run's live descendants are cancelled with it, locked in id order
CANCEL_DESCENDANTS = f"""WITH RECURSIVE kin(id) AS (
        SELECT id FROM runs WHERE parent_id = %(run_id)s
        UNION SELECT r.id FROM runs AS r JOIN kin ON r.parent_id = kin.id),
locked AS MATERIALIZED (
    SELECT r.id FROM runs AS r WHERE r.id IN (SELECT id FROM kin) AND r.status = 'pending'
    ORDER BY r.id FOR UPDATE),
clock AS MATERIALIZED (SELECT {CLOCK} AS now FROM (SELECT count(*) FROM locked) AS n)
UPDATE runs AS r SET status = 'cancelled', finished_at = clock.now, updated_at = clock.now,
    {NO_HEAD} FROM locked, clock WHERE r.id = locked.id AND r.status = 'pending'
    RETURNING r.queue, r.id"""
# a run's children, oldest first, for the dashboard's tree (every spawn of the run)
RUN_CHILDREN = """SELECT id, status, task FROM runs WHERE parent_id = %(run_id)s
    ORDER BY id LIMIT %(limit)s"""
