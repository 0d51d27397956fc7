"""SQLite's statements for runs that wait (issue 25, docs/protocol.md B14): a wait is the run's
next task stored pending but not due (``available_at`` at its deadline), so the claim index
never walks it before then; the run row says what it waits for. A signal is kept in
``signals`` until a wait of its name takes it: the signal's task is then due at once (the
head triggers put the run back in the claim index)."""

from __future__ import annotations

ALIVE = "('pending', 'running')"  # a live run (as ``sql.ALIVE``; the schema imports this module)

# migration 14: what a run waits for, until when, on which task; the signals; which signal a
# task was resumed by
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

# the oldest kept signal of the name the run waits for now (its deadline ahead, its task not
# claimed), and the task that waits for it (``steps.deliver_signal`` then delivers it)
WAITING_SIGNAL = f"""SELECT r.wait_task, s.id FROM runs AS r
    JOIN signals AS s ON s.run_id = r.id AND s.task_id IS NULL AND 'signal:' || s.name = r.wait_for
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL AND t.lease_owner IS NULL
    WHERE r.id = :run_id AND r.status IN {ALIVE} AND r.wait_until > :now
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
