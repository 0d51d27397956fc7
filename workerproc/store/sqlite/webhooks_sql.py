"""SQLite's statements for webhooks (issue 26: ``protocol/webhooks.py``, docs/protocol.md B20),
and the table's migration. A webhook's delivery position is its delivery run's state, moved by
that run's fenced commits; this table holds only what an operator declared."""

from __future__ import annotations

# 18 (issue 26): webhooks, one row each: where to POST, which kinds, the signing secret, the
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

_COLUMNS = """name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at"""
WEBHOOK_ROWS = f"SELECT {_COLUMNS} FROM webhooks ORDER BY name"
WEBHOOK_ROW = f"SELECT {_COLUMNS} FROM webhooks WHERE name = :name"
# a new webhook (a name already there: nothing, and the caller is told)
WEBHOOK_ADD = """INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
        backoff_max, timeout, created_at)
    VALUES (:name, :url, :kinds, :secret, :run_id, :max_failures, :backoff, :backoff_max,
            :timeout, :now)
    ON CONFLICT (name) DO NOTHING RETURNING name"""
# what a delivery run waits for now (the write lock held: no second waker signals it too)
WEBHOOK_PARKED = "SELECT wait_for FROM runs WHERE id = :run_id AND status = 'pending'"
# a parked delivery run's delivered wake signals (each resumed a task that is done) but the
# newest: gone, so a delivery run that lives for years keeps no row per wake (the newest stays,
# so no id is ever given again: a done task's signal_id keeps naming its own)
WEBHOOK_SIGNALS_DONE = """DELETE FROM signals WHERE run_id = :run_id AND task_id IS NOT NULL
    AND id < (SELECT max(id) FROM signals WHERE run_id = :run_id)"""
WEBHOOK_DROP = "DELETE FROM webhooks WHERE name = :name RETURNING run_id"
