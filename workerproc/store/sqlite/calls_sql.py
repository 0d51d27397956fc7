"""SQLite's statements for paid calls (docs/protocol.md B13): a step's expensive call
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

# -- intents: a call is recorded before fn runs, so a later attempt knows a payment
# may have happened, and counts never miss a call killed in flight -----------------------------
# v23: each call made (``again``: an earlier intent of the same call came first: a payment
# again), answered when its answer reached the database (kept or not), settled by an operator
# (``resolve``); and what was used (``usage``): each paid call's tokens and cost, kept with its
# answer, and each execution's ``ctx.usage``, kept with its commit; this database's own random
# identity, which makes ``once_key`` differ between databases whose run ids are the same
MIGRATION_INTENTS = """
    CREATE TABLE call_intents (
        id           INTEGER PRIMARY KEY,
        run_id       INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        task_id      INTEGER NOT NULL,
        name         TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
        request_hash TEXT    NOT NULL CHECK (length(request_hash) = 64),
        attempt      INTEGER NOT NULL CHECK (attempt >= 1),
        owner        TEXT    NOT NULL,
        again        INTEGER NOT NULL CHECK (again IN (0, 1)),
        at           REAL    NOT NULL,
        answered_at  REAL,
        settled      TEXT    CHECK (settled IN ('answer', 'pay_again'))
    );
    CREATE INDEX call_intents_key ON call_intents (run_id, task_id, name, request_hash, id);
    CREATE TABLE usage (
        id       INTEGER PRIMARY KEY,
        run_id   INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        task_id  INTEGER NOT NULL,
        task     TEXT    NOT NULL,
        attempt  INTEGER NOT NULL CHECK (attempt >= 1),
        name     TEXT,
        tokens   INTEGER CHECK (tokens IS NULL OR tokens >= 0),
        cost     REAL    CHECK (cost IS NULL OR cost >= 0),
        at       REAL    NOT NULL
    );
    CREATE INDEX usage_at ON usage (at);
    CREATE INDEX usage_run ON usage (run_id);
    CREATE TABLE store_identity (id TEXT NOT NULL);
    INSERT INTO store_identity VALUES (lower(hex(randomblob(16))));
