"""PostgreSQL's statements for paid calls (docs/protocol.md B13): a step's expensive
call (``ctx.once``) kept the moment it returned, so the next attempt of the same step reuses it.

A call is kept by any attempt of its step while the run is alive and the step not done, even
one whose lease was lost (it was paid for: an observation, not a state change); the first
kept answer wins (a racing insert waits for the first and then does nothing) and a later one
is counted on the winner's row as paid, unused.
"""

from __future__ import annotations

from .fragments import CLOCK, CLOCK_CTE
from .sql import _LOCKED, ALIVE, NOTIFY
from .waits_sql import DUE_HEAD

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
        %(attempt)s, %(owner)s, %(tokens)s, {CLOCK}
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

# -- intents: a call is recorded before fn runs, so a later attempt knows a payment
# may have happened, and counts never miss a call killed in flight -----------------------------
# v17: each call made (``again``: an earlier intent of the same call came first: a payment
# again), answered when its answer reached the database (kept or not), settled by an operator
# (``resolve``); and what was used (``usage``): each paid call's tokens and cost, kept with its
# answer, and each execution's ``ctx.usage``, kept with its commit; this database's own random
# identity, which makes ``once_key`` differ between databases whose run ids are the same
MIGRATION_INTENTS = """
    CREATE TABLE call_intents (
        id           bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id       bigint  NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        task_id      bigint  NOT NULL,
        name         text    NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
        request_hash text    NOT NULL CHECK (length(request_hash) = 64),
        attempt      integer NOT NULL CHECK (attempt >= 1),
        owner        text    NOT NULL,
        again        boolean NOT NULL,
        at           double precision NOT NULL,
        answered_at  double precision,
        settled      text    CHECK (settled IN ('answer', 'pay_again'))
    );
    CREATE INDEX call_intents_key ON call_intents (run_id, task_id, name, request_hash, id);
    CREATE TABLE usage (
        id       bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id   bigint  NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        task_id  bigint  NOT NULL,
        task     text    NOT NULL,
        attempt  integer NOT NULL CHECK (attempt >= 1),
        name     text,
        tokens   bigint  CHECK (tokens IS NULL OR tokens >= 0),
        cost     double precision CHECK (cost IS NULL OR cost >= 0),
        at       double precision NOT NULL
    );
    CREATE INDEX usage_at ON usage (at);
    CREATE INDEX usage_run ON usage (run_id);
    CREATE TABLE store_identity (id text NOT NULL);
    INSERT INTO store_identity VALUES (md5(random()::text || clock_timestamp()::text));
"""

# the run's calls begin one at a time (the run row first, as the schema's lock order says): two
# attempts racing on one call (a paused worker wakes while its successor calls) must each see
# the other's intent, so the second is counted as a payment again. NO KEY UPDATE: inserts that
# only reference the run (a keep, an intent) do not wait for it
LOCK_CALL = "SELECT id FROM runs WHERE id = %(run_id)s FOR NO KEY UPDATE"
# the earlier intents of this call: how many, and how many are open (no answer, not settled)
EARLIER_INTENTS = f"""SELECT count(*),
        count(*) FILTER (WHERE answered_at IS NULL AND settled IS NULL)
    FROM call_intents WHERE {_KEY}"""
# the intent, only under this attempt's live lease on a live run: a paid call begins only on
# a lease the database holds at that moment; and how long that lease has left (the caller
# calls fn only within it)
INSERT_INTENT = f"""{CLOCK_CTE},
held AS MATERIALIZED (
    SELECT l.expires_at - clock.now AS left_s
    FROM clock, leases AS l JOIN runs AS r ON r.id = l.run_id
    WHERE l.task_id = %(task_id)s AND l.run_id = %(run_id)s AND l.owner = %(owner)s
      AND l.attempts = %(attempt)s AND l.expires_at > clock.now AND r.status IN {ALIVE}),
made AS (
    INSERT INTO call_intents (run_id, task_id, name, request_hash, attempt, owner, again, at)
    SELECT %(run_id)s, %(task_id)s, %(name)s, %(request_hash)s, %(attempt)s, %(owner)s,
        %(again)s, clock.now
    FROM clock, held RETURNING id)
SELECT made.id, held.left_s FROM made, held"""
# the intent's answer reached the database (once: a retried keep finds it answered)
ANSWER_INTENT = f"""UPDATE call_intents SET answered_at = {CLOCK}
    WHERE id = %(intent)s AND answered_at IS NULL RETURNING id"""
# the kept answer of a call, whoever kept it (a retried keep whose first try landed)
KEPT_ANSWER = f"SELECT result::text, attempt, tokens, owner FROM paid_calls WHERE {_KEY}"
INSERT_USAGE = f"""INSERT INTO usage (run_id, task_id, task, attempt, name, tokens, cost, at)
    VALUES (%(run_id)s, %(task_id)s, %(task)s, %(attempt)s, %(name)s, %(tokens)s, %(cost)s,
            {CLOCK})"""

