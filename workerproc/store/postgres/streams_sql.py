"""PostgreSQL's statements for runs' streams (docs/protocol.md B21): the chunks a step's
handler emits (``ctx.emit``), written in batches under its lease, numbered per run by the
run's stream head (locked by each write), read in order by anyone; each write sends a NOTIFY
on the schema's stream channel (``STREAM_CHANNEL``), which wakes the followers.

Its queries are in ``queries/streams.sql``, each named and described there (loaded and checked
when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

STREAM_CHANNEL = "leasekeeper.{schema}.stream"  # a stream was written

# v18: a run's stream: its head (the last offset given out, who wrote last, the bytes so far)
# and its chunks, one row each, deleted with their head, which goes with its run (a chunk's
# write locks only the head: never the run a commit locks)
STREAMS_SCHEMA = """
    CREATE TABLE stream_heads (
        run_id   bigint  PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
        last     bigint  NOT NULL CHECK (last >= 0),
        task_id  bigint  NOT NULL,
        attempt  integer NOT NULL CHECK (attempt >= 1),
        bytes    bigint  NOT NULL CHECK (bytes >= 0)
    );
    CREATE TABLE stream_chunks (
        run_id   bigint  NOT NULL REFERENCES stream_heads (run_id) ON DELETE CASCADE,
        position bigint  NOT NULL CHECK (position >= 1),
        task_id  bigint  NOT NULL,
        attempt  integer NOT NULL CHECK (attempt >= 1),
        kind     text    NOT NULL CHECK (kind IN ('data', 'reset')),
        data     json,
        at       double precision NOT NULL,
        PRIMARY KEY (run_id, position)
    );
"""

# v29: a run's stream kept as one row per batch, not per chunk (a chunk's row was the cost of
# a stream on the server): a batch's chunks ``first`` to ``last`` (offsets), the attempt that
# wrote them and when, as one JSON array of [kind, data]. The chunks from before move over one
# row each (a batch of one), in their order, and the chunks' table goes.
BATCHES_SCHEMA = """
    CREATE TABLE stream_batches (
        run_id   bigint  NOT NULL REFERENCES stream_heads (run_id) ON DELETE CASCADE,
        first    bigint  NOT NULL CHECK (first >= 1),
        last     bigint  NOT NULL CHECK (last >= first),
        task_id  bigint  NOT NULL,
        attempt  integer NOT NULL CHECK (attempt >= 1),
        at       double precision NOT NULL,
        chunks   json    NOT NULL,
        PRIMARY KEY (run_id, first)
    );
    INSERT INTO stream_batches (run_id, first, last, task_id, attempt, at, chunks)
        SELECT run_id, position, position, task_id, attempt, at,
            json_build_array(json_build_array(kind, data))
        FROM stream_chunks;
    DROP TABLE stream_chunks;
"""

QUERIES = load("workerproc.store.postgres", "streams.sql", style="pyformat")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
