"""The PostgreSQL backend's outbox (B18): the events table, how committed events are numbered
in commit order, their reads, named consumers and their retention.

An id drawn from a sequence while writing is not commit-ordered here: a transaction can draw
5, another 6 and commit first, and a reader that saw 6 and stored "after 6" would miss 5 for
ever. So a transition writes its events unnumbered (``id`` NULL; ``seq`` only keeps the order
they were written in), and a reader numbers the committed ones first: ``LOCK_EVENTS`` (one
advisory lock per schema, held to the end of the reader's transaction), then
``SEQUENCE_EVENTS`` (``nextval`` in ``seq`` order). That transaction commits before the lock
is let go, so the numbered events any reader can see are always every number up to the
largest: a number handed out later is larger than every one seen before.

Its queries are in ``queries/events.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# 10: the outbox (events, named consumers)
EVENTS_SCHEMA = """
CREATE TABLE events (
    seq     bigint GENERATED ALWAYS AS IDENTITY,
    id      bigint,
    at      double precision NOT NULL,
    run_id  bigint,
    kind    text NOT NULL,
    task    text,
    attempt integer,
    data    json NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX events_id ON events (id) WHERE id IS NOT NULL;
CREATE INDEX events_unnumbered ON events (seq) WHERE id IS NULL;
CREATE INDEX events_run ON events (run_id, id) WHERE id IS NOT NULL;
CREATE SEQUENCE events_order AS bigint;
CREATE TABLE event_consumers (
    name       text PRIMARY KEY,
    position   bigint NOT NULL DEFAULT 0,
    updated_at double precision
);
"""

QUERIES = load("workerproc.store.postgres", "events.sql", style="pyformat", fields=("s",))
globals().update(texts(QUERIES))
# on a caller's own connection too (transactional enqueue): ``{s}``, the schema prefix, as
# ``ops_sql._INSERT_RUNS`` (``steps.insert_events`` formats it)
_INSERT_EVENTS = QUERIES["INSERT_EVENTS"].sql


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
