-- The SQLite backend's outbox (B18): the events table, its reads, named consumers and their
-- retention. The single writer hands out ids in commit order as it writes them (one past the
-- largest in the table: ``PRUNE_EVENTS`` never deletes the newest event, so an id is never
-- given twice; ``AUTOINCREMENT`` would cost a write of its own per event), so numbering
-- (``LOCK_EVENTS``, ``SEQUENCE_EVENTS``) has nothing to do here.

-- name: INSERT_EVENT
-- one event of a transition, in its transaction (``steps.insert_events`` sends each one, its
-- values in this order: positional binding is the cheaper kind on the hot path)
INSERT INTO events (at, run_id, kind, task, attempt, data)
    VALUES (?, ?, ?, ?, ?, ?)

-- name: TAKEN_FROM
-- a takeover: who held the lease before, and its attempt (the lease it replaced in place)
SELECT prev_owner, prev_attempts FROM leases WHERE run_id = :run_id AND task_id = :task_id

-- name: LOCK_EVENTS
-- numbering: nothing to do (ids are commit-ordered already)
SELECT 1

-- name: SEQUENCE_EVENTS
-- Numbering the committed events: nothing to do here (no row).
SELECT 0 WHERE 0

-- name: LIST_EVENTS
-- (the system's runs' events only when asked: ``:below`` is ``SYSTEM_RUNS`` or above every id)
SELECT id, at, run_id, kind, task, attempt, data FROM events WHERE id > :after
    AND coalesce(run_id, 0) < :below ORDER BY id LIMIT :limit

-- name: LIST_RUN_EVENTS
-- A run's events after :after, in order.
SELECT id, at, run_id, kind, task, attempt, data FROM events WHERE run_id = :run_id AND id > :after
    ORDER BY id LIMIT :limit

-- name: LAST_EVENT
-- the newest event's id (0: none yet): where a follower that wants only new events starts
SELECT coalesce(max(id), 0) FROM events

-- name: EVENTS_MARK
-- what moves when an event commits (the newest id: SQLite numbers events as they commit), read
-- by the webhooks' waker before it looks again (``Events.events_mark``)
SELECT coalesce(max(id), 0) FROM events

-- name: CONSUMER_AT
-- Where a named consumer stands (the last event it acknowledged).
SELECT position FROM event_consumers WHERE name = :name

-- name: ACK_EVENTS
-- a consumer acknowledged every event up to :upto (its cursor never moves back)
INSERT INTO event_consumers (name, position, updated_at) VALUES (:name, :upto, :now)
    ON CONFLICT (name) DO UPDATE SET position = max(position, excluded.position),
        updated_at = excluded.updated_at
    RETURNING position

-- name: DROP_CONSUMER
-- A named consumer goes (its position no longer holds events back).
DELETE FROM event_consumers WHERE name = :name

-- name: PRUNE_EVENTS
-- retention: events older than the cutoff that every named consumer and every webhook (its
-- position, B20) has passed (or all of them, forced), but never the newest (the next id counts
-- on from it), a bounded batch per transaction
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE at < :now - :age AND id < (SELECT max(id) FROM events)
      AND (:force OR id <= coalesce((SELECT min(position) FROM event_consumers), id))
      AND (:force OR id <= coalesce((SELECT min(position) FROM webhooks), id))
    ORDER BY id LIMIT :limit)
