"""SQLite's statements for runs' streams (docs/protocol.md B21): the chunks a step's handler
emits (``ctx.emit``), written in batches under its lease, numbered per run by the run's stream
head, read in order by anyone.

Its queries are in ``queries/streams.sql``, each named and described there (loaded and checked
when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# v25: a run's stream: its head (the last offset given out, who wrote last, the bytes so far)
# and its chunks, one row each, deleted with their head, which goes with its run (a chunk's
# write locks only the head: never the run a commit locks)
STREAMS_SCHEMA = """
    CREATE TABLE stream_heads (
        run_id   INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
        last     INTEGER NOT NULL CHECK (last >= 0),
        task_id  INTEGER NOT NULL,
        attempt  INTEGER NOT NULL CHECK (attempt >= 1),
        bytes    INTEGER NOT NULL CHECK (bytes >= 0)
    );
    CREATE TABLE stream_chunks (
        run_id   INTEGER NOT NULL REFERENCES stream_heads(run_id) ON DELETE CASCADE,
        position INTEGER NOT NULL CHECK (position >= 1),
        task_id  INTEGER NOT NULL,
        attempt  INTEGER NOT NULL CHECK (attempt >= 1),
        kind     TEXT    NOT NULL CHECK (kind IN ('data', 'reset')),
        data     TEXT    CHECK (data IS NULL OR json_valid(data)),
        at       REAL    NOT NULL,
        PRIMARY KEY (run_id, position)
    ) WITHOUT ROWID;
"""

# v29: a run's stream kept as one row per batch, not per chunk (a chunk's row was the cost of
# a stream on the server): a batch's chunks ``first`` to ``last`` (offsets), the attempt that
# wrote them and when, as one JSON array of [kind, data]. The chunks from before move over one
# row each (a batch of one), in their order, and the chunks' table goes.
BATCHES_SCHEMA = """
    CREATE TABLE stream_batches (
        run_id   INTEGER NOT NULL REFERENCES stream_heads(run_id) ON DELETE CASCADE,
        first    INTEGER NOT NULL CHECK (first >= 1),
        last     INTEGER NOT NULL CHECK (last >= first),
        task_id  INTEGER NOT NULL,
        attempt  INTEGER NOT NULL CHECK (attempt >= 1),
        at       REAL    NOT NULL,
        chunks   TEXT    NOT NULL CHECK (json_valid(chunks)),
        PRIMARY KEY (run_id, first)
    ) WITHOUT ROWID;
    INSERT INTO stream_batches (run_id, first, last, task_id, attempt, at, chunks)
        SELECT run_id, position, position, task_id, attempt, at,
            json_array(json_array(kind, json(data)))
        FROM stream_chunks ORDER BY run_id, position;
    DROP TABLE stream_chunks;
"""

# the batch written alone: a part of the steps STREAM_MOVE and STREAM_MOVED (sqlite.steps)
QUERIES = load("workerproc.store.sqlite", "streams.sql", style="named", internal=("STREAM_APPEND",))
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
