-- PostgreSQL's statements for webhooks (``protocol/webhooks.py``,
-- docs/protocol.md B20), and the table's migrations. A webhook's row holds what an operator
-- declared and where its delivery stands (its position, moved by the delivery's fenced
-- ``WEBHOOK_MOVE``); its delivery run's state holds the rest of its record.

-- name: WEBHOOK_ROWS
-- Every webhook, by name.
SELECT name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at, position, delivered, delivered_at, in_flight FROM webhooks ORDER BY name

-- name: WEBHOOK_ROW
-- One webhook by its name.
SELECT name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout,
    created_at, position, delivered, delivered_at, in_flight FROM webhooks WHERE name = %(name)s

-- name: WEBHOOK_ADD
-- a new webhook (a name already there: nothing, and the caller is told)
INSERT INTO webhooks (name, url, kinds, secret, run_id, max_failures, backoff,
        backoff_max, timeout, created_at, position, in_flight)
    VALUES (%(name)s, %(url)s, %(kinds)s, %(secret)s, %(run_id)s, %(max_failures)s,
            %(backoff)s, %(backoff_max)s, %(timeout)s,
                coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8),
                    %(position)s, %(in_flight)s)
    ON CONFLICT (name) DO NOTHING RETURNING name

-- name: WEBHOOK_MOVE
-- a delivery moves its webhook's position past what its receiver acknowledged (and counts the
-- POSTs, as the position moves: sent again, it changes nothing): one small row (a HOT update),
-- under the fence of the delivery's lease (R2), so a zombie moves nothing; never backwards.
-- One statement on its own (no BEGIN, no COMMIT round trip). Its run is not locked: "now" is
-- read after the statement's snapshot, so a takeover it cannot see came after a moment its
-- lease was live at, and what it records (POSTs acknowledged under that lease) stays true. Its
-- commit does not wait for the WAL to reach the disk (``synchronous_commit`` off for this
-- transaction): a crash of the server may undo the newest moves, and those events are sent
-- again.
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8) AS now),
lazy AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
UPDATE webhooks AS w SET position = greatest(w.position, %(position)s),
    delivered = w.delivered + CASE WHEN %(position)s > w.position THEN %(delivered)s ELSE 0 END,
    delivered_at = CASE WHEN %(position)s > w.position AND %(delivered)s > 0 THEN clock.now
                        ELSE w.delivered_at END
FROM clock, lazy
WHERE w.run_id = %(run_id)s AND EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = %(run_id)s AND l.task_id = %(task_id)s AND l.owner = %(owner)s
    AND l.attempts = %(attempt)s AND l.expires_at > clock.now)
RETURNING w.position

-- name: WEBHOOK_BACKLOG
-- a webhook's backlog: the users' numbered events after its position, by kind (the caller
-- keeps the kinds it wants), counted up to %(limit)s
SELECT kind, count(*) FROM (SELECT kind FROM events
        WHERE id > %(after)s AND coalesce(run_id, 0) < 1000000000000000 ORDER BY id
        LIMIT %(limit)s) AS behind
    GROUP BY kind

-- name: WEBHOOK_DUE
-- when a delivery run's next task is due (its first pending one: a backoff's next try), and
-- whether a delivery is in flight (its task leased, or its lease expired: to be taken over)
SELECT r.head_at, r.status = 'pending' AND EXISTS (
        SELECT 1 FROM leases AS l JOIN tasks AS t ON t.id = l.task_id
        WHERE l.run_id = r.id AND l.owner IS NOT NULL AND t.done_at IS NULL)
    FROM runs AS r WHERE r.id = %(run_id)s

-- name: WEBHOOK_PARKED
-- what a delivery run waits for now, its row locked (a second waker waits, then finds it woken)
SELECT wait_for FROM runs WHERE id = %(run_id)s AND status = 'pending'
    FOR UPDATE

-- name: WEBHOOK_SIGNALS_DONE
-- a parked delivery run's delivered wake signals (each resumed a task that is done) but the
-- newest: gone, so a delivery run that lives for years keeps no row per wake
DELETE FROM signals WHERE run_id = %(run_id)s
    AND task_id IS NOT NULL AND id < (SELECT max(id) FROM signals WHERE run_id = %(run_id)s)

-- name: WEBHOOK_DROP
-- A webhook goes; its delivery run's id is answered (the caller cancels that run).
DELETE FROM webhooks WHERE name = %(name)s RETURNING run_id
