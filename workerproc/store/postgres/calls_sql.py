"""PostgreSQL's statements for paid calls (docs/protocol.md B13): a step's expensive
call (``ctx.once``) kept the moment it returned, so the next attempt of the same step reuses it.

A call is kept by any attempt of its step while the run is alive and the step not done, even
one whose lease was lost (it was paid for: an observation, not a state change); the first
kept answer wins (a racing insert waits for the first and then does nothing) and a later one
is counted on the winner's row as paid, unused.

Its queries are in ``queries/calls.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

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

# intents: a call is recorded before fn runs, so a later attempt knows a payment may have
# happened, and counts never miss a call killed in flight
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

QUERIES = load("workerproc.store.postgres", "calls.sql", style="pyformat")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
