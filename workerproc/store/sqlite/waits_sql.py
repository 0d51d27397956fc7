"""SQLite's statements for runs that wait (docs/protocol.md B14): a wait is the run's
next task stored pending but not due (``available_at`` at its deadline), so the claim index
never walks it before then; the run row says what it waits for. A signal is kept in
``signals`` until a wait of its name takes it: the signal's task is then due at once (the
head triggers put the run back in the claim index)."""

from __future__ import annotations

ALIVE = "('pending', 'running')"  # a live run (as ``sql.ALIVE``; the schema imports this module)

# migration 13: what a run waits for, until when, on which task; the signals; which signal a
# task was resumed by; a child run's parent, the parent's join task and its place in the spawn;
# how many children a parent still waits for
MIGRATION_WAITS = """
    ALTER TABLE runs ADD COLUMN wait_for TEXT;
    ALTER TABLE runs ADD COLUMN wait_until REAL;
    ALTER TABLE runs ADD COLUMN wait_task INTEGER;
    ALTER TABLE tasks ADD COLUMN signal_id INTEGER;
    CREATE TABLE signals (
        id      INTEGER PRIMARY KEY,
        run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name    TEXT    NOT NULL,
        payload TEXT    NOT NULL DEFAULT 'null' CHECK (json_valid(payload)),
        sent_at REAL    NOT NULL,
        task_id INTEGER
    );
    CREATE INDEX signals_kept ON signals (run_id, name, id) WHERE task_id IS NULL;
    CREATE INDEX signals_run ON signals (run_id);
    ALTER TABLE runs ADD COLUMN parent_id INTEGER;
    ALTER TABLE runs ADD COLUMN join_task INTEGER;
    ALTER TABLE runs ADD COLUMN spawn_ord INTEGER;
    ALTER TABLE runs ADD COLUMN children_left INTEGER;
    CREATE INDEX runs_parent ON runs (parent_id, join_task, spawn_ord)
        WHERE parent_id IS NOT NULL;
"""

# the wait commit (after ADVANCE wrote the next task, not due before the deadline): the run
# waits for ``:wait_for`` on that task (its newest) until then
MARK_WAIT = """UPDATE runs SET wait_for = :wait_for, wait_until = :now + :delay,
    wait_task = (SELECT max(id) FROM tasks WHERE run_id = :run_id AND done_at IS NULL)
    WHERE id = :run_id"""

# a signal to a live run is kept (a finished or unknown run: nothing, and the caller is told)
INSERT_SIGNAL = f"""INSERT INTO signals (run_id, name, payload, sent_at)
    SELECT :run_id, :name, :payload, :now WHERE EXISTS (
        SELECT 1 FROM runs WHERE id = :run_id AND status IN {ALIVE})
    RETURNING id"""

# the oldest kept signal of the name the run waits for now (its deadline ahead, or the wait
# being committed: ``:fresh``, even with timeout 0; its task not claimed), and the task that
# waits for it (``steps.deliver_signal`` then delivers it)
WAITING_SIGNAL = f"""SELECT r.wait_task, s.id FROM runs AS r
    JOIN signals AS s ON s.run_id = r.id AND s.task_id IS NULL AND 'signal:' || s.name = r.wait_for
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL AND t.lease_owner IS NULL
    WHERE r.id = :run_id AND r.status IN {ALIVE} AND (r.wait_until > :now OR :fresh)
    ORDER BY s.id LIMIT 1"""
SIGNAL_TAKEN = "UPDATE signals SET task_id = :task_id WHERE id = :signal_id"
# the waiting task is due now and knows its signal; the run waits no more
SIGNAL_TASK_DUE = """UPDATE tasks SET available_at = :now, signal_id = :signal_id
    WHERE id = :task_id"""
WAIT_OVER = """UPDATE runs SET wait_for = NULL, wait_until = NULL, wait_task = NULL
    WHERE id = :run_id"""

# the claim hands the handler the signal that resumed its task (``ctx.signal``)
GET_SIGNAL = "SELECT name, payload, sent_at FROM signals WHERE id = :signal_id"
# a run's signals, newest first (``show``)
RUN_SIGNALS = """SELECT id, name, payload, sent_at, task_id FROM signals WHERE run_id = :run_id
    ORDER BY id DESC LIMIT :limit"""

# migration 20: a child's place in its parent's join has a column of its own,
# ``parent_join``; ``join_task`` is only a run's own join. One column for both lost a child's
# parent as soon as the child spawned children of its own: its end never reached that join.
# Children linked before keep what can be recovered: their own column's value, or (a child
# that spawned since) its parent's join.
MIGRATION_PARENT_JOIN = """
    ALTER TABLE runs ADD COLUMN parent_join INTEGER;
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
# the spawn commit (after ADVANCE wrote the join task, not due, and INSERT_RUNS the children):
# each child knows its parent, the join task and its place; the parent how many it waits for
# (``steps.link_children``: the children as a JSON array of ids)
LINK_CHILD = """UPDATE runs SET parent_id = :parent, parent_join = :join_task, spawn_ord = :ord
    WHERE id = :child"""
LINK_PARENT = """UPDATE runs SET children_left = :n, join_task = wait_task WHERE id = :parent
    RETURNING wait_task"""
# a run ended: its parent waits for one child less (``steps.child_ended``) ...
PARENT_OF = """SELECT parent_id, parent_join FROM runs
    WHERE id = :run_id AND parent_id IS NOT NULL"""
CHILD_LEFT = f"""UPDATE runs SET children_left = children_left - 1
    WHERE id = :parent AND join_task = :join_task AND children_left > 0 AND status IN {ALIVE}
    RETURNING children_left"""
# ... and the last one makes the join task due (the head triggers put the parent back in the
# claim index); a spawn of no children, at once
JOIN_TASK_DUE = """UPDATE tasks SET available_at = :now WHERE id = :join_task
    AND done_at IS NULL"""
JOIN_DUE = """UPDATE tasks SET available_at = :now WHERE id = (
    SELECT join_task FROM runs WHERE id = :run_id) AND done_at IS NULL"""
# a failed or cancelled child retried while its parent still waits for it: one more to wait for
CHILD_RETRIED = f"""UPDATE runs SET children_left = children_left + 1
    WHERE id = (SELECT parent_id FROM runs WHERE id = :run_id)
      AND join_task = (SELECT parent_join FROM runs WHERE id = :run_id)
      AND wait_for = 'children' AND status IN {ALIVE}"""
# the join's children, in spawn order (``ctx.children``)
CHILDREN_OF = """SELECT id, status, result, last_error FROM runs
    WHERE parent_id = :run_id AND parent_join = :task_id ORDER BY spawn_ord"""
# a cancelled run's live descendants are cancelled with it
CANCEL_DESCENDANTS = f"""WITH RECURSIVE kin(id) AS (
        SELECT id FROM runs WHERE parent_id = :run_id
        UNION SELECT r.id FROM runs AS r JOIN kin ON r.parent_id = kin.id)
    UPDATE runs SET status = 'cancelled', finished_at = :now, updated_at = :now
    WHERE id IN (SELECT id FROM kin) AND status IN {ALIVE} RETURNING queue, id"""
# a run's children, oldest first, for the dashboard's tree (every spawn of the run)
RUN_CHILDREN = """SELECT id, status, task FROM runs WHERE parent_id = :run_id
    ORDER BY id LIMIT :limit"""
