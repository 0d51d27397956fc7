"""PostgreSQL's statements for webhooks (``protocol/webhooks.py``,
docs/protocol.md B20), and the table's migrations. A webhook's row holds what an operator
declared and where its delivery stands (its position, moved by the delivery's fenced
``WEBHOOK_MOVE``); its delivery run's state holds the rest of its record.

Its queries are in ``queries/webhooks.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts
from ..types import SYSTEM_RUNS
from ..webhooks import DELIVERY_TASK, WEBHOOK_QUEUE

# 12: webhooks, one row each: where to POST, which kinds, the signing secret, the
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

# 16: a webhook's position (the last event it has dealt with) and its delivery count
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

# 33: each webhook's window (``RetryNumbers.in_flight``: its events open at once, what a fault
# re-sends), its own; the webhooks from before keep the window every webhook had then: 8 (written
# out: what this step does never changes with the default)
MIGRATION_IN_FLIGHT = """
    ALTER TABLE webhooks ADD COLUMN in_flight bigint NOT NULL DEFAULT 8;
"""

QUERIES = load("workerproc.store.postgres", "webhooks.sql", style="pyformat")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
