"""PostgreSQL's statements for paid calls (issue 27, docs/protocol.md B13): a step's expensive
call (``ctx.once``) kept the moment it returned, so the next attempt of the same step reuses it.

A call is kept by any attempt of its step while the run is alive and the step not done, even
one whose lease was lost (it was paid for: an observation, not a state change); the first
kept answer wins (a racing insert waits for the first and then does nothing) and a later one
is counted on the winner's row as paid, unused.
"""

from __future__ import annotations

from .sql import _CLOCK, ALIVE

# v6: the paid calls, one row per (run, step, name, request hash); deleted with their run
PAID_CALLS_SCHEMA = """
    CREATE TABLE paid_calls (
        run_id        bigint  NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        task_id       bigint  NOT NULL,
        name          text    NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
        request_hash  text    NOT NULL CHECK (length(request_hash) = 64),
        result        json    NOT NULL,
        attempt       integer NOT NULL CHECK (attempt >= 1),
        owner         text    NOT NULL,
        tokens        bigint  CHECK (tokens IS NULL OR tokens >= 0),
        at            double precision NOT NULL,
        reused        bigint  NOT NULL DEFAULT 0 CHECK (reused >= 0),
        unused        bigint  NOT NULL DEFAULT 0 CHECK (unused >= 0),
        unused_tokens bigint  NOT NULL DEFAULT 0 CHECK (unused_tokens >= 0),
        PRIMARY KEY (run_id, task_id, name, request_hash)
    );
"""

_KEY = """run_id = %(run_id)s AND task_id = %(task_id)s AND name = %(name)s
      AND request_hash = %(request_hash)s"""

# the stored answer of this step's call, if any
FIND_CALL = f"SELECT result::text, attempt, tokens FROM paid_calls WHERE {_KEY}"
# ... and that it was used again
COUNT_REUSE = f"UPDATE paid_calls SET reused = reused + 1 WHERE {_KEY}"
# keep a paid answer: only while the run is alive and its step not done; the first one wins
KEEP_CALL = f"""INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    SELECT %(run_id)s, %(task_id)s, %(name)s, %(request_hash)s, %(result)s::json,
        %(attempt)s, %(owner)s, %(tokens)s, {_CLOCK}
    WHERE EXISTS (SELECT 1 FROM runs AS r JOIN tasks AS t ON t.run_id = r.id
                  WHERE r.id = %(run_id)s AND t.id = %(task_id)s AND r.status IN {ALIVE}
                    AND t.done_at IS NULL)
    ON CONFLICT DO NOTHING RETURNING 1"""
# a later answer to a kept call: counted on the winner as paid, unused; the winner returned
CALL_LOSER = f"""UPDATE paid_calls SET unused = unused + 1,
        unused_tokens = unused_tokens + coalesce(%(tokens)s::bigint, 0)
    WHERE {_KEY}
    RETURNING result::text, attempt, tokens"""
# what ``show`` and the dashboard list, in the order they were paid
RUN_CALLS = """SELECT task_id, name, request_hash, attempt, owner, tokens, at, reused, unused,
        unused_tokens
    FROM paid_calls WHERE run_id = %(run_id)s ORDER BY at, task_id, name LIMIT %(limit)s"""
# drop a run's calls by name, for a fresh call
FORGET_CALL = "DELETE FROM paid_calls WHERE run_id = %(run_id)s AND name = %(name)s RETURNING 1"
# every kept call's numbers, for metrics and the chaos report
CALL_TOTALS = """SELECT count(*), coalesce(sum(reused), 0), coalesce(sum(unused), 0),
        coalesce(sum(tokens), 0), coalesce(sum(reused * coalesce(tokens, 0)), 0),
        coalesce(sum(unused_tokens), 0)
    FROM paid_calls"""
