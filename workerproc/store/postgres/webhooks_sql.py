"""PostgreSQL's statements for webhooks (issues 26 and 36: ``protocol/webhooks.py``,
docs/protocol.md B20), and the table's migrations. A webhook's row holds what an operator
declared and where its delivery stands (its position, moved by the delivery's fenced
``WEBHOOK_MOVE``); its delivery run's state holds the rest of its record."""

from __future__ import annotations

from ..types import SYSTEM_RUNS
from ..webhooks import DELIVERY_TASK, WEBHOOK_QUEUE
from .sql import _CLOCK, _CLOCK_CTE, _FENCE, _ONE

# 12 (issue 26): webhooks, one row each: where to POST, which kinds, the signing secret, the
# retry numbers and the delivery run that carries its position
MIGRATION = """
    CREATE TABLE webhooks (
        name         text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        url          text NOT NULL,
        kinds        text,
        secret       text NOT NULL,
        run_id       bigint NOT NULL,
        max_failures bigint NOT NULL,
        backoff      double precision NOT NULL,
        backoff_max  double precision NOT NULL,
        timeout      double precision NOT NULL,
        created_at   double precision NOT NULL
    );
"""

# 16 (issue 36): a webhook's position (the last event it has dealt with) and its delivery count
# live on its row, moved by one small fenced statement per acknowledged POST (``WEBHOOK_MOVE``: a
# HOT update), taken from its delivery run's state where they were kept before; the system's
# runs are numbered from ``SYSTEM_RUNS`` up (their own sequence, ``system_run_ids``), and the
# delivery runs made before move there with every row that names them, in one statement (the
# foreign keys are checked at its end); the users' sequence never gives their old ids again.
_NUMBER = "CASE WHEN json_typeof(r.state -> '{key}') = 'number' THEN (r.state ->> '{key}')"
_REPOINT = ",\n".join(
    f"{t}_moved AS (UPDATE {t} SET {c} = m.new FROM m WHERE {t}.{c} = m.old)"
    for t, c in [("tasks", "run_id"), ("task_attempts", "run_id"), ("signals", "run_id"),
                 ("paid_calls", "run_id"), ("fence_rejections", "run_id"),
                 ("events", "run_id"), ("leases", "run_id"), ("webhooks", "run_id")]
)  # fmt: skip
MIGRATION_POSITIONS = f"""
    ALTER TABLE webhooks ADD COLUMN position bigint NOT NULL DEFAULT 0,
        ADD COLUMN delivered bigint NOT NULL DEFAULT 0,
        ADD COLUMN delivered_at double precision;
    UPDATE webhooks AS w SET
        position = coalesce({_NUMBER.format(key="cursor")}::numeric::bigint END, 0),
        delivered = coalesce({_NUMBER.format(key="delivered")}::numeric::bigint END, 0),
        delivered_at = {_NUMBER.format(key="last_delivery_at")}::double precision END
    FROM runs AS r WHERE r.id = w.run_id;
    CREATE SEQUENCE system_run_ids START WITH {SYSTEM_RUNS + 1} MINVALUE {SYSTEM_RUNS + 1};
    WITH m AS MATERIALIZED (
        SELECT id AS old, {SYSTEM_RUNS} + row_number() OVER (ORDER BY id) AS new FROM runs
        WHERE queue = '{WEBHOOK_QUEUE}' AND task = '{DELIVERY_TASK}' AND id < {SYSTEM_RUNS}),
    runs_moved AS (UPDATE runs SET id = m.new FROM m WHERE runs.id = m.old),
    {_REPOINT}
    SELECT setval('system_run_ids', max(new)) FROM m HAVING count(*) > 0;
"""

_COLUMNS = """name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at, position, delivered, delivered_at"""
WEBHOOK_ROWS = f"SELECT {_COLUMNS} FROM webhooks ORDER BY name"
WEBHOOK_ROW = f"SELECT {_COLUMNS} FROM webhooks WHERE name = %(name)s"
# a new webhook (a name already there: nothing, and the caller is told)
WEBHOOK_ADD = f"""INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
        backoff_max, timeout, created_at, position)
    VALUES (%(name)s, %(url)s, %(kinds)s, %(secret)s, %(run_id)s, %(max_failures)s,
            %(backoff)s, %(backoff_max)s, %(timeout)s, {_CLOCK}, %(position)s)
    ON CONFLICT (name) DO NOTHING RETURNING name"""
# a delivery moves its webhook's position past what its receiver acknowledged (and counts the
# POSTs, as the position moves: sent again, it changes nothing): one small row (a HOT update),
# under the fence of the delivery's lease (R2), so a zombie moves nothing; never backwards.
# One statement on its own (no BEGIN, no COMMIT round trip). Its run is not locked: "now" is
# read after the statement's snapshot, so a takeover it cannot see came after a moment its
# lease was live at, and what it records (POSTs acknowledged under that lease) stays true. Its
# commit does not wait for the WAL to reach the disk (``synchronous_commit`` off for this
# transaction): a crash of the server may undo the newest moves, and those events are sent
# again.
WEBHOOK_MOVE = f"""{_CLOCK_CTE},
lazy AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
UPDATE webhooks AS w SET position = greatest(w.position, %(position)s),
    delivered = w.delivered + CASE WHEN %(position)s > w.position THEN %(delivered)s ELSE 0 END,
    delivered_at = CASE WHEN %(position)s > w.position AND %(delivered)s > 0 THEN clock.now
                        ELSE w.delivered_at END
FROM clock, lazy
WHERE w.run_id = %(run_id)s AND EXISTS (SELECT 1 FROM leases AS l, {_ONE} WHERE {_FENCE})
RETURNING w.position"""
# a webhook's backlog: the users' numbered events after its position, by kind (the caller
# keeps the kinds it wants), counted up to %(limit)s
WEBHOOK_BACKLOG = f"""SELECT kind, count(*) FROM (SELECT kind FROM events
        WHERE id > %(after)s AND coalesce(run_id, 0) < {SYSTEM_RUNS} ORDER BY id
        LIMIT %(limit)s) AS behind
    GROUP BY kind"""
# when a delivery run's next task is due (its first pending one: a backoff's next try), and
# whether a delivery is in flight (its task leased, or its lease expired: to be taken over)
WEBHOOK_DUE = """SELECT r.head_at, r.status = 'pending' AND EXISTS (
        SELECT 1 FROM leases AS l JOIN tasks AS t ON t.id = l.task_id
        WHERE l.run_id = r.id AND l.owner IS NOT NULL AND t.done_at IS NULL)
    FROM runs AS r WHERE r.id = %(run_id)s"""
# what a delivery run waits for now, its row locked (a second waker waits, then finds it woken)
WEBHOOK_PARKED = """SELECT wait_for FROM runs WHERE id = %(run_id)s AND status = 'pending'
    FOR UPDATE"""
# a parked delivery run's delivered wake signals (each resumed a task that is done) but the
# newest: gone, so a delivery run that lives for years keeps no row per wake
WEBHOOK_SIGNALS_DONE = """DELETE FROM signals WHERE run_id = %(run_id)s
    AND task_id IS NOT NULL AND id < (SELECT max(id) FROM signals WHERE run_id = %(run_id)s)"""
WEBHOOK_DROP = "DELETE FROM webhooks WHERE name = %(name)s RETURNING run_id"