"""

# the step's calls begin one at a time: SQLite's write transaction holds the database's write
# lock already, so this only reads the run (PostgreSQL locks it)
LOCK_CALL = "SELECT id FROM runs WHERE id = :run_id"
_CALL = """run_id = :run_id AND task_id = :task_id AND name = :name
      AND request_hash = :request_hash"""
# the earlier intents of this call: how many, and how many are open (no answer, not settled)
EARLIER_INTENTS = f"""SELECT count(*), coalesce(sum(answered_at IS NULL AND settled IS NULL), 0)
    FROM call_intents WHERE {_CALL}"""
# the intent, only under this attempt's live lease on a live run: a paid call begins only on
# a lease the database holds at that moment; and how long that lease has left (the caller
# calls fn only within it)
INSERT_INTENT = f"""INSERT INTO call_intents (run_id, task_id, name, request_hash, attempt, owner,
        again, at)
    SELECT :run_id, :task_id, :name, :request_hash, :attempt, :owner, :again, :now
    WHERE EXISTS (SELECT 1 FROM tasks AS t JOIN runs AS r ON r.id = t.run_id
                  WHERE t.id = :task_id AND t.lease_owner = :owner AND t.attempts = :attempt
                    AND t.lease_expires_at > :now AND t.done_at IS NULL
                    AND r.status IN {ALIVE})
    RETURNING id, (SELECT lease_expires_at FROM tasks WHERE id = :task_id) - :now"""
# the intent's answer reached the database (once: a retried keep finds it answered)
ANSWER_INTENT = """UPDATE call_intents SET answered_at = :now
    WHERE id = :intent AND answered_at IS NULL RETURNING id"""
# the kept answer of a call, whoever kept it (a retried keep whose first try landed)
KEPT_ANSWER = f"SELECT result, attempt, tokens, owner FROM paid_calls WHERE {_CALL}"
INSERT_USAGE = """INSERT INTO usage (run_id, task_id, task, attempt, name, tokens, cost, at)
    VALUES (:run_id, :task_id, :task, :attempt, :name, :tokens, :cost, :now)"""

# -- parked calls (unknown="park"): the step waits, holding nothing, until ``resolve`` --------
# the parking attempt gave its task back (RELEASE, not due before the deadline): the run waits
# for ``:wait_for`` (``outcome_unknown:NAME``) on that task
MARK_PARKED = """UPDATE runs SET wait_for = :wait_for, wait_until = :now + :delay,
    wait_task = :task_id WHERE id = :run_id"""
# the parked task is due now, and the run waits no more (a resolve, or a late answer kept)
UNPARK_TASK = f"""UPDATE tasks SET available_at = :now WHERE id = (
        SELECT wait_task FROM runs WHERE id = :run_id AND wait_for = :wait_for
          AND status IN {ALIVE})
      AND done_at IS NULL AND lease_owner IS NULL
    RETURNING id"""
UNPARKED = "UPDATE runs SET wait_for = NULL, wait_until = NULL, wait_task = NULL WHERE id = :run_id"
# an operator's fresh start (``forget``): the name's calls without an answer stop nothing now
FORGET_INTENTS = """UPDATE call_intents SET settled = 'pay_again'
    WHERE run_id = :run_id AND name = :name AND answered_at IS NULL AND settled IS NULL"""
# the newest open or unanswered call of this name in the run (what ``resolve`` answers)
CALL_TO_RESOLVE = """SELECT task_id, request_hash, attempt FROM call_intents
    WHERE run_id = :run_id AND name = :name ORDER BY id DESC LIMIT 1"""
SETTLE_INTENTS = f"""UPDATE call_intents SET settled = :settled
    WHERE {_CALL} AND answered_at IS NULL AND settled IS NULL"""
RESOLVE_CALL = """INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    VALUES (:run_id, :task_id, :name, :request_hash, :result, :attempt, :owner, NULL, :now)
    ON CONFLICT DO NOTHING RETURNING 1"""

# -- what was paid: per call of a run (``show``), per intent (the timeline), in all -----------
# an intent in flight: its attempt still holds a live lease (otherwise, unanswered, unknown)
_IN_FLIGHT = """EXISTS (SELECT 1 FROM tasks AS t WHERE t.id = i.task_id
    AND t.lease_owner = i.owner AND t.attempts = i.attempt AND t.lease_expires_at > :now)"""
_UNKNOWN = f"(i.answered_at IS NULL AND NOT {_IN_FLIGHT})"
RUN_INTENTS = f"""SELECT i.task_id, i.name, i.request_hash, i.attempt, i.owner, i.again, i.at,
        i.answered_at, i.settled, {_UNKNOWN}
    FROM call_intents AS i WHERE i.run_id = :run_id ORDER BY i.id LIMIT :limit"""
INTENT_TOTALS = f"""SELECT count(*), coalesce(sum(i.again), 0), coalesce(sum({_UNKNOWN}), 0)
    FROM call_intents AS i"""
RUN_INTENT_COUNTS = f"""SELECT i.task_id, i.name, i.request_hash, count(*),
        coalesce(sum(i.again), 0), coalesce(sum({_UNKNOWN}), 0), min(i.at)
    FROM call_intents AS i WHERE i.run_id = :run_id
    GROUP BY i.task_id, i.name, i.request_hash"""

# -- spend: tokens and cost kept, by task or by a payload field --------------------------------
_SPEND = """count(*), coalesce(sum(u.name IS NOT NULL), 0), coalesce(sum(u.tokens), 0),
        sum(u.cost)
    FROM usage AS u {join} WHERE u.at >= :since GROUP BY 1
    ORDER BY coalesce(sum(u.cost), 0) DESC, coalesce(sum(u.tokens), 0) DESC, 1 LIMIT :limit"""
SPEND_BY_TASK = "SELECT u.task, " + _SPEND.format(join="")
SPEND_BY_FIELD = "SELECT json_extract(t.payload, :path), " + _SPEND.format(
    join="JOIN tasks AS t ON t.id = u.task_id"
)

# this database's identity (``once_key``)
STORE_IDENTITY = "SELECT id FROM store_identity"
