"""SQLite's ``leases`` (schema step 29): a run's live lease is a row of its own, keyed by the
run, as PostgreSQL's (``postgres/schema.py``, step 9): the same columns, the same meaning
(docs/explanation/schema.md, "Where a lease lives").

- One row per run while a lease is on it (live, or expired and not yet taken over): the
  primary key is the run, so not even a bug can put two leases in one run. A row goes when its
  task is done (a trigger: every write that marks a task done ends its lease), when its holder
  gives it back (release, hand-back, failure), and with its run (``ON DELETE CASCADE``).
- ``attempts`` is the fencing token (R2): every fenced write matches the run's row by task
  id, owner, attempt and a live expiry. The task keeps its counts too (``attempts``,
  ``attempt_base``, ``claimed_at``: written by the triggers as the lease is granted or taken
  over), so what reads a task reads them as before.
- A renewal rewrites this small row only, never the task row (payload, input state).
- ``ready_at`` (the earliest moment a claim may pick the run) is the later of ``head_at`` and
  the lease's expiry: one lease per run, so the triggers write it from the row they see, with
  no ``max()`` over the run's tasks.
- A takeover replaces the row in place (``ON CONFLICT``), keeping the replaced lease in the
  ``prev_*`` columns; its trigger writes the history row (``taken_over``, or ``unstarted``:
  B3).
"""

from __future__ import annotations

# the run's head (its first pending task in R1 order) and when it may next be claimed: the
# later of the head's time and the expiry of the lease on a pending task of the run
PLACED = """
    UPDATE runs SET (head_at, line_at, head_created, head_id, ready_at, line) = (
        SELECT CASE WHEN h.line IS NULL THEN h.available_at END,
               CASE WHEN h.line IS NOT NULL THEN h.available_at END, h.created_at, h.id,
               CASE WHEN h.line IS NULL
                    THEN max(h.available_at, coalesce(
                        (SELECT l.expires_at FROM leases AS l JOIN tasks AS lt
                            ON lt.id = l.task_id AND lt.done_at IS NULL
                         WHERE l.run_id = runs.id), h.available_at)) END,
               h.line
        FROM (SELECT available_at, created_at, id, line FROM tasks
              WHERE run_id = runs.id AND done_at IS NULL
              ORDER BY available_at, created_at, id LIMIT 1) AS h
        WHERE runs.status IN ('pending', 'running'))
    WHERE id = {run};
"""

# the task's counts, as its lease counts them (a claim, a takeover)
_COUNTS = """
    UPDATE tasks SET attempts = NEW.attempts, attempt_base = NEW.attempt_base,
        claimed_at = NEW.claimed_at WHERE id = NEW.task_id;
"""
# a lease's expiry moved (granted, renewed, taken over, expired by release_owner): the run is
# claimable again no sooner than it (a run in a line or over has no head_at: nothing to do)
_READY = """
    UPDATE runs SET ready_at = max(head_at, NEW.expires_at)
    WHERE id = NEW.run_id AND head_at IS NOT NULL;
"""

# the triggers that name tasks: the head and ready time kept, a done task's lease gone, a lease's
# counts on its task, its takeover's history (step 30 makes them again after its rebuild)
_TRIGGERS = f"""
    CREATE TRIGGER tasks_ready_insert AFTER INSERT ON tasks BEGIN
        {PLACED.format(run="NEW.run_id")}
    END;
    CREATE TRIGGER tasks_ready_update AFTER UPDATE OF available_at, done_at ON tasks
        WHEN (SELECT status FROM runs WHERE id = NEW.run_id) IN ('pending', 'running') BEGIN
        {PLACED.format(run="NEW.run_id")}
    END;
    -- a task done (a commit, a drop): its lease ends with it
    CREATE TRIGGER tasks_done_lease AFTER UPDATE OF done_at ON tasks
        WHEN NEW.done_at IS NOT NULL BEGIN
        DELETE FROM leases WHERE run_id = NEW.run_id AND task_id = NEW.id;
    END;
    CREATE TRIGGER runs_ready_status AFTER UPDATE OF status ON runs
        WHEN (OLD.status IN ('pending', 'running')) != (NEW.status IN ('pending', 'running'))
         AND NOT (NEW.status NOT IN ('pending', 'running') AND NEW.head_at IS NULL
                  AND NEW.ready_at IS NULL AND NEW.line_at IS NULL) BEGIN
        {PLACED.format(run="NEW.id")}
    END;

    CREATE TRIGGER leases_granted AFTER INSERT ON leases BEGIN
        {_COUNTS}
        {_READY}
    END;
    -- a takeover in place: the replaced attempt goes into the history; a replaced lease on
    -- another task of the run that never began leaves that task's attempt unspent (B3)
    CREATE TRIGGER leases_taken AFTER UPDATE OF attempts ON leases BEGIN
        {_COUNTS}
        UPDATE tasks SET attempt_base = attempt_base + 1
            WHERE id = OLD.task_id AND OLD.task_id <> NEW.task_id AND NOT OLD.started;
        INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at, ended_at,
                                   outcome, taken_by)
        VALUES (NEW.run_id, OLD.task_id, OLD.attempts, OLD.owner, OLD.claimed_at,
                OLD.expires_at, CASE WHEN OLD.started THEN 'taken_over' ELSE 'unstarted' END,
                NEW.owner);
    END;
"""

