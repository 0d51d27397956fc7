-- SQLite's statements for webhooks (``protocol/webhooks.py``, docs/protocol.md
-- B20), and the table's migrations. A webhook's row holds what an operator declared and where its
-- delivery stands (its position, moved by the delivery's fenced ``WEBHOOK_MOVE``); its delivery
-- run's state holds the rest of its record.

-- name: WEBHOOK_ROWS
-- Every webhook, by name.
SELECT name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at, position, delivered, delivered_at, in_flight FROM webhooks ORDER BY name

-- name: WEBHOOK_ROW
-- One webhook by its name.
SELECT name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at, position, delivered, delivered_at, in_flight FROM webhooks WHERE name = :name

-- name: WEBHOOK_ADD
-- a new webhook (a name already there: nothing, and the caller is told)
INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
        backoff_max, timeout, created_at, position, in_flight)
    VALUES (:name, :url, :kinds, :secret, :run_id, :max_failures, :backoff, :backoff_max,
            :timeout, :now, :position, :in_flight)
    ON CONFLICT (name) DO NOTHING RETURNING name

-- name: WEBHOOK_MOVE
-- a delivery moves its webhook's position past what its receiver acknowledged (and counts the
-- POSTs, as the position moves: sent again, it changes nothing): one small row, under the fence
-- of the delivery's lease (R2), so a zombie moves nothing; never backwards
UPDATE webhooks SET position = max(position, :position),
        delivered = delivered + CASE WHEN :position > position THEN :delivered ELSE 0 END,
        delivered_at = CASE WHEN :position > position AND :delivered > 0 THEN :now
                            ELSE delivered_at END
    WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM leases WHERE run_id = :run_id
        AND task_id = :task_id AND owner = :owner AND attempts = :attempt AND expires_at > :now)
    RETURNING position

-- name: WEBHOOK_BACKLOG
-- a webhook's backlog: the users' events after its position, by kind (the caller keeps the
-- kinds it wants), counted up to :limit
SELECT kind, count(*) FROM (SELECT kind FROM events
        WHERE id > :after AND coalesce(run_id, 0) < 1000000000000000 ORDER BY id LIMIT :limit)
    GROUP BY kind

-- name: WEBHOOK_DUE
-- when a delivery run's next task is due (its first pending one: a backoff's next try), and
-- whether a delivery is in flight (its task leased, or its lease expired: to be taken over)
SELECT r.head_at, r.status IN ('pending', 'running') AND EXISTS (
        SELECT 1 FROM leases AS l WHERE l.run_id = r.id AND l.owner IS NOT NULL)
    FROM runs AS r WHERE r.id = :run_id

-- name: WEBHOOK_PARKED
-- what a delivery run waits for now (the write lock held: no second waker signals it too)
SELECT wait_for FROM runs WHERE id = :run_id AND status = 'pending'

-- name: WEBHOOK_SIGNALS_DONE
-- a parked delivery run's delivered wake signals (each resumed a task that is done) but the
-- newest: gone, so a delivery run that lives for years keeps no row per wake (the newest stays,
-- so no id is ever given again: a done task's signal_id keeps naming its own)
DELETE FROM signals WHERE run_id = :run_id AND task_id IS NOT NULL
    AND id < (SELECT max(id) FROM signals WHERE run_id = :run_id)

-- name: WEBHOOK_DROP
-- A webhook goes; its delivery run's id is answered (the caller cancels that run).
DELETE FROM webhooks WHERE name = :name RETURNING run_id
