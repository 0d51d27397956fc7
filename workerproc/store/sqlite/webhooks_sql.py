"""SQLite's statements for webhooks (``protocol/webhooks.py``, docs/protocol.md
B20), and the table's migrations. A webhook's row holds what an operator declared and where its
delivery stands (its position, moved by the delivery's fenced ``WEBHOOK_MOVE``); its delivery
run's state holds the rest of its record.

Its queries are in ``queries/webhooks.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts
from ..types import SYSTEM_RUNS
from ..webhooks import DELIVERY_TASK, WEBHOOK_QUEUE

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

# 33: each webhook's window (``RetryNumbers.in_flight``: its events open at once, what a fault
# re-sends), its own; the webhooks from before keep the window every webhook had then: 8 (written
# out: what this step does never changes with the default)
MIGRATION_IN_FLIGHT = """
    ALTER TABLE webhooks ADD COLUMN in_flight INTEGER NOT NULL DEFAULT 8;
"""

QUERIES = load("workerproc.store.sqlite", "webhooks.sql", style="named")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
