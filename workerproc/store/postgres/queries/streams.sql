-- PostgreSQL's statements for runs' streams (docs/protocol.md B21): the chunks a step's
-- handler emits, written in batches under its lease, read by anyone while the run goes on.
--
-- A run's stream head (``stream_heads``) numbers its chunks and says who wrote last; a write
-- locks it first, then asks the fence, so two writes of one run go one after the other and a
-- takeover that committed before the head was locked is seen by the fence. A batch is one
-- row of ``stream_batches``: a reader takes its chunks out of it.

-- name: STREAM_HEAD
-- the run's stream head, locked: made at its first write (the run must exist), else the one
-- there
INSERT INTO stream_heads (run_id, last, task_id, attempt, bytes)
    SELECT %(run_id)s, 0, %(task_id)s, %(attempt)s, 0 FROM runs WHERE id = %(run_id)s
    ON CONFLICT (run_id) DO UPDATE SET last = stream_heads.last
    RETURNING last, task_id, attempt, bytes

-- name: STREAM_FENCE
-- does this attempt hold the live lease of its step (R2)? Its run's status, if so
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now)
SELECT r.status FROM clock, leases AS l JOIN runs AS r ON r.id = l.run_id
    WHERE l.task_id = %(task_id)s AND l.run_id = %(run_id)s AND l.owner = %(owner)s
      AND l.attempts = %(attempt)s AND l.expires_at > clock.now

-- name: STREAM_MOVE
-- the batch, one row (its chunks numbered first to last; ``chunks``: a JSON array of
-- [kind, data]), and the head after it: its last offset, its writer, the bytes of the run's
-- chunks; and the followers are told (the schema's stream channel). One statement: the head
-- is locked already (``STREAM_HEAD``), the batch and the head touch no row of each other.
-- Its commit does not wait for the WAL to reach the disk (``synchronous_commit`` off for this
-- transaction): the WAL is written in order, so the step's own commit, which does wait, makes
-- every batch before it durable too
WITH lazy AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),
added AS (
    INSERT INTO stream_batches (run_id, first, last, task_id, attempt, at, chunks)
    VALUES (%(run_id)s, %(first)s, %(last)s, %(task_id)s, %(attempt)s,
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
        %(chunks)s::json)),
moved AS (
    UPDATE stream_heads SET last = %(last)s, task_id = %(task_id)s, attempt = %(attempt)s,
        bytes = bytes + %(bytes)s
    WHERE run_id = %(run_id)s RETURNING run_id)
SELECT pg_notify('leasekeeper.' || current_schema() || '.stream', '') FROM moved, lazy

-- name: STREAM_MOVED
-- the same, for a batch written in a worker's exchange (``commit_many``'s ``streams``), whose
-- commit waits for the disk as always: no ``synchronous_commit`` of its own
WITH added AS (
    INSERT INTO stream_batches (run_id, first, last, task_id, attempt, at, chunks)
    VALUES (%(run_id)s, %(first)s, %(last)s, %(task_id)s, %(attempt)s,
        coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
        %(chunks)s::json)),
moved AS (
    UPDATE stream_heads SET last = %(last)s, task_id = %(task_id)s, attempt = %(attempt)s,
        bytes = bytes + %(bytes)s
    WHERE run_id = %(run_id)s RETURNING run_id)
SELECT pg_notify('leasekeeper.' || current_schema() || '.stream', '') FROM moved

-- name: STREAM_READ
-- the batches that hold a run's chunks after + 1 to after + limit, in order (a batch holds at
-- most ``MAX_BATCH`` + 1 chunks, so the one with after + 1 begins after since)
SELECT first, attempt, task_id, chunks::text, at FROM stream_batches
    WHERE run_id = %(run_id)s AND first > %(since)s
      AND first <= %(after)s::bigint + %(limit)s::bigint AND last > %(after)s
    ORDER BY first

-- name: STREAM_STATUS
-- the run's status, read (never locked) before a follower's read of its chunks
SELECT status FROM runs WHERE id = %(run_id)s

-- name: STREAM_STEP
-- what a step's earlier attempts wrote, their batches in order (``ctx.emitted``)
SELECT attempt, chunks::text FROM stream_batches
    WHERE run_id = %(run_id)s AND task_id = %(task_id)s AND attempt < %(attempt)s
    ORDER BY first

-- name: STREAM_EXPIRED
-- succeeded runs whose stream outlived the ``stream_ttl`` of the task that wrote it last
SELECT h.run_id FROM stream_heads AS h JOIN runs AS r ON r.id = h.run_id
    JOIN tasks AS t ON t.id = h.task_id JOIN task_options AS o ON o.name = t.name
    WHERE r.status = 'succeeded' AND (o.options ->> 'stream_ttl') IS NOT NULL
      AND r.finished_at + (o.options ->> 'stream_ttl')::float8
          < coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)
    LIMIT %(limit)s

-- name: STREAM_DROP
-- a run's stream dropped (it outlived its ``stream_ttl``): its head, and its batches with it
DELETE FROM stream_heads WHERE run_id = %(run_id)s
