"""The SQLite backend's outbox (B18): the events table, its reads, named consumers and their
retention. The single writer hands out ids in commit order as it writes them (one past the
largest in the table: ``PRUNE_EVENTS`` never deletes the newest event, so an id is never
given twice; ``AUTOINCREMENT`` would cost a write of its own per event), so numbering
(``LOCK_EVENTS``, ``SEQUENCE_EVENTS``) has nothing to do here."""

from __future__ import annotations

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

# one event of a transition, in its transaction (``steps.insert_events`` sends each one, its
# values in this order: positional binding is the cheaper kind on the hot path)
INSERT_EVENT = """INSERT INTO events (at, run_id, kind, task, attempt, data)
    VALUES (?, ?, ?, ?, ?, ?)"""
# a takeover: who held the lease before, and its attempt (the same task, one attempt back)
TAKEN_FROM = "SELECT prev_owner, attempts - 1 FROM tasks WHERE id = :task_id"
# numbering: nothing to do (ids are commit-ordered already)
LOCK_EVENTS = "SELECT 1"
SEQUENCE_EVENTS = "SELECT 0 WHERE 0"
_COLUMNS = "id, at, run_id, kind, task, attempt, data"
# (the system's runs' events only when asked: ``:below`` is ``SYSTEM_RUNS`` or above every id)
LIST_EVENTS = f"""SELECT {_COLUMNS} FROM events WHERE id > :after
    AND coalesce(run_id, 0) < :below ORDER BY id LIMIT :limit"""
LIST_RUN_EVENTS = f"""SELECT {_COLUMNS} FROM events WHERE run_id = :run_id AND id > :after
    ORDER BY id LIMIT :limit"""
# the newest event's id (0: none yet): where a follower that wants only new events starts
LAST_EVENT = "SELECT coalesce(max(id), 0) FROM events"
CONSUMER_AT = "SELECT position FROM event_consumers WHERE name = :name"
# a consumer acknowledged every event up to :upto (its cursor never moves back)
ACK_EVENTS = """INSERT INTO event_consumers (name, position, updated_at) VALUES (:name, :upto, :now)
    ON CONFLICT (name) DO UPDATE SET position = max(position, excluded.position),
        updated_at = excluded.updated_at
    RETURNING position"""
DROP_CONSUMER = "DELETE FROM event_consumers WHERE name = :name"
# retention: events older than the cutoff that every named consumer and every webhook (its
# position, B20) has passed (or all of them, forced), but never the newest (the next id counts
# on from it), a bounded batch per transaction
PRUNE_EVENTS = """DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE at < :now - :age AND id < (SELECT max(id) FROM events)
      AND (:force OR id <= coalesce((SELECT min(position) FROM event_consumers), id))
      AND (:force OR id <= coalesce((SELECT min(position) FROM webhooks), id))
    ORDER BY id LIMIT :limit)"""