# 29: leases move to their own table (the task's lease columns stay, unused, until step 30)
MIGRATION_LEASES = f"""
    -- (the old triggers and indexes first: the leases' move writes no run)
    DROP TRIGGER tasks_ready_insert;
    DROP TRIGGER tasks_ready_update;
    DROP TRIGGER tasks_lease_extended;
    DROP TRIGGER tasks_takeover;
    DROP TRIGGER runs_ready_status;
    DROP INDEX tasks_leased;
    DROP INDEX tasks_gate_a;
    DROP INDEX tasks_gate_b;
    DROP INDEX tasks_gate_c;

    CREATE TABLE leases (
        run_id          INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
        task_id         INTEGER NOT NULL,
        owner           TEXT,
        attempts        INTEGER NOT NULL CHECK (attempts >= 1),
        attempt_base    INTEGER NOT NULL CHECK (attempt_base BETWEEN 0 AND attempts),
        expires_at      REAL    NOT NULL,
        claimed_at      REAL    NOT NULL,
        started         INTEGER NOT NULL DEFAULT 1 CHECK (started IN (0, 1)),
        gate_a          TEXT,
        gate_b          TEXT,
        gate_c          TEXT,
        reserved        INTEGER,
        -- the lease this one took over in place
        prev_task       INTEGER,
        prev_owner      TEXT,
        prev_attempts   INTEGER,
        prev_base       INTEGER,
        prev_claimed_at REAL,
        prev_expires_at REAL,
        prev_started    INTEGER,
        prev_reserved   INTEGER
    ) WITHOUT ROWID;
    -- release_owner, the lease list; concurrency counted per gate from live leases
    CREATE INDEX leases_owner ON leases (owner) WHERE owner IS NOT NULL;
    CREATE INDEX leases_gate_a ON leases (gate_a) WHERE gate_a IS NOT NULL;
    CREATE INDEX leases_gate_b ON leases (gate_b) WHERE gate_b IS NOT NULL;
    CREATE INDEX leases_gate_c ON leases (gate_c) WHERE gate_c IS NOT NULL;

    -- the live (or expired, not yet taken over) leases move: one per run, the latest to end
    -- (a run held two only when a task was written ahead of an expired lease by hand)
    INSERT INTO leases (run_id, task_id, owner, attempts, attempt_base, expires_at, claimed_at,
                        started, gate_a, gate_b, gate_c, reserved)
        SELECT run_id, id, lease_owner, attempts, attempt_base, lease_expires_at,
            coalesce(claimed_at, lease_expires_at), started, gate_a, gate_b, gate_c, tokens
        FROM (SELECT t.*, row_number() OVER (PARTITION BY run_id
                  ORDER BY lease_expires_at DESC, id DESC) AS n
              FROM tasks AS t WHERE lease_owner IS NOT NULL AND done_at IS NULL
                AND attempts >= 1)
        WHERE n = 1;
    UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner IS NOT NULL;

{_TRIGGERS}
    CREATE TRIGGER leases_moved AFTER UPDATE OF expires_at ON leases BEGIN
        {_READY}
    END;
    CREATE TRIGGER leases_gone AFTER DELETE ON leases BEGIN
        UPDATE runs SET ready_at = head_at
        WHERE id = OLD.run_id AND head_at IS NOT NULL AND ready_at IS NOT head_at;
    END;
"""

_TASK_COLUMNS = """id, run_id, name, payload, available_at, created_at, attempts, attempt_base,
    last_error, done_at, claimed_at, done_attempt, done_owner, gate_a, gate_b, gate_c, line,
    tokens, signal_id, input_state, input_queue, version"""

# 30: the task's lease columns go (unused since 29). Two table CHECKs name them, so DROP COLUMN
# cannot: ``tasks`` is rebuilt (one pass over it, its indexes built again). The triggers of
# other tables that name ``tasks`` go first (a rename checks every trigger of the schema) and
# come back with the task's own; no table references ``tasks``, so dropping it cascades nowhere.
MIGRATION_TASK_LEASE_COLUMNS = f"""
    DROP TRIGGER runs_ready_status;
    DROP TRIGGER leases_granted;
    DROP TRIGGER leases_taken;
    CREATE TABLE tasks_v30 (
        id               INTEGER PRIMARY KEY,
        run_id           INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        name             TEXT    NOT NULL CHECK (length(name) > 0),
        payload          TEXT    NOT NULL DEFAULT 'null' CHECK (json_valid(payload)),
        available_at     REAL    NOT NULL,
        created_at       REAL    NOT NULL,
        attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        attempt_base     INTEGER NOT NULL DEFAULT 0 CHECK (attempt_base BETWEEN 0 AND attempts),
        last_error       TEXT,
        done_at          REAL,
        claimed_at       REAL,
        done_attempt     INTEGER,
        done_owner       TEXT,
        gate_a           TEXT,
        gate_b           TEXT,
        gate_c           TEXT,
        line             TEXT,
        tokens           INTEGER,
        signal_id        INTEGER,
        input_state      TEXT,
        input_queue      TEXT,
        version          INTEGER CHECK (version BETWEEN 1 AND 1000000)
    );
    INSERT INTO tasks_v30 ({_TASK_COLUMNS}) SELECT {_TASK_COLUMNS} FROM tasks;
    DROP TABLE tasks;
    ALTER TABLE tasks_v30 RENAME TO tasks;
    CREATE INDEX tasks_pending ON tasks (run_id, available_at, created_at, id)
        WHERE done_at IS NULL;
    CREATE INDEX tasks_run ON tasks (run_id, id);
    CREATE TRIGGER tasks_keep_high_id AFTER DELETE ON tasks
        WHEN OLD.id > (SELECT task_high FROM run_ids) BEGIN
        UPDATE run_ids SET task_high = OLD.id;
    END;
    {_TRIGGERS}
"""
