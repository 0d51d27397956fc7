"""PostgreSQL's statements for webhooks (issue 26: ``protocol/webhooks.py``, docs/protocol.md
B20), and the table's migration. A webhook's delivery position is its delivery run's state, moved by
that run's fenced commits; this table holds only what an operator declared."""

from __future__ import annotations

from .sql import _CLOCK

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

_COLUMNS = """name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at"""
WEBHOOK_ROWS = f"SELECT {_COLUMNS} FROM webhooks ORDER BY name"
WEBHOOK_ROW = f"SELECT {_COLUMNS} FROM webhooks WHERE name = %(name)s"
# a new webhook (a name already there: nothing, and the caller is told)
WEBHOOK_ADD = f"""INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
        backoff_max, timeout, created_at)
    VALUES (%(name)s, %(url)s, %(kinds)s, %(secret)s, %(run_id)s, %(max_failures)s,
            %(backoff)s, %(backoff_max)s, %(timeout)s, {_CLOCK})
    ON CONFLICT (name) DO NOTHING RETURNING name"""
# what a delivery run waits for now, its row locked (a second waker waits, then finds it woken)
WEBHOOK_PARKED = """SELECT wait_for FROM runs WHERE id = %(run_id)s AND status = 'pending'
    FOR UPDATE"""
# a parked delivery run's delivered wake signals (each resumed a task that is done) but the
# newest: gone, so a delivery run that lives for years keeps no row per wake
WEBHOOK_SIGNALS_DONE = """DELETE FROM signals WHERE run_id = %(run_id)s
    AND task_id IS NOT NULL AND id < (SELECT max(id) FROM signals WHERE run_id = %(run_id)s)"""
WEBHOOK_DROP = "DELETE FROM webhooks WHERE name = %(name)s RETURNING run_id"
