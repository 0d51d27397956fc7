"""The SQLite backend's reads (``queries/reads.sql``): runs, tasks, the evidence, counts, the
idle workers' cheap reads and the dashboard's pages, each query named and described there."""

from __future__ import annotations

from ..queries import load, texts

QUERIES = load("workerproc.store.sqlite", "reads.sql", style="named")
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
