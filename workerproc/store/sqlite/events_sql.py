"""The SQLite backend's outbox (B18): the events table, its reads, named consumers and their
retention. The single writer hands out ids in commit order as it writes them (one past the
largest in the table: ``PRUNE_EVENTS`` never deletes the newest event, so an id is never
given twice; ``AUTOINCREMENT`` would cost a write of its own per event), so numbering
(``LOCK_EVENTS``, ``SEQUENCE_EVENTS``) has nothing to do here.

Its queries are in ``queries/events.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# 16: the outbox (events, named consumers)
EVENTS_SCHEMA = """
CREATE TABLE events (
    id      INTEGER PRIMARY KEY,
    at      REAL    NOT NULL,
    run_id  INTEGER,
    kind    TEXT    NOT NULL,
    task    TEXT,
    attempt INTEGER,
    data    TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX events_run ON events (run_id, id);
CREATE TABLE event_consumers (
    name       TEXT    PRIMARY KEY,
    position   INTEGER NOT NULL DEFAULT 0,
    updated_at REAL
);
"""

QUERIES = load("workerproc.store.sqlite", "events.sql", style="named", internal=("INSERT_EVENT",))
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
