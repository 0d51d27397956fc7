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
"""

from __future__ import annotations

from .fragments import CLOCK

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

# the events of one transaction, in one statement, in the order they were emitted, sent as one
# JSON array of [run_id, kind, task, attempt, data] (one text value: cheap to send however the
# driver binds it); ``{s}``: the schema prefix on a caller's own connection, as
# ``ops_sql._INSERT_RUNS``
_INSERT_EVENTS = f"""INSERT INTO {{s}}events (at, run_id, kind, task, attempt, data)
    SELECT {CLOCK}, (e.v->>0)::bigint, e.v->>1, e.v->>2, (e.v->>3)::int, e.v->4
    FROM json_array_elements(%(events)s::json) WITH ORDINALITY AS e(v, n)
    ORDER BY e.n"""
# a takeover: who held the lease before, and its attempt (kept on the lease row by the claim)
TAKEN_FROM = "SELECT prev_owner, prev_attempts FROM leases WHERE run_id = %(run_id)s"
# numbering (see above): the lock first, in a statement of its own, so the numbering
# statement's snapshot sees every number the lock's previous holder committed
LOCK_EVENTS = """SELECT pg_advisory_xact_lock(
    hashtextextended('leasekeeper.events.' || current_schema(), 0))"""
SEQUENCE_EVENTS = """WITH todo AS MATERIALIZED (
    SELECT seq FROM events WHERE id IS NULL ORDER BY seq LIMIT %(limit)s),
numbered AS MATERIALIZED (
    SELECT t.seq, nextval('events_order') AS id FROM (SELECT seq FROM todo ORDER BY seq) AS t)
UPDATE events AS e SET id = n.id FROM numbered AS n WHERE e.seq = n.seq AND e.id IS NULL
RETURNING e.id"""
_COLUMNS = "id, at, run_id, kind, task, attempt, data::text"
# (the system's runs' events only when asked: ``%(below)s`` is ``SYSTEM_RUNS`` or above every id)
LIST_EVENTS = f"""SELECT {_COLUMNS} FROM events WHERE id > %(after)s
    AND coalesce(run_id, 0) < %(below)s ORDER BY id LIMIT %(limit)s"""
LIST_RUN_EVENTS = f"""SELECT {_COLUMNS} FROM events WHERE run_id = %(run_id)s
    AND id > %(after)s ORDER BY id LIMIT %(limit)s"""
# the newest numbered event's id (0: none yet), read after a numbering (the partial index)
LAST_EVENT = "SELECT coalesce(max(id), 0) FROM events WHERE id IS NOT NULL"
CONSUMER_AT = "SELECT position FROM event_consumers WHERE name = %(name)s"
# a consumer acknowledged every event up to %(upto)s (its cursor never moves back)
ACK_EVENTS = f"""INSERT INTO event_consumers AS c (name, position, updated_at)
    VALUES (%(name)s, %(upto)s, {CLOCK})
    ON CONFLICT (name) DO UPDATE SET position = greatest(c.position, excluded.position),
        updated_at = excluded.updated_at
    RETURNING c.position"""
DROP_CONSUMER = "DELETE FROM event_consumers WHERE name = %(name)s RETURNING name"
# retention: numbered events older than the cutoff that every named consumer and every webhook
# (its position, B20) has passed (or all of them, forced), but never the newest (as on
# SQLite), a bounded batch per transaction
PRUNE_EVENTS = f"""WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now)
DELETE FROM events WHERE id IN (
    SELECT id FROM events, clock WHERE id IS NOT NULL AND at < clock.now - %(age)s
      AND id < (SELECT max(id) FROM events)
      AND (%(force)s OR id <= coalesce((SELECT min(position) FROM event_consumers), id))
      AND (%(force)s OR id <= coalesce((SELECT min(position) FROM webhooks), id))
    ORDER BY id LIMIT %(limit)s) RETURNING id"""
