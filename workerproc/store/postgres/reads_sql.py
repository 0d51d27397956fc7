"""The PostgreSQL backend's reads: runs, tasks, the evidence, counts, the idle workers' cheap
reads, the dashboard's pages and the engine's storage check (amcheck), each statement named with
its purpose.

Every list is a bounded index walk, so a page costs the same over a thousand runs or a million.
JSON goes out as text and is decoded by the store (``codec.loads``).

Its queries are in ``queries/reads.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

QUERIES = load(
    "workerproc.store.postgres",
    "reads.sql",
    style="pyformat",
    internal=("AMCHECK", "OUR_INDEXES", "OUR_TABLES"),
)
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
