-- The PostgreSQL backend's outbox (B18): the events table, how committed events are numbered
-- in commit order, their reads, named consumers and their retention.
--
-- An id drawn from a sequence while writing is not commit-ordered here: a transaction can draw
-- 5, another 6 and commit first, and a reader that saw 6 and stored "after 6" would miss 5 for
-- ever. So a transition writes its events unnumbered (``id`` NULL; ``seq`` only keeps the order
-- they were written in), and a reader numbers the committed ones first: ``LOCK_EVENTS`` (one
-- advisory lock per schema, held to the end of the reader's transaction), then
-- ``SEQUENCE_EVENTS`` (``nextval`` in ``seq`` order). That transaction commits before the lock
-- is let go, so the numbered events any reader can see are always every number up to the
-- largest: a number handed out later is larger than every one seen before.

-- name: INSERT_EVENTS
-- the events of one transaction, in one statement, in the order they were emitted, sent as
-- one array per column (each event's data is JSON text already: parsed once, as it is stored;
-- sent as one JSON array of rows, every ``->>`` of a json value lexed its row's text again);
-- ``{s}``: the schema prefix on a caller's own connection, as ``ops_sql._INSERT_RUNS``
INSERT INTO {s}events (at, run_id, kind, task, attempt, data)
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
        e.run_id, e.kind, e.task, e.attempt, e.data::json
    FROM unnest(%(run_ids)s::bigint[], %(kinds)s::text[], %(tasks)s::text[],
                %(attempts)s::int[], %(datas)s::text[])
        WITH ORDINALITY AS e(run_id, kind, task, attempt, data, n)
    ORDER BY e.n

-- name: TAKEN_FROM
-- a takeover: who held the lease before, and its attempt (kept on the lease row by the claim)
SELECT prev_owner, prev_attempts FROM leases WHERE run_id = %(run_id)s

-- name: LOCK_EVENTS
-- numbering (see above): the lock first, in a statement of its own, so the numbering
-- statement's snapshot sees every number the lock's previous holder committed
SELECT pg_advisory_xact_lock(
    hashtextextended('leasekeeper.events.' || current_schema(), 0))

-- name: SEQUENCE_EVENTS
-- Numbering the committed events: nothing to do here (no row).
WITH todo AS MATERIALIZED (
    SELECT seq FROM events WHERE id IS NULL ORDER BY seq LIMIT %(limit)s),
numbered AS MATERIALIZED (
    SELECT t.seq, nextval('events_order') AS id FROM (SELECT seq FROM todo ORDER BY seq) AS t)
UPDATE events AS e SET id = n.id FROM numbered AS n WHERE e.seq = n.seq AND e.id IS NULL
RETURNING e.id

-- name: LIST_EVENTS
-- (the system's runs' events only when asked: ``%(below)s`` is ``SYSTEM_RUNS`` or above every id)
SELECT id, at, run_id, kind, task, attempt, data::text FROM events WHERE id > %(after)s
    AND coalesce(run_id, 0) < %(below)s ORDER BY id LIMIT %(limit)s

-- name: LIST_RUN_EVENTS
-- A run's events after :after, in order.
SELECT id, at, run_id, kind, task, attempt, data::text FROM events WHERE run_id = %(run_id)s
    AND id > %(after)s ORDER BY id LIMIT %(limit)s

-- name: LAST_EVENT
-- the newest numbered event's id (0: none yet), read after a numbering (the partial index)
SELECT coalesce(max(id), 0) FROM events WHERE id IS NOT NULL

-- name: EVENTS_MARK
-- what moves when an event commits, without numbering (no write): -1 while a committed event
-- waits for its number (the partial index ``events_unnumbered``), else the newest number
SELECT CASE WHEN EXISTS (SELECT 1 FROM events WHERE id IS NULL) THEN -1
    ELSE (SELECT coalesce(max(id), 0) FROM events WHERE id IS NOT NULL) END

-- name: CONSUMER_AT
-- Where a named consumer stands (the last event it acknowledged).
SELECT position FROM event_consumers WHERE name = %(name)s

-- name: ACK_EVENTS
-- a consumer acknowledged every event up to %(upto)s (its cursor never moves back)
INSERT INTO event_consumers AS c (name, position, updated_at)
    VALUES (%(name)s, %(upto)s,
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8))
    ON CONFLICT (name) DO UPDATE SET position = greatest(c.position, excluded.position),
        updated_at = excluded.updated_at
    RETURNING c.position

-- name: DROP_CONSUMER
-- A named consumer goes (its position no longer holds events back).
DELETE FROM event_consumers WHERE name = %(name)s RETURNING name

-- name: PRUNE_EVENTS
-- retention: numbered events older than the cutoff that every named consumer and every webhook
-- (its position, B20) has passed (or all of them, forced), but never the newest (as on
-- SQLite), a bounded batch per transaction
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
DELETE FROM events WHERE id IN (
    SELECT id FROM events, clock WHERE id IS NOT NULL AND at < clock.now - %(age)s
      AND id < (SELECT max(id) FROM events)
      AND (%(force)s OR id <= coalesce((SELECT min(position) FROM event_consumers), id))
      AND (%(force)s OR id <= coalesce((SELECT min(position) FROM webhooks), id))
    ORDER BY id LIMIT %(limit)s) RETURNING id
