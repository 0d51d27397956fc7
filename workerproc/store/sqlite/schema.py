"""SQLite schema and its forward migrations: SQLite's SQL for each step of the shared history
(``store/migrations.py``: the step numbers are SQLite's own, unchanged). Version lives in
``PRAGMA user_version``.

Invariants live here, not in Python: CHECK constraints for statuses and lease fields, and
triggers that keep each run's head columns exact. The head is the run's first pending task in
claim order (R1: ``available_at``, ``created_at``, ``id``); ``head_at``/``head_created``/``head_id``
copy its key, NULL when the run is terminal or has no pending task. Claims walk runs in head
order, so a run with 100,000 tasks behind one live lease costs a claim one index entry, not
100,000, and the first claimable head is exactly the task R1 orders first (a takeover keeps its
place by ``available_at``). ``ready_at`` is the earliest moment a claim may pick the run: the
later of ``head_at`` and the expiry of any lease on it (idle workers sleep until the minimum).
"""

from __future__ import annotations

from ..migrations import steps
from .calls_sql import MIGRATION_INTENTS, PAID_CALLS_SCHEMA
from .events_sql import EVENTS_SCHEMA
from .gates_sql import GATES_IDLE, GATES_READY_ORDER
from .leases_sql import MIGRATION_LEASES, MIGRATION_TASK_LEASE_COLUMNS
from .schedules_sql import MIGRATION as _SCHEDULES
from .streams_sql import BATCHES_SCHEMA, STREAMS_SCHEMA
from .waits_sql import MIGRATION_PARENT_JOIN, MIGRATION_WAITS
from .webhooks_sql import MIGRATION as _WEBHOOKS
from .webhooks_sql import MIGRATION_IN_FLIGHT, MIGRATION_POSITIONS

_HEAD_AND_READY = """(head_at, head_created, head_id, ready_at) = (
        SELECT h.available_at, h.created_at, h.id,
               max(h.available_at, coalesce(l.until, h.available_at))
        FROM (SELECT available_at, created_at, id FROM tasks
              WHERE run_id = runs.id AND done_at IS NULL
              ORDER BY available_at, created_at, id LIMIT 1) AS h,
             (SELECT max(lease_expires_at) AS until FROM tasks
              WHERE run_id = runs.id AND done_at IS NULL AND lease_owner IS NOT NULL) AS l
        WHERE runs.status IN ('pending', 'running'))"""

_READY_AT = f"""
    UPDATE runs SET {_HEAD_AND_READY}
    WHERE id = {{run}};
"""

# v3: the same, and a run whose task just got a live lease is 'running' (so a claim needs no
# second UPDATE of the run; since v9 'running' is read from the leases, never written)
_READY_AT_V3 = f"""
    UPDATE runs SET {_HEAD_AND_READY},
        status = CASE WHEN runs.status = 'pending' AND NEW.lease_owner IS NOT NULL
                      AND NEW.done_at IS NULL THEN 'running' ELSE runs.status END
    WHERE id = NEW.run_id;
"""

# v11 (limits): a run whose first pending task waits behind a limit is in its gate's line, not
# in the claim index: its head time is ``line_at`` (``head_at`` and ``ready_at`` stay NULL, so
# no ungated claim and no idle worker's wake-up ever reads it) and ``line`` names the gate
_HEAD_LINE_AND_READY = """(head_at, line_at, head_created, head_id, ready_at, line) = (
        SELECT CASE WHEN h.line IS NULL THEN h.available_at END,
               CASE WHEN h.line IS NOT NULL THEN h.available_at END, h.created_at, h.id,
               CASE WHEN h.line IS NULL
                    THEN max(h.available_at, coalesce(l.until, h.available_at)) END,
               h.line
        FROM (SELECT available_at, created_at, id, line FROM tasks
              WHERE run_id = runs.id AND done_at IS NULL
              ORDER BY available_at, created_at, id LIMIT 1) AS h,
             (SELECT max(lease_expires_at) AS until FROM tasks
              WHERE run_id = runs.id AND done_at IS NULL AND lease_owner IS NOT NULL) AS l
        WHERE runs.status IN ('pending', 'running'))"""
