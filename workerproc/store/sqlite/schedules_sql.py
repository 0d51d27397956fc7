"""SQLite's statements for schedules (``protocol/schedules.py``), and the table's
migration. A firing runs in one write transaction (BEGIN IMMEDIATE holds the whole database), so
reading the schedule's row and moving its ``next_at`` by compare-and-set need no row lock.

Its queries are in ``queries/schedules.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# 14: schedules, one row each: its declaration, the next tick it will fire
# (``next_at``, what the compare-and-set of a firing matches) and what it fired last
MIGRATION = """
    CREATE TABLE schedules (
        name        TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        cron        TEXT NOT NULL,
        tz          TEXT NOT NULL,
        task        TEXT NOT NULL CHECK (length(task) > 0),
        payload     TEXT NOT NULL CHECK (json_valid(payload)),
        queue       TEXT NOT NULL,
        priority    INTEGER NOT NULL DEFAULT 0,
        catch_up    TEXT NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
        next_at     REAL NOT NULL,
        last_tick   REAL,
        last_run    INTEGER,
        fired       INTEGER NOT NULL DEFAULT 0,
        declared    TEXT NOT NULL CHECK (json_valid(declared)),
        declared_by TEXT NOT NULL,
        declared_at REAL NOT NULL
    );
    CREATE INDEX schedules_next ON schedules (next_at);
"""

QUERIES = load("workerproc.store.sqlite", "schedules.sql", style="named")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