# -- parked calls (unknown="park"): the step waits, holding nothing, until ``resolve`` --------
# the parking attempt gave its task back (RELEASE, not due before the deadline): the run waits
# for ``wait_for`` (``outcome_unknown:NAME``) on that task
MARK_PARKED = f"""{_LOCKED}
UPDATE runs AS r SET wait_for = %(wait_for)s, wait_until = clock.now + %(delay)s,
    wait_task = %(task_id)s FROM clock WHERE r.id = %(run_id)s RETURNING r.id"""
# the parked task is due now, the run waits no more, its head is that task, and idle workers
# are told (a resolve, or a late answer kept)
UNPARK = f"""{_LOCKED},
found AS MATERIALIZED (
    SELECT r.wait_task AS task_id, t.created_at, t.line FROM runs AS r
    JOIN tasks AS t ON t.id = r.wait_task AND t.done_at IS NULL
    WHERE r.id = %(run_id)s AND r.status IN {ALIVE} AND r.wait_for = %(wait_for)s
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.task_id = t.id)),
due AS (UPDATE tasks AS t SET available_at = clock.now FROM found AS f, clock
    WHERE t.id = f.task_id),
over AS (UPDATE runs AS r SET wait_for = NULL, wait_until = NULL, wait_task = NULL, {DUE_HEAD}
    FROM found AS f, clock WHERE r.id = %(run_id)s RETURNING r.id)
SELECT task_id, (SELECT {NOTIFY} FROM over) FROM found"""
# an operator's fresh start (``forget``): the name's calls without an answer stop nothing now
FORGET_INTENTS = """UPDATE call_intents SET settled = 'pay_again'
    WHERE run_id = %(run_id)s AND name = %(name)s AND answered_at IS NULL AND settled IS NULL"""
# the newest call of this name in the run (what ``resolve`` answers)
CALL_TO_RESOLVE = """SELECT task_id, request_hash, attempt FROM call_intents
    WHERE run_id = %(run_id)s AND name = %(name)s ORDER BY id DESC LIMIT 1"""
SETTLE_INTENTS = f"""UPDATE call_intents SET settled = %(settled)s
    WHERE {_KEY} AND answered_at IS NULL AND settled IS NULL"""
RESOLVE_CALL = f"""INSERT INTO paid_calls (run_id, task_id, name, request_hash, result, attempt,
        owner, tokens, at)
    VALUES (%(run_id)s, %(task_id)s, %(name)s, %(request_hash)s, %(result)s::json, %(attempt)s,
            %(owner)s, NULL, {CLOCK})
    ON CONFLICT DO NOTHING RETURNING 1"""

# -- what was paid: per call of a run (``show``), per intent (the timeline), in all -----------
# an intent in flight: its attempt still holds a live lease (otherwise, unanswered, unknown)
_IN_FLIGHT = f"""EXISTS (SELECT 1 FROM leases AS l WHERE l.task_id = i.task_id
    AND l.owner = i.owner AND l.attempts = i.attempt AND l.expires_at > {CLOCK})"""
_UNKNOWN = f"(i.answered_at IS NULL AND NOT {_IN_FLIGHT})"
RUN_INTENTS = f"""SELECT i.task_id, i.name, i.request_hash, i.attempt, i.owner, i.again, i.at,
        i.answered_at, i.settled, {_UNKNOWN}
    FROM call_intents AS i WHERE i.run_id = %(run_id)s ORDER BY i.id LIMIT %(limit)s"""
INTENT_TOTALS = f"""SELECT count(*), count(*) FILTER (WHERE i.again),
        count(*) FILTER (WHERE {_UNKNOWN})
    FROM call_intents AS i"""
RUN_INTENT_COUNTS = f"""SELECT i.task_id, i.name, i.request_hash, count(*),
        count(*) FILTER (WHERE i.again), count(*) FILTER (WHERE {_UNKNOWN}), min(i.at)
    FROM call_intents AS i WHERE i.run_id = %(run_id)s
    GROUP BY i.task_id, i.name, i.request_hash"""

# -- spend: tokens and cost kept, by task or by a payload field --------------------------------
_SPEND = """count(*), count(u.name), coalesce(sum(u.tokens), 0), sum(u.cost)
    FROM usage AS u {join} WHERE u.at >= %(since)s GROUP BY 1
    ORDER BY coalesce(sum(u.cost), 0) DESC, coalesce(sum(u.tokens), 0) DESC, 1
    LIMIT %(limit)s"""
SPEND_BY_TASK = "SELECT u.task, " + _SPEND.format(join="")
SPEND_BY_FIELD = "SELECT t.payload ->> %(field)s, " + _SPEND.format(
    join="JOIN tasks AS t ON t.id = u.task_id"
)

# this database's identity (``once_key``)
STORE_IDENTITY = "SELECT id FROM store_identity"
