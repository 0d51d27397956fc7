"""PostgreSQL's statements for schedules (``protocol/schedules.py``), and the table's
migration. A firing locks the schedule's row first (``SCHEDULE_ROW ... FOR UPDATE``): a second
firer waits, then reads the ``next_at`` the first one wrote and fires nothing; the
compare-and-set on ``next_at`` (``SCHEDULE_FIRE``) fences the write all the same.

Its queries are in ``queries/schedules.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# 8: schedules, one row each: its declaration, the next tick it will fire
# (``next_at``, what the compare-and-set of a firing matches) and what it fired last
MIGRATION = """
    CREATE TABLE schedules (
        name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        cron        text NOT NULL,
        tz          text NOT NULL,
        task        text NOT NULL CHECK (length(task) > 0),
        payload     json NOT NULL,
        queue       text NOT NULL,
        priority    integer NOT NULL DEFAULT 0,
        catch_up    text NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
        next_at     double precision NOT NULL,
        last_tick   double precision,
        last_run    bigint,
        fired       bigint NOT NULL DEFAULT 0,
        declared    json NOT NULL,
        declared_by text NOT NULL,
        declared_at double precision NOT NULL
    );
    CREATE INDEX schedules_next ON schedules (next_at);
"""

QUERIES = load("workerproc.store.postgres", "schedules.sql", style="pyformat")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
