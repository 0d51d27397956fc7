"""PostgreSQL's statements for runs that wait (issue 25, docs/protocol.md B14): a wait is the
run's next task stored pending but not due (``available_at`` at its deadline, and so the run's
``head_at``), so the claim never walks it before then; the run row says what it waits for. A
signal is kept in ``signals`` until a wait of its name takes it: its task is then due at once
and the run's head follows. Every statement that writes a run's wait or its signals locks the
run row first (the schema's lock order)."""

from __future__ import annotations

from .sql import _CLOCK, _LOCKED, NOTIFY, head_of

# migration 8: what a run waits for, until when, on which task; the signals; which signal a
# task was resumed by
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
clock AS MATERIALIZED (SELECT {_CLOCK} AS now FROM run)
INSERT INTO signals (run_id, name, payload, sent_at)
    SELECT run.id, %(name)s, %(payload)s::json, clock.now FROM run, clock RETURNING id"""

# the oldest kept signal of the name the run waits for now (its deadline ahead, its task not
# done), delivered: the signal is taken, its task is due now and knows it, the run waits no
# more, its head is that task (due now, unless one comes before it), and idle workers are told
_DUE_HEAD = head_of("r.id", without="f.task_id", extra="clock.now, f.created_at, f.task_id, f.line")
DELIVER_SIGNAL = f"""{_LOCKED},
found AS MATERIALIZED (
    SELECT r.wait_task AS task_id, s.id AS signal_id, t.created_at, t.line FROM runs AS r
    JOIN signals AS s ON s.run_id = r.id AND s.task_id IS NULL
        AND 'signal:' || s.name = r.wait_for
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL, clock
    WHERE r.id = %(run_id)s AND r.status = 'pending' AND r.wait_until > clock.now
    ORDER BY s.id LIMIT 1),
taken AS (UPDATE signals AS s SET task_id = f.task_id FROM found AS f WHERE s.id = f.signal_id),
due AS (UPDATE tasks AS t SET available_at = clock.now, signal_id = f.signal_id
    FROM found AS f, clock WHERE t.id = f.task_id),
over AS (UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL, {_DUE_HEAD}
    FROM found AS f, clock WHERE r.id = %(run_id)s RETURNING r.id)
SELECT task_id, signal_id, (SELECT {NOTIFY} FROM over) FROM found"""

# the claim hands the handler the signal that resumed its task (``ctx.signal``)
GET_SIGNAL = "SELECT name, payload::text, sent_at FROM signals WHERE id = %(signal_id)s"
# a run's signals, newest first (``show``)
RUN_SIGNALS = """SELECT id, name, payload::text, sent_at, task_id FROM signals
    WHERE run_id = %(run_id)s ORDER BY id DESC LIMIT %(limit)s"""