_PLACED = f"""
    UPDATE runs SET {_HEAD_LINE_AND_READY}
    WHERE id = {{run}};
"""

# a lease granted or extended on a pending task, nothing else moved: the head stays (v7)
_EXTENDED = """NEW.lease_owner IS NOT NULL AND NEW.done_at IS NULL AND OLD.done_at IS NULL
        AND NEW.available_at = OLD.available_at
        AND NEW.lease_expires_at >= coalesce(OLD.lease_expires_at, NEW.lease_expires_at)"""

_SQL: dict[str, str] = {
    # 1: runs, tasks, the claim indexes and the ready_at triggers
    "runs_and_tasks": f"""
    CREATE TABLE runs (
        id             INTEGER PRIMARY KEY,
        status         TEXT    NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
        state          TEXT    NOT NULL DEFAULT 'null' CHECK (json_valid(state)),
        revision       INTEGER NOT NULL DEFAULT 0 CHECK (revision >= 0),
        result         TEXT    CHECK (result IS NULL OR json_valid(result)),
        failure_reason TEXT,
        last_error     TEXT,
        ready_at       REAL,
        head_at        REAL,
        head_created   REAL,
        head_id        INTEGER,
        created_at     REAL    NOT NULL,
        updated_at     REAL    NOT NULL,
        finished_at    REAL,
        CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
        CHECK ((status = 'failed') = (failure_reason IS NOT NULL))
    );
    CREATE TABLE tasks (
        id               INTEGER PRIMARY KEY,
        run_id           INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        name             TEXT    NOT NULL CHECK (length(name) > 0),
        payload          TEXT    NOT NULL DEFAULT 'null' CHECK (json_valid(payload)),
        available_at     REAL    NOT NULL,
        created_at       REAL    NOT NULL,
        lease_owner      TEXT,
        lease_expires_at REAL,
        attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        attempt_base     INTEGER NOT NULL DEFAULT 0 CHECK (attempt_base BETWEEN 0 AND attempts),
        last_error       TEXT,
        done_at          REAL,
        CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
        CHECK (done_at IS NULL OR lease_owner IS NULL)
    );
    -- claims: runs in head (R1) order; next_ready_at: min(ready_at). Only pending work is indexed
    CREATE INDEX runs_head ON runs (head_at, head_created, head_id) WHERE head_at IS NOT NULL;
    CREATE INDEX runs_ready ON runs (ready_at, id) WHERE ready_at IS NOT NULL;
    CREATE INDEX runs_status ON runs (status, id);
    -- a run's pending tasks in claim order; min(available_at) for ready_at
    CREATE INDEX tasks_pending ON tasks (run_id, available_at, created_at, id)
        WHERE done_at IS NULL;
    -- live-lease checks and release_owner (few rows: one per busy worker)
    CREATE INDEX tasks_leased ON tasks (run_id, lease_expires_at) WHERE lease_owner IS NOT NULL;
    CREATE INDEX tasks_owner ON tasks (lease_owner) WHERE lease_owner IS NOT NULL;
    CREATE INDEX tasks_run ON tasks (run_id, id);

    CREATE TRIGGER tasks_ready_insert AFTER INSERT ON tasks BEGIN
        {_READY_AT.format(run="NEW.run_id")}
    END;
    CREATE TRIGGER tasks_ready_update
        AFTER UPDATE OF available_at, lease_owner, lease_expires_at, done_at ON tasks BEGIN
        {_READY_AT.format(run="NEW.run_id")}
    END;
    CREATE TRIGGER runs_ready_status AFTER UPDATE OF status ON runs
        WHEN (OLD.status IN ('pending', 'running'))
          != (NEW.status IN ('pending', 'running')) BEGIN
        {_READY_AT.format(run="NEW.id")}
    END;
    """,
    # 2: evidence for operators and chaos mode, read straight from the database: when each
    # task was last claimed, which attempt committed it, and every write the fence refused.
    "evidence": """
    ALTER TABLE tasks ADD COLUMN claimed_at REAL;
    ALTER TABLE tasks ADD COLUMN done_attempt INTEGER;
    CREATE TABLE fence_rejections (
        id       INTEGER PRIMARY KEY,
        at       REAL    NOT NULL,
        task_id  INTEGER NOT NULL,
        run_id   INTEGER NOT NULL,
        owner    TEXT    NOT NULL,
        attempt  INTEGER NOT NULL,
        op       TEXT    NOT NULL
    );
    CREATE INDEX fence_rejections_task ON fence_rejections (task_id, attempt);
    """,
    # 3: fewer writes per task (the per-task write transaction is the throughput limit). A task
    # of a finished run no longer recomputes the run's claim columns (the status change cleared
    # them); a claim marks its run running in the same trigger; release_owner and the lease
    # list walk the small partial index of leased tasks, so tasks_owner goes.
    "fewer_trigger_writes": f"""
    DROP INDEX tasks_owner;
    DROP TRIGGER tasks_ready_update;
    CREATE TRIGGER tasks_ready_update
        AFTER UPDATE OF available_at, lease_owner, lease_expires_at, done_at ON tasks
        WHEN (SELECT status FROM runs WHERE id = NEW.run_id) IN ('pending', 'running') BEGIN
        {_READY_AT_V3}
    END;
    """,
    # 4: a claim keeps who held the task before (set only when that lease was still on it:
    # expired, or released as dead), so a worker knows it took the task over.
    "prev_owner": """
    ALTER TABLE tasks ADD COLUMN prev_owner TEXT;
    """,
    # 5: queues, priorities and idempotency keys (the producer side). A run belongs to one
    # queue and has a priority; claims walk each served queue's runs by priority (highest
    # first), then in head order, so the claim index leads with both. A run's key is unique
    # while the run exists: a second start with the same key finds the first run.
    "queues_priorities_keys": """
    ALTER TABLE runs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'
        CHECK (length(queue) BETWEEN 1 AND 64);
    ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
        CHECK (priority BETWEEN -1000 AND 1000);
    ALTER TABLE runs ADD COLUMN key TEXT CHECK (key IS NULL OR length(key) BETWEEN 1 AND 255);
    CREATE UNIQUE INDEX runs_key ON runs (key) WHERE key IS NOT NULL;
    DROP INDEX runs_head;
    CREATE INDEX runs_claim ON runs (queue, priority DESC, head_at, head_created, head_id)
        WHERE head_at IS NOT NULL;
    DROP INDEX runs_ready;
    CREATE INDEX runs_ready ON runs (queue, ready_at) WHERE ready_at IS NOT NULL;
    """,
    # 6: what operators read (the dashboard). runs.task names a run's first task, set once by
    # start_run and indexed for the runs filter (its value never changes, so only the insert
    # writes that index). tasks.done_owner keeps who committed, set by the UPDATE that already
    # marks a task done. task_attempts keeps every attempt that ended without a commit: the
    # store writes a row on a release, a failure and an exhausted claim; the trigger writes one
    # on a takeover. Its WHEN is false for the claim of an unowned task, so the happy path
    # (claim, commit) gains no statement and no index write.
    "dashboard_and_attempts": """
    ALTER TABLE runs ADD COLUMN task TEXT;
    UPDATE runs SET task = (SELECT name FROM tasks WHERE run_id = runs.id ORDER BY id LIMIT 1);
    CREATE INDEX runs_task ON runs (task, id);
    ALTER TABLE tasks ADD COLUMN done_owner TEXT;
    CREATE TABLE task_attempts (
        id          INTEGER PRIMARY KEY,
        run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        task_id     INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        owner       TEXT    NOT NULL,
        claimed_at  REAL,
        ended_at    REAL,
        outcome     TEXT    NOT NULL
                    CHECK (outcome IN ('released', 'failed', 'taken_over', 'exhausted')),
        error       TEXT,
        taken_by    TEXT
    );
    CREATE INDEX task_attempts_run ON task_attempts (run_id, task_id, attempt);
    -- a claim of a task whose lease was still on it (expired, or released as dead): the
    -- previous attempt was taken over; it held from its claim until its lease ran out
    CREATE TRIGGER tasks_takeover AFTER UPDATE OF attempts ON tasks
        WHEN OLD.lease_owner IS NOT NULL AND NEW.attempts > OLD.attempts BEGIN
        INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at, ended_at,
                                   outcome, taken_by)
        VALUES (NEW.run_id, NEW.id, OLD.attempts, OLD.lease_owner, OLD.claimed_at,
                OLD.lease_expires_at, 'taken_over', NEW.lease_owner);
    END;
    """,
    # 7: cheaper triggers on the per-task path (it is the throughput limit). A lease granted or
    # extended on a pending task (a claim, a renewal) leaves the run's head where it is: the
    # run is running and ready no sooner than the new expiry, with no recompute. A run that
    # ends with its claim columns already cleared (a finish clears them itself) needs none.
    "cheaper_lease_triggers": f"""
    DROP TRIGGER tasks_ready_update;
    CREATE TRIGGER tasks_lease_extended AFTER UPDATE OF lease_owner, lease_expires_at ON tasks
        WHEN {_EXTENDED} BEGIN
        UPDATE runs SET ready_at = max(coalesce(ready_at, NEW.lease_expires_at),
                                       NEW.lease_expires_at),
            status = CASE WHEN status = 'pending' THEN 'running' ELSE status END
        WHERE id = NEW.run_id AND status IN ('pending', 'running');
    END;
    CREATE TRIGGER tasks_ready_update
        AFTER UPDATE OF available_at, lease_owner, lease_expires_at, done_at ON tasks
        WHEN NOT ({_EXTENDED})
         AND (SELECT status FROM runs WHERE id = NEW.run_id) IN ('pending', 'running') BEGIN
        {_READY_AT_V3}
    END;
    DROP TRIGGER runs_ready_status;
    CREATE TRIGGER runs_ready_status AFTER UPDATE OF status ON runs
        WHEN (OLD.status IN ('pending', 'running')) != (NEW.status IN ('pending', 'running'))
         AND NOT (NEW.status NOT IN ('pending', 'running') AND NEW.head_at IS NULL
                  AND NEW.ready_at IS NULL) BEGIN
        {_READY_AT.format(run="NEW.id")}
    END;
    """,
    # 8: run ids are never given out twice. SQLite numbers a new row one past the largest id
    # in the table, so a prune that removed the newest runs would hand their ids out again (a
    # caller still holding one would wait on somebody else's run). run_ids keeps the highest id
    # a deleted run had (a trigger, whatever deletes it); start_run numbers a new run one past
    # the higher of the two: two lookups of one row each.
    "run_ids_never_reused": """
    CREATE TABLE run_ids (high INTEGER NOT NULL);
    INSERT INTO run_ids (high) SELECT coalesce(max(id), 0) FROM runs;
    CREATE TRIGGER runs_keep_high_id AFTER DELETE ON runs
        WHEN OLD.id > (SELECT high FROM run_ids) BEGIN
        UPDATE run_ids SET high = OLD.id;
    END;
    """,
    # 9: a run is 'running' while a live lease holds it, read from its tasks, never
    # written (a hand-back or an expiry needs no write to the run, and cannot leave a run
    # 'running' with nothing leased); finished runs are counted as they end (run_totals:
    # stats() reads no finished run); the worker processes of every host are listed (workers).
    "running_from_leases": f"""
    DROP TRIGGER tasks_lease_extended;
    CREATE TRIGGER tasks_lease_extended AFTER UPDATE OF lease_owner, lease_expires_at ON tasks
        WHEN {_EXTENDED} BEGIN
        UPDATE runs SET ready_at = max(coalesce(ready_at, NEW.lease_expires_at),
                                       NEW.lease_expires_at)
        WHERE id = NEW.run_id AND status IN ('pending', 'running');
    END;
    DROP TRIGGER tasks_ready_update;
    CREATE TRIGGER tasks_ready_update
        AFTER UPDATE OF available_at, lease_owner, lease_expires_at, done_at ON tasks
        WHEN NOT ({_EXTENDED})
         AND (SELECT status FROM runs WHERE id = NEW.run_id) IN ('pending', 'running') BEGIN
        {_READY_AT.format(run="NEW.run_id")}
    END;
    UPDATE runs SET status = 'pending' WHERE status = 'running';

    CREATE TABLE run_totals (
        queue  TEXT    NOT NULL,
        status TEXT    NOT NULL CHECK (status IN ('succeeded', 'failed', 'cancelled')),
        shard  INTEGER NOT NULL,
        n      INTEGER NOT NULL,
        PRIMARY KEY (queue, status, shard)
    ) WITHOUT ROWID;
    INSERT INTO run_totals (queue, status, shard, n)
        SELECT queue, status, 0, count(*) FROM runs
        WHERE status IN ('succeeded', 'failed', 'cancelled') GROUP BY queue, status;

    CREATE TABLE workers (
        owner        TEXT    PRIMARY KEY,
        host         TEXT    NOT NULL,
        pid          INTEGER NOT NULL,
        started_at   REAL    NOT NULL,
        heartbeat_at REAL    NOT NULL,
        beat_every   REAL    NOT NULL,   -- its heartbeat's period
        slots        INTEGER NOT NULL,
        queues       TEXT,               -- a JSON array; NULL: every queue
        version      TEXT    NOT NULL,
        state        TEXT    NOT NULL DEFAULT 'running'
    ) WITHOUT ROWID;
    """,
    # 10: per-task options (B11): what ``@app.task(max_attempts=..., ...)`` declares, by task
    # name, written by each worker as it starts; a claim reads its task's row (one primary key
    # lookup, in the statement that reads the run's state), so every worker bounds a task's
    # attempts alike. A few rows: one per task that declares options.
    "task_options": """
    CREATE TABLE task_options (
        name       TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
        options    TEXT NOT NULL CHECK (json_valid(options)),
        updated_at REAL NOT NULL
    );
    """,
    # 11: flow control. ``limits`` holds each limit's numbers (what the app
    # declared, what an operator set); ``gates`` one bucket per limit and key (the rate and
    # token buckets, a pause, and ``ready_at``: when its line may next admit a run). A task
    # names its gates (``gate_a``..``gate_c``, at most three limits) and its token reservation;
    # its ``line`` is the gate it queues behind. A gated run leaves the claim index for its
    # line (``runs_line``), so a claim never walks runs that wait on a full gate. Concurrency
    # is counted from live leases (``tasks_gate_*``): a lease that ends or expires frees its
    # slot by itself, and a takeover never counts twice.
    "limits": f"""
    ALTER TABLE tasks ADD COLUMN gate_a TEXT;
    ALTER TABLE tasks ADD COLUMN gate_b TEXT;
    ALTER TABLE tasks ADD COLUMN gate_c TEXT;
    ALTER TABLE tasks ADD COLUMN line TEXT;
    ALTER TABLE tasks ADD COLUMN tokens INTEGER;
    ALTER TABLE runs ADD COLUMN line TEXT;
    ALTER TABLE runs ADD COLUMN line_at REAL;
    CREATE INDEX runs_line ON runs (line, queue, priority DESC, line_at, head_created, head_id)
        WHERE line_at IS NOT NULL;
    CREATE INDEX tasks_gate_a ON tasks (gate_a) WHERE gate_a IS NOT NULL
        AND lease_owner IS NOT NULL;
    CREATE INDEX tasks_gate_b ON tasks (gate_b) WHERE gate_b IS NOT NULL
        AND lease_owner IS NOT NULL;
    CREATE INDEX tasks_gate_c ON tasks (gate_c) WHERE gate_c IS NOT NULL
        AND lease_owner IS NOT NULL;

    CREATE TABLE limits (
        name        TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
        per         TEXT,
        rate        REAL,
        burst       REAL,
        concurrency INTEGER,
        tokens      REAL,
        token_burst REAL,
        declared    TEXT NOT NULL CHECK (json_valid(declared)),
        declared_by TEXT NOT NULL,
        declared_at REAL NOT NULL,
        overrides   TEXT CHECK (overrides IS NULL OR json_valid(overrides)),
        set_at      REAL
    );
    CREATE TABLE gates (
        gate         TEXT PRIMARY KEY,
        lim          TEXT NOT NULL,
        key          TEXT NOT NULL,
        level        REAL,
        level_at     REAL,
        tok_level    REAL,
        tok_at       REAL,
        paused_until REAL NOT NULL DEFAULT 0,
        ready_at     REAL,
        blocked_by   TEXT,
        starts       INTEGER NOT NULL DEFAULT 0,
        used_tokens  INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE INDEX gates_ready ON gates (ready_at) WHERE ready_at IS NOT NULL;
    CREATE INDEX gates_lim ON gates (lim, key);
    CREATE INDEX gates_blocked ON gates (blocked_by) WHERE blocked_by IS NOT NULL;

    DROP TRIGGER tasks_ready_insert;
    CREATE TRIGGER tasks_ready_insert AFTER INSERT ON tasks BEGIN
        {_PLACED.format(run="NEW.run_id")}
    END;
    DROP TRIGGER tasks_ready_update;
    CREATE TRIGGER tasks_ready_update
        AFTER UPDATE OF available_at, lease_owner, lease_expires_at, done_at ON tasks
        WHEN NOT ({_EXTENDED})
         AND (SELECT status FROM runs WHERE id = NEW.run_id) IN ('pending', 'running') BEGIN
        {_PLACED.format(run="NEW.run_id")}
    END;
    DROP TRIGGER tasks_lease_extended;
    CREATE TRIGGER tasks_lease_extended AFTER UPDATE OF lease_owner, lease_expires_at ON tasks
        WHEN {_EXTENDED} BEGIN
        UPDATE runs SET ready_at = max(coalesce(ready_at, NEW.lease_expires_at),
                                       NEW.lease_expires_at)
        WHERE id = NEW.run_id AND status IN ('pending', 'running') AND line IS NULL;
    END;
    DROP TRIGGER runs_ready_status;
    CREATE TRIGGER runs_ready_status AFTER UPDATE OF status ON runs
        WHEN (OLD.status IN ('pending', 'running')) != (NEW.status IN ('pending', 'running'))
         AND NOT (NEW.status NOT IN ('pending', 'running') AND NEW.head_at IS NULL
                  AND NEW.ready_at IS NULL AND NEW.line_at IS NULL) BEGIN
        {_PLACED.format(run="NEW.id")}
    END;
    """,
    # 12: paid calls, kept for the next attempt of their step (B13)
    "paid_calls": PAID_CALLS_SCHEMA,
    "waits": MIGRATION_WAITS,  # 13: runs that wait: their wait, the signals
    "schedules": _SCHEDULES,  # 14: schedules
    "gates_ready_order": GATES_READY_ORDER,  # 15: the open gates' order, indexed
    "events": EVENTS_SCHEMA,  # 16: the outbox: events, named consumers (B18)
    # 17: its starter's trace context (B19)
    "traceparent": "ALTER TABLE runs ADD COLUMN traceparent TEXT;",
    "webhooks": _WEBHOOKS,  # 18: webhooks (B20)
    "gates_idle": GATES_IDLE,  # 19: a line idle until its next due run; its round-robin place
    "parent_join": MIGRATION_PARENT_JOIN,  # 20: a child's parent's join, a column of its own
    # 21: an attempt is spent only by a handler that began (B3). ``tasks.started``
    # says whether the current lease's handler began, as far as the database knows: a claim
    # for a slot that starts it at once says so, a prefetched lease is recorded when the
    # renewal that confirms its start lands. A takeover of a lease that never began moves
    # attempt_base with attempts (like a hand-back) and keeps it in the history as
    # ``unstarted``. Leases from before this version count as begun.
    "started": """
    ALTER TABLE tasks ADD COLUMN started INTEGER NOT NULL DEFAULT 1 CHECK (started IN (0, 1));
    DROP TRIGGER tasks_takeover;
    CREATE TABLE task_attempts_v21 (
        id          INTEGER PRIMARY KEY,
        run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        task_id     INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        owner       TEXT    NOT NULL,
        claimed_at  REAL,
        ended_at    REAL,
        outcome     TEXT    NOT NULL CHECK (outcome IN ('released', 'failed', 'taken_over',
                                                        'unstarted', 'exhausted')),
        error       TEXT,
        taken_by    TEXT
    );
    INSERT INTO task_attempts_v21 SELECT id, run_id, task_id, attempt, owner, claimed_at,
        ended_at, outcome, error, taken_by FROM task_attempts;
    DROP TABLE task_attempts;
    ALTER TABLE task_attempts_v21 RENAME TO task_attempts;
    CREATE INDEX task_attempts_run ON task_attempts (run_id, task_id, attempt);
    CREATE TRIGGER tasks_takeover AFTER UPDATE OF attempts ON tasks
        WHEN OLD.lease_owner IS NOT NULL AND NEW.attempts > OLD.attempts BEGIN
        INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at, ended_at,
                                   outcome, taken_by)
        VALUES (NEW.run_id, NEW.id, OLD.attempts, OLD.lease_owner, OLD.claimed_at,
                OLD.lease_expires_at,
                CASE WHEN OLD.started THEN 'taken_over' ELSE 'unstarted' END, NEW.lease_owner);
    END;
    """,
    "webhook_positions": MIGRATION_POSITIONS,  # 22: positions on their rows, system runs apart
    "call_intents": MIGRATION_INTENTS,  # 23: paid calls' intents, usage kept for spend
    # 24: task ids are never given out twice either, as run ids (8): a prune that removed the
    # newest tasks would hand their ids out again, and a lease still held on a pruned task
    # (its holder paused, or its run cancelled under it) would match the fence (R2) of
    # somebody else's task, its owner's own next claim at the same attempt. run_ids.task_high
    # keeps the highest id a deleted task had (a trigger, whatever deletes it: a prune's
    # cascade); INSERT_TASK numbers a new task one past the higher of the two.
    "task_ids_never_reused": """
    ALTER TABLE run_ids ADD COLUMN task_high INTEGER NOT NULL DEFAULT 0;
    UPDATE run_ids SET task_high = (SELECT coalesce(max(id), 0) FROM tasks);
    CREATE TRIGGER tasks_keep_high_id AFTER DELETE ON tasks
        WHEN OLD.id > (SELECT task_high FROM run_ids) BEGIN
        UPDATE run_ids SET task_high = OLD.id;
    END;
    """,
    "streams": STREAMS_SCHEMA,  # 25: runs' streams: their heads and chunks (B21)
    # 26: the tasks each worker serves (B22), a JSON array kept on its row of the worker list:
    # a run whose next task no live worker serves reads as waiting for one ("no worker serves
    # task X") instead of as plainly pending. NULL: a worker from before, taken to serve any.
    "workers_tasks": """
    ALTER TABLE workers ADD COLUMN tasks TEXT;
    """,
    # 27: each step keeps what it was entered with (B24): the run's state and queue at the
    # moment the task was written (a start, an advance), so a fork can begin a new run at any
    # step. A copy of the run's state, checked as that was (no CHECK here: a second JSON parse
    # of up to 8 MiB on the per-task path). NULL: a step entered before this version.
    "step_inputs": """
    ALTER TABLE tasks ADD COLUMN input_state TEXT;
    ALTER TABLE tasks ADD COLUMN input_queue TEXT;
    """,
    # 28: the version of the task each task row's run state was written for (B25): a worker at a
    # newer version migrates the state before its handler begins, and one at an older version
    # never claims it. NULL: unversioned (a producer that did not say), served by any version;
    # the pending tasks from before were written by unversioned releases: version 1.
    "task_versions": """
    ALTER TABLE tasks ADD COLUMN version INTEGER CHECK (version BETWEEN 1 AND 1000000);
    UPDATE tasks SET version = 1 WHERE done_at IS NULL;
    """,
    "leases": MIGRATION_LEASES,  # 29: a run's lease is a row of ``leases`` (leases_sql.py)
    "task_lease_columns": MIGRATION_TASK_LEASE_COLUMNS,  # 30: tasks without them (rebuilt)
    "stream_batches": BATCHES_SCHEMA,  # 31: a stream's rows are its batches (B21)
    # 32 (leases_owner_unindexed): PostgreSQL's only
    "webhook_in_flight": MIGRATION_IN_FLIGHT,  # 33: a webhook's window, its own (B20)
}

MIGRATIONS: list[str] = steps("sqlite", _SQL)  # every step of the shared history, in order
SCHEMA_VERSION = len(MIGRATIONS)
