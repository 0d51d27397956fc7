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

QUERIES = load("workerproc.store.sqlite", "streams.sql", style="named")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
