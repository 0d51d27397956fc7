"""SQLite's statements for webhooks (``protocol/webhooks.py``, docs/protocol.md
B20), and the table's migrations. A webhook's row holds what an operator declared and where its
delivery stands (its position, moved by the delivery's fenced ``WEBHOOK_MOVE``); its delivery
run's state holds the rest of its record."""

from __future__ import annotations

from ..types import SYSTEM_RUNS
from ..webhooks import DELIVERY_TASK, WEBHOOK_QUEUE

# the fence of a write after a claim (as ``sql._FENCE``, which imports the schema that imports
# this module)
_FENCE = """id = :task_id AND lease_owner = :owner AND attempts = :attempt
    AND lease_expires_at > :now AND done_at IS NULL"""

# 18: webhooks, one row each: where to POST, which kinds, the signing secret, the
# retry numbers and the delivery run that carries its position
MIGRATION = """
    CREATE TABLE webhooks (
        name         TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        url          TEXT NOT NULL,
        kinds        TEXT CHECK (kinds IS NULL OR json_valid(kinds)),
        secret       TEXT NOT NULL,
        run_id       INTEGER NOT NULL,
        max_failures INTEGER NOT NULL,
        backoff      REAL NOT NULL,
        backoff_max  REAL NOT NULL,
        timeout      REAL NOT NULL,
        created_at   REAL NOT NULL
    );
"""

# 22: a webhook's position (the last event it has dealt with) and its delivery count
# live on its row, moved by one small fenced statement per acknowledged POST (``WEBHOOK_MOVE``),
# taken from its delivery run's state where they were kept before; the system's runs are numbered
# from ``SYSTEM_RUNS`` up (``INSERT_SYSTEM_RUN``: one past ``system_high``, the highest system id
# ever given; the users' ``high`` keeps counting below), and the delivery runs made before move
# there, with every row that names them (foreign keys checked at the commit), their old ids
# never given again.
_REPOINT = "\n".join(
    f"UPDATE {t} SET {c} = (SELECT new FROM moved_runs WHERE old = {t}.{c})\n"
    f"        WHERE {c} IN (SELECT old FROM moved_runs);"
    for t, c in [("runs", "id"), ("tasks", "run_id"), ("task_attempts", "run_id"),
                 ("signals", "run_id"), ("paid_calls", "run_id"), ("fence_rejections", "run_id"),
                 ("events", "run_id"), ("webhooks", "run_id")]
)  # fmt: skip
MIGRATION_POSITIONS = f"""
    ALTER TABLE webhooks ADD COLUMN position INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE webhooks ADD COLUMN delivered INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE webhooks ADD COLUMN delivered_at REAL;
    UPDATE webhooks SET
        position = coalesce((SELECT CAST(json_extract(r.state, '$.cursor') AS INTEGER)
                             FROM runs AS r WHERE r.id = webhooks.run_id), 0),
        delivered = coalesce((SELECT CAST(json_extract(r.state, '$.delivered') AS INTEGER)
                              FROM runs AS r WHERE r.id = webhooks.run_id), 0),
        delivered_at = (SELECT CAST(json_extract(r.state, '$.last_delivery_at') AS REAL)
                        FROM runs AS r WHERE r.id = webhooks.run_id);

    ALTER TABLE run_ids ADD COLUMN system_high INTEGER NOT NULL DEFAULT {SYSTEM_RUNS};
    DROP TRIGGER runs_keep_high_id;
    CREATE TRIGGER runs_keep_high_id AFTER DELETE ON runs
        WHEN OLD.id < {SYSTEM_RUNS} AND OLD.id > (SELECT high FROM run_ids) BEGIN
        UPDATE run_ids SET high = OLD.id;
    END;
    CREATE TRIGGER runs_keep_system_high AFTER DELETE ON runs
        WHEN OLD.id > (SELECT system_high FROM run_ids) BEGIN
        UPDATE run_ids SET system_high = OLD.id;
    END;

    PRAGMA defer_foreign_keys = ON;
    CREATE TEMP TABLE moved_runs (old INTEGER PRIMARY KEY, new INTEGER NOT NULL);
    INSERT INTO moved_runs (old, new)
        SELECT id, {SYSTEM_RUNS} + row_number() OVER (ORDER BY id) FROM runs
        WHERE queue = '{WEBHOOK_QUEUE}' AND task = '{DELIVERY_TASK}'
          AND id < {SYSTEM_RUNS};
    UPDATE run_ids SET high = max(high, coalesce((SELECT max(old) FROM moved_runs), 0));
{_REPOINT}
    DROP TABLE moved_runs;
"""

_COLUMNS = """name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at, position, delivered, delivered_at"""
WEBHOOK_ROWS = f"SELECT {_COLUMNS} FROM webhooks ORDER BY name"
WEBHOOK_ROW = f"SELECT {_COLUMNS} FROM webhooks WHERE name = :name"
# a new webhook (a name already there: nothing, and the caller is told)
WEBHOOK_ADD = """INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
        backoff_max, timeout, created_at, position)
    VALUES (:name, :url, :kinds, :secret, :run_id, :max_failures, :backoff, :backoff_max,
            :timeout, :now, :position)
    ON CONFLICT (name) DO NOTHING RETURNING name"""
# a delivery moves its webhook's position past what its receiver acknowledged (and counts the
# POSTs, as the position moves: sent again, it changes nothing): one small row, under the fence
# of the delivery's lease (R2), so a zombie moves nothing; never backwards
WEBHOOK_MOVE = f"""UPDATE webhooks SET position = max(position, :position),
        delivered = delivered + CASE WHEN :position > position THEN :delivered ELSE 0 END,
        delivered_at = CASE WHEN :position > position AND :delivered > 0 THEN :now
                            ELSE delivered_at END
    WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM tasks WHERE {_FENCE} AND run_id = :run_id)
    RETURNING position"""
# a webhook's backlog: the users' events after its position, by kind (the caller keeps the
# kinds it wants), counted up to :limit
WEBHOOK_BACKLOG = f"""SELECT kind, count(*) FROM (SELECT kind FROM events
        WHERE id > :after AND coalesce(run_id, 0) < {SYSTEM_RUNS} ORDER BY id LIMIT :limit)
    GROUP BY kind"""
# when a delivery run's next task is due (its first pending one: a backoff's next try), and
# whether a delivery is in flight (its task leased, or its lease expired: to be taken over)
WEBHOOK_DUE = """SELECT r.head_at, r.status IN ('pending', 'running') AND EXISTS (
        SELECT 1 FROM tasks AS t WHERE t.run_id = r.id AND t.done_at IS NULL
          AND t.lease_owner IS NOT NULL)
    FROM runs AS r WHERE r.id = :run_id"""
# what a delivery run waits for now (the write lock held: no second waker signals it too)
WEBHOOK_PARKED = "SELECT wait_for FROM runs WHERE id = :run_id AND status = 'pending'"
# a parked delivery run's delivered wake signals (each resumed a task that is done) but the
# newest: gone, so a delivery run that lives for years keeps no row per wake (the newest stays,
# so no id is ever given again: a done task's signal_id keeps naming its own)
WEBHOOK_SIGNALS_DONE = """DELETE FROM signals WHERE run_id = :run_id AND task_id IS NOT NULL
    AND id < (SELECT max(id) FROM signals WHERE run_id = :run_id)"""
WEBHOOK_DROP = "DELETE FROM webhooks WHERE name = :name RETURNING run_id"
