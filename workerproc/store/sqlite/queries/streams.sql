-- SQLite's statements for runs' streams (docs/protocol.md B21): the chunks a step's handler
-- emits, written in batches under its lease, read by anyone while the run goes on.
--
-- A run's stream head (``stream_heads``) numbers its chunks and says who wrote last; a write
-- takes it first (SQLite's write transaction holds the database's write lock already). A
-- batch is one row of ``stream_batches``: a reader takes its chunks out of it.

-- name: STREAM_HEAD
-- the run's stream head: made at its first write (the run must exist), else the one there
INSERT INTO stream_heads (run_id, last, task_id, attempt, bytes)
    SELECT :run_id, 0, :task_id, :attempt, 0 FROM runs WHERE id = :run_id
    ON CONFLICT (run_id) DO UPDATE SET last = stream_heads.last
    RETURNING last, task_id, attempt, bytes

-- name: STREAM_FENCE
-- does this attempt hold the live lease of its step (R2)? Its run's status, if so
SELECT r.status FROM leases AS l JOIN runs AS r ON r.id = l.run_id
    WHERE l.run_id = :run_id AND l.task_id = :task_id AND l.owner = :owner
      AND l.attempts = :attempt AND l.expires_at > :now

-- name: STREAM_APPEND
-- the batch, one row: its chunks numbered :first to :last (``chunks``: a JSON array of
-- [kind, data]); written by the steps ``STREAM_MOVE`` and ``STREAM_MOVED``, before the head
-- moves (``sqlite.steps``)
INSERT INTO stream_batches (run_id, first, last, task_id, attempt, at, chunks)
    VALUES (:run_id, :first, :last, :task_id, :attempt, :now, :chunks)

-- name: STREAM_MOVE
-- the head after a write: its last offset, its writer, the bytes of the run's chunks
UPDATE stream_heads SET last = :last, task_id = :task_id, attempt = :attempt,
        bytes = bytes + :bytes
    WHERE run_id = :run_id

-- name: STREAM_MOVED
-- the same, in a worker's exchange (``STREAM_MOVE`` on PostgreSQL asks its own transaction not
-- to wait for the disk; here the connection's ``synchronous`` says so for every statement)
UPDATE stream_heads SET last = :last, task_id = :task_id, attempt = :attempt,
        bytes = bytes + :bytes
    WHERE run_id = :run_id

-- name: STREAM_READ
-- the batches that hold a run's chunks :after + 1 to :after + :limit, in order (a batch holds
-- at most ``MAX_BATCH`` + 1 chunks, so the one with :after + 1 begins after :since)
SELECT first, attempt, task_id, chunks, at FROM stream_batches
    WHERE run_id = :run_id AND first > :since AND first <= :after + :limit AND last > :after
    ORDER BY first

-- name: STREAM_STATUS
-- the run's status, read (never locked) before a follower's read of its chunks
SELECT status FROM runs WHERE id = :run_id

-- name: STREAM_STEP
-- what a step's earlier attempts wrote, their batches in order (``ctx.emitted``)
SELECT attempt, chunks FROM stream_batches
    WHERE run_id = :run_id AND task_id = :task_id AND attempt < :attempt ORDER BY first

-- name: STREAM_EXPIRED
-- succeeded runs whose stream outlived the ``stream_ttl`` of the task that wrote it last
SELECT h.run_id FROM stream_heads AS h JOIN runs AS r ON r.id = h.run_id
    JOIN tasks AS t ON t.id = h.task_id JOIN task_options AS o ON o.name = t.name
    WHERE r.status = 'succeeded'
      AND json_extract(o.options, '$.stream_ttl') IS NOT NULL
      AND r.finished_at + json_extract(o.options, '$.stream_ttl') < :now
    LIMIT :limit

-- name: STREAM_DROP
-- a run's stream dropped (it outlived its ``stream_ttl``): its head, and its batches with it
DELETE FROM stream_heads WHERE run_id = :run_id
