"""SQLite's statements for paid calls (issue 27, docs/protocol.md B13): a step's expensive call
(``ctx.once``) kept the moment it returned, so the next attempt of the same step reuses it.

A call is kept by any attempt of its step while the run is alive and the step not done, even
one whose lease was lost (it was paid for: an observation, not a state change); the first
kept answer wins and a later one is counted on the winner's row as paid, unused.
"""

from __future__ import annotations

# a run that may still change (as ``sql.ALIVE``, which imports the schema that imports this)
ALIVE = "('pending', 'running')"

# v12: the paid calls, one row per (run, step, name, request hash); deleted with their run
PAID_CALLS_SCHEMA = """
    CREATE TABLE paid_calls (
        run_id        INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        task_id       INTEGER NOT NULL,
        name          TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
        request_hash  TEXT    NOT NULL CHECK (length(request_hash) = 64),
        result        TEXT    NOT NULL CHECK (json_valid(result)),
        attempt       INTEGER NOT NULL CHECK (attempt >= 1),
        owner         TEXT    NOT NULL,
        tokens        INTEGER CHECK (tokens IS NULL OR tokens >= 0),
        at            REAL    NOT NULL,
        reused        INTEGER NOT NULL DEFAULT 0 CHECK (reused >= 0),
        unused        INTEGER NOT NULL DEFAULT 0 CHECK (unused >= 0),
        unused_tokens INTEGER NOT NULL DEFAULT 0 CHECK (unused_tokens >= 0),
        PRIMARY KEY (run_id, task_id, name, request_hash)
    ) WITHOUT ROWID;
"""

# the stored answer of this step's call, if any
FIND_CALL = """SELECT result, attempt, tokens FROM paid_calls
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash"""
# ... and that it was used again
COUNT_REUSE = """UPDATE paid_calls SET reused = reused + 1
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash"""
# keep a paid answer: only while the run is alive and its step not done; the first one wins
KEEP_CALL = f"""INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    SELECT :run_id, :task_id, :name, :request_hash, :result, :attempt, :owner, :tokens, :now
    WHERE EXISTS (SELECT 1 FROM runs AS r JOIN tasks AS t ON t.run_id = r.id
                  WHERE r.id = :run_id AND t.id = :task_id AND r.status IN {ALIVE}
                    AND t.done_at IS NULL)
    ON CONFLICT DO NOTHING RETURNING 1"""
# a later answer to a kept call: counted on the winner as paid, unused; the winner returned
CALL_LOSER = """UPDATE paid_calls SET unused = unused + 1,
        unused_tokens = unused_tokens + coalesce(:tokens, 0)
    WHERE run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash
    RETURNING result, attempt, tokens"""
# what ``show`` and the dashboard list, in the order they were paid
RUN_CALLS = """SELECT task_id, name, request_hash, attempt, owner, tokens, at, reused, unused,
        unused_tokens
    FROM paid_calls WHERE run_id = :run_id ORDER BY at, task_id, name LIMIT :limit"""
# drop a run's calls by name, for a fresh call
FORGET_CALL = "DELETE FROM paid_calls WHERE run_id = :run_id AND name = :name RETURNING 1"
# every kept call's numbers, for metrics and the chaos report
CALL_TOTALS = """SELECT count(*), coalesce(sum(reused), 0), coalesce(sum(unused), 0),
        coalesce(sum(tokens), 0), coalesce(sum(reused * coalesce(tokens, 0)), 0),
        coalesce(sum(unused_tokens), 0)
    FROM paid_calls"""
